#!/usr/bin/env bash
# How long `qbridge survey` takes on a big keyspace (docs/src/guides/survey.md;
# the book's survey page): a throwaway redis-server filled with JOBS RQ job hashes
# (`rq:job:<n>`, as RQ 3.0's job.py names them, ~300 bytes each) and three
# RQ queues of 1,000 ids each with their registries, then surveyed ROUNDS
# times without the push-rate window (--sample 0s: the window only adds
# its own length).
#
#   bench/survey-keyspace/run.sh [JOBS=1000000] [ROUNDS=3]
#   env: QBRIDGE=target/release/qbridge
#
# The keys are written by a Lua script into the bench's own server (no RQ
# client: a million enqueues through RQ would take the bench's whole
# budget), which is stopped at the end. Prints the survey's wall time and
# peak RSS per round.
set -euo pipefail
jobs=${1:-1000000}
rounds=${2:-3}
qbridge=${QBRIDGE:-target/release/qbridge}
[ -x "$qbridge" ] || { echo "error: $qbridge is missing: cargo build --release" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "error: redis-server is missing (Debian: apt-get install -y redis-server)" >&2; exit 1; }

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null || true; rm -rf "$dir"' EXIT
cli() { redis-cli -p "$port" "$@"; }
until cli ping >/dev/null 2>&1; do sleep 0.1; done

fill='
local data = string.rep("x", 240)
for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
  redis.call("HSET", "rq:job:" .. i, "status", "finished", "origin", "q" .. (i % 3),
    "data", data, "created_at", "2026-11-28T00:00:00.000000Z")
end
return 0'
batch=100000
for ((start = 1; start <= jobs; start += batch)); do
  stop=$((start + batch - 1)); ((stop > jobs)) && stop=$jobs
  cli eval "$fill" 0 "$start" "$stop" >/dev/null
done
queues='
for q = 0, 2 do
  redis.call("SADD", "rq:queues", "rq:queue:q" .. q)
  for i = 1, 1000 do
    redis.call("RPUSH", "rq:queue:q" .. q, tostring(q * 1000 + i))
    redis.call("ZADD", "rq:finished:q" .. q, i, tostring(q * 1000 + i + 3000))
  end
  redis.call("ZADD", "rq:failed:q" .. q, 1, "f" .. q)
end
return 0'
cli eval "$queues" 0 >/dev/null
echo "keys: $(cli dbsize), used_memory: $(cli info memory | grep '^used_memory_human' | cut -d: -f2 | tr -d '\r')"

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; r++)); do
  /usr/bin/time -o "$dir/time.txt" -f "%e s wall, %M KB peak RSS" \
    "$qbridge" survey --redis-url "redis://127.0.0.1:$port/0" --sample 0s >"$dir/out.txt"
  echo "round $r: $(cat "$dir/time.txt"); the survey says: $(grep -m1 'keys scanned' "$dir/out.txt")"
done
