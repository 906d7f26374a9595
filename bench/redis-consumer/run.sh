#!/usr/bin/env bash
# How fast qbridge's Redis consumer drains a backlog, end to end: N id-keyed
# items pushed to a Redis list (one pipelined LPUSH stream), then `qbridge
# run` with the route's consumer (noop handler, CONCURRENCY slots) until the
# list and its processing lists are empty and every outcome is in Postgres.
# Each item is claimed (running claim + ran set), run, its outcome synced to
# the local spool and acked. Prints items/s from the process's start to the
# last outcome. Env: BIN (target/release/qbridge), DB (qbridge_rc),
# N (20000), CONCURRENCY (8), REDIS_URL (redis://127.0.0.1:6379/0).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
DB=${DB:-qbridge_rc}; N=${N:-20000}; CONCURRENCY=${CONCURRENCY:-8}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379/0}
BIN=${BIN:-target/release/qbridge}
export QBRIDGE_DATABASE_URL="postgres://$PGUSER${PGPASSWORD:+:$PGPASSWORD}@$PGHOST:$PGPORT/$DB"
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
"$BIN" migrate >/dev/null
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
list="qbench:rc:$$"
route="rc$$"
seq 1 "$N" | awk -v l="$list" '{printf "*3\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n", length(l), l; j="{\"id\":\"j" $1 "\"}"; printf "$%d\r\n%s\r\n", length(j), j}' \
  | redis-cli -u "$REDIS_URL" --pipe >/dev/null
cat >"$tmp/rc.toml" <<TOML
redis_url = "$REDIS_URL"
[http]
listen = "127.0.0.1:0"
[[routes]]
name = "$route"
redis_key = "$list"
queue = "$route"
format = "json:/id"
phase = "redis_only"
handler = { type = "noop" }
redis_consumer = { concurrency = $CONCURRENCY, consumer_name = "rc$$" }
TOML
start=$(date +%s.%N)
RUST_LOG=warn "$BIN" run --config "$tmp/rc.toml" &
pid=$!
while :; do
  done_n=$(psql -qXtA -d "$DB" -c "SELECT count(*) FROM qbridge.outcomes WHERE queue = '$route'")
  [ "$done_n" -ge "$N" ] && break
  kill -0 $pid 2>/dev/null || { echo "qbridge run exited early" >&2; exit 1; }
  sleep 0.05
done
secs=$(echo "$(date +%s.%N) - $start" | bc)
kill -TERM $pid; wait $pid || true
redis-cli -u "$REDIS_URL" del "$list" >/dev/null
redis-cli -u "$REDIS_URL" --scan --pattern "*$route*" | xargs -r redis-cli -u "$REDIS_URL" del >/dev/null
printf 'redis consumer: %d items in %.2f s = %.0f items/s (concurrency %d)\n' \
  "$N" "$secs" "$(echo "$N / $secs" | bc -l)" "$CONCURRENCY"
