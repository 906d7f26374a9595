#!/usr/bin/env bash
# Drain with 1, 2 and 4 `qbridge run` processes on one database, the same
# total concurrency (C handlers, split evenly), no-op handler: N jobs are
# enqueued, the processes start, and the clock stops when the queue is
# empty (process start-up included). Also counts the transactions Postgres
# committed per job (pg_stat_database.xact_commit). RUNS rounds, round-robin
# over the process counts; medians. The target: no drop from 1 to 4 processes.
# Env: DB (qbridge_processes, dropped and recreated), N (300000), C (64),
#      B (500: claim batch), W (50ms: prefetch_window, 0s turns prefetch off),
#      RUNS (3), PGHOST/PGPORT/PGUSER.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
DB=${DB:-qbridge_processes}; N=${N:-300000}; C=${C:-64}; B=${B:-500}; W=${W:-50ms}; RUNS=${RUNS:-3}
URL="postgres://$PGUSER@$PGHOST:$PGPORT/$DB"

cargo build --release -q
bin=target/release/qbridge
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
RUST_LOG=warn $bin migrate --database-url "$URL" >/dev/null
dir=$(mktemp -d); out="$dir/results"; pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$dir"' EXIT
seq "$N" | sed 's/.*/{"n":&}/' >"$dir/jobs.jsonl"

for r in $(seq "$RUNS"); do
  for k in 1 2 4; do
    RUST_LOG=warn $bin enqueue --database-url "$URL" --queue bench --file "$dir/jobs.jsonl" >/dev/null
    psql -qX -d "$DB" -c 'VACUUM ANALYZE qbridge.jobs' -c CHECKPOINT >/dev/null
    commits() { psql -qAtX -d "$DB" -c "SELECT pg_stat_force_next_flush()" \
                  -c "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()" | tail -1; }
    c0=$(commits)
    pids=()
    start=$(date +%s.%N)
    for i in $(seq "$k"); do
      printf 'worker_id = "p%s"\nmax_connections = %s\n[http]\nlisten = "127.0.0.1:0"\n[[pools]]\nqueues = ["bench"]\nconcurrency = %s\nbatch_size = %s\nprefetch_window = "%s"\nhandler = { type = "noop" }\n' \
        "$i" $((C / k / 8 + 4)) $((C / k)) "$B" "$W" >"$dir/p$i.toml"
      RUST_LOG=warn $bin run -c "$dir/p$i.toml" --database-url "$URL" 2>>"$dir/run.log" & pids+=($!)
    done
    until [ "$(psql -qAtX -d "$DB" -c "SELECT NOT EXISTS (SELECT 1 FROM qbridge.jobs WHERE queue = 'bench')")" = t ]; do
      sleep 0.05
    done
    end=$(date +%s.%N)
    kill -TERM "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
    sleep 1
    per_job=$(python3 -c "print(round(($(commits) - $c0) / $N, 3))")
    rate=$(python3 -c "print(int($N / ($end - $start)))")
    echo ">> run $r/$RUNS: $k process(es): $rate jobs/s, $per_job commits per job" >&2
    echo "$k $rate $per_job" >>"$out"
  done
done
python3 - "$out" "$N" "$C" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
by = {k: [int(r[1]) for r in rows if r[0] == k] for k in ("1", "2", "4")}
commits = {k: [float(r[2]) for r in rows if r[0] == k] for k in ("1", "2", "4")}
one = statistics.median(by["1"])
for k, xs in by.items():
    m = statistics.median(xs)
    print(f"{k} process(es), {int(sys.argv[3])//int(k)} handlers each: drain {m:.0f} jobs/s (x{m/one:.2f} of 1), "
          f"{statistics.median(commits[k]):.3f} commits per job  runs {xs}")
PY
