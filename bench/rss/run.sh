#!/usr/bin/env bash
# Resident memory of a real `qbridge run` process while it drains a backlog:
# enqueues N no-op jobs with `qbridge enqueue --file`, starts `qbridge run` with
# one noop pool (batch 500, concurrency 1000), samples VmRSS every 20 ms until
# the queue is empty, prints the peak. Env: DB (qbridge_rss), N (200000).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
DB=${DB:-qbridge_rss}; N=${N:-200000}
export QBRIDGE_DATABASE_URL="postgres://$PGUSER${PGPASSWORD:+:$PGPASSWORD}@$PGHOST:$PGPORT/$DB"
cargo build --release -q
bin=target/release/qbridge
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
$bin migrate >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
seq 1 "$N" | sed 's/.*/{"i":&}/' >"$tmp/jobs.jsonl"
$bin enqueue --queue rss --file "$tmp/jobs.jsonl" >/dev/null
cat >"$tmp/rss.toml" <<TOML
[http]
listen = "127.0.0.1:0"
[[pools]]
queues = ["rss"]
concurrency = 1000
batch_size = 500
handler = { type = "noop" }
TOML
RUST_LOG=warn $bin run --config "$tmp/rss.toml" &
pid=$!
peak=0; start=$(date +%s.%N)
while :; do
  rss=$(awk '/^VmRSS:/ {print $2}' /proc/$pid/status 2>/dev/null || echo 0)
  [ "$rss" -gt "$peak" ] && peak=$rss
  left=$(psql -qXtA -d "$DB" -c "SELECT count(*) FROM qbridge.jobs WHERE queue = 'rss'")
  [ "$left" = 0 ] && break
  sleep 0.02
done
secs=$(echo "$(date +%s.%N) - $start" | bc)
kill -TERM $pid; wait $pid || true
printf 'qbridge run drained %d jobs in %.1f s; peak RSS %.1f MiB\n' "$N" "$secs" "$(echo "$peak / 1024" | bc -l)"
