#!/usr/bin/env bash
# The console's pages under a big history: server time per page (the
# Server-Timing header qbridge adds to every /ui response), p50 and max of
# RUNS loads each, with HISTORY completed jobs in qbridge.jobs_done, DEAD
# dead letters, READY waiting jobs and a route with MIRRORED mirror copies
# and their outcomes (the diff and the gates read those).
#
#   bench/console/run.sh                     # 1,000,000 history, 100,000 dead
#   HISTORY=100000 DEAD=10000 bench/console/run.sh
#
# Needs psql and curl, Postgres at PGURL's server and Redis at REDIS_URL; it
# works in a database of its own (qbridge_console_bench, dropped first) and
# Redis keys of its own. BIN: the qbridge binary (default target/release).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/qbridge}
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
HISTORY=${HISTORY:-1000000}
DEAD=${DEAD:-100000}
READY=${READY:-200000}
MIRRORED=${MIRRORED:-100000}
RUNS=${RUNS:-20}
DB=qbridge_console_bench
URL="$PGURL/$DB"
TOKEN=bench-console-token-5c1e
work=$(mktemp -d)
trap 'status=$?; kill "${pid:-}" 2>/dev/null || true; [ "$status" = 0 ] || { echo "bench/console/run.sh failed; qbridge run said:" >&2; tail -5 "$work/run.log" >&2 2>/dev/null; }; rm -rf "$work"' EXIT

psql -q "$PGURL/postgres" -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB"
"$BIN" migrate --database-url "$URL" >/dev/null
echo "seeding: $HISTORY completed, $DEAD dead, $READY ready, $MIRRORED mirror copies with outcomes" >&2
psql -q "$URL" <<SQL
INSERT INTO qbridge.jobs_done (id, queue, kind, key, attempts, created_at, finished_at)
SELECT g, 'q' || (g % 5), 'k', 'done-' || g, 1, now() - interval '25 hours',
       now() - ($HISTORY - g) * (86400.0 / $HISTORY) * interval '1 second'  -- appended in finished_at order, as completions are
  FROM generate_series(1, $HISTORY) g;
INSERT INTO qbridge.jobs_dead (id, queue, kind, key, payload, priority, attempts, max_attempts, last_error, created_at, failed_at)
SELECT 10000000 + g, 'q' || (g % 5), 'k', 'dead-' || g, jsonb_build_object('n', g), 0, 25, 25,
       CASE WHEN g % 10 = 0 THEN 'boom: timeout' ELSE 'http handler answered 500' END,
       now() - interval '1 day', now() - (g % 86400) * interval '1 second'
  FROM generate_series(1, $DEAD) g;
INSERT INTO qbridge.jobs (queue, kind, key, payload)
SELECT 'q' || (g % 5), 'k', 'ready-' || g, jsonb_build_object('n', g) FROM generate_series(1, $READY) g;
INSERT INTO qbridge.job_keys (queue, key, copy, via, seen_at)
SELECT 'orders', 'order-' || g, 'mirror', 'proxy', now() - (g % 3600) * interval '1 second'
  FROM generate_series(1, $MIRRORED) g;
INSERT INTO qbridge.outcomes (queue, key, side, mode, outcome, digest, recorded_at)
SELECT 'orders', 'order-' || g, s.side, CASE s.side WHEN 'redis' THEN 'live' ELSE 'shadow' END, 'ok', md5(g::text),
       now() - (g % 3600) * interval '1 second'
  FROM generate_series(1, $MIRRORED) g CROSS JOIN (VALUES ('redis'), ('postgres')) s(side);
SQL
# The shared server here runs with autovacuum off: vacuum once, as
# autovacuum would have (it also summarizes the history's BRIN index).
psql -q "$URL" -c "VACUUM ANALYZE"

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$work/bench.toml" <<TOML
[http]
listen = "127.0.0.1:$port"
[[routes]]
name = "orders"
redis_key = "qbench:console:orders"
queue = "orders"
format = "json:/id"
phase = "shadow"
redis_side = "fleet"
handler = { type = "noop" }
pool = { concurrency = 1, poll_interval = "1h" }
TOML
QBRIDGE_ADMIN_TOKEN=$TOKEN "$BIN" run --config "$work/bench.toml" --database-url "$URL" --redis-url "$REDIS_URL" \
  >"$work/run.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$port/livez" >/dev/null && break; sleep 0.1; done

base="http://127.0.0.1:$port"
jar="$work/cookies"
guard=$(curl -fs -c "$jar" "$base/ui/login" | sed -n 's/.*name="csrf" value="\([0-9a-f]*\)".*/\1/p')
curl -fs -b "$jar" -c "$jar" -o /dev/null -d "csrf=$guard" --data-urlencode "token=$TOKEN" "$base/ui/login"

# Server time of one load of $1, in ms.
server_ms() {
  curl -fs -b "$jar" -o /dev/null -D - "$base$1" | tr -d '\r' | sed -n 's/^server-timing: app;dur=\([0-9.]*\)$/\1/ip'
}

printf '%-34s %10s %10s\n' page "p50 (ms)" "max (ms)"
for path in /ui /ui/routes/orders /ui/queues "/ui/jobs?q=dead-4242" "/ui/jobs?q=order-777" /ui/dead "/ui/dead?queue=q3&error=timeout"; do
  server_ms "$path" >/dev/null # warm
  times=$(for _ in $(seq "$RUNS"); do server_ms "$path"; done | sort -n)
  p50=$(echo "$times" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
  max=$(echo "$times" | tail -1)
  printf '%-34s %10s %10s\n' "$path" "$p50" "$max"
done
