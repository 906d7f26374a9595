# Build qbridge and ship it in a slim image (used by docker-compose.yml).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked && strip target/release/qbridge

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/qbridge /usr/local/bin/qbridge
COPY examples /opt/qbridge/examples
WORKDIR /opt/qbridge
ENTRYPOINT ["qbridge"]
