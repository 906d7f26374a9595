#!/usr/bin/env bash
# Counts stalled runs of two builds, alternated: each round runs, for A then
# B, a full-speed steady run (10 s) and a paced one (RATE jobs/s, 15 s), each
# on a database created fresh for it (the state in which the steady-state stalls
# appeared: a table whose statistics were taken while it was empty). A run
# is stalled when its enqueue-to-start p99 is over a second.
#
#   PGPORT=5499 BIN_A=/tmp/qb-before BIN_B=target/release/qbridge ROUNDS=10 bench/stall-ab/run.sh
#
# Env: ROUNDS (10), RATE (15000), PGHOST/PGPORT/PGUSER. Prints one line per
# run (variant, mode, completed/s, enqueued/s, p50, p99, max in ms), then
# each variant's count of stalled runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
ROUNDS=${ROUNDS:-10} RATE=${RATE:-15000}
BIN_A=${BIN_A:?the build to compare against} BIN_B=${BIN_B:-target/release/qbridge}
db=stall_ab
url="postgres://$PGUSER${PGPASSWORD:+:$PGPASSWORD}@$PGHOST:$PGPORT/$db"
out=$(mktemp); trap 'rm -f "$out"' EXIT

run() { # variant bin mode args...
    local variant=$1 bin=$2 mode=$3; shift 3
    psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
    RUST_LOG=error "$bin" bench steady --database-url "$url" --workers 2 --batch 100 \
        --producers 2 --producer-batch 100 "$@" --json |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(sys.argv[1], sys.argv[2], int(d["completed_jobs_s"]), int(d["enqueue_jobs_s"]), round(d["latency_p50_ms"],1), round(d["latency_p99_ms"],1), round(d["latency_max_ms"],1))' "$variant" "$mode" |
        tee -a "$out"
}

echo "variant mode completed/s enqueued/s p50_ms p99_ms max_ms"
for _ in $(seq "$ROUNDS"); do
    for v in A B; do
        bin=$BIN_A; [ $v = B ] && bin=$BIN_B
        run $v "$bin" full --rate 0 --duration 10s
        run $v "$bin" paced --rate "$RATE" --duration 15s
    done
done
python3 - "$out" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
for v in "AB":
    mine = [r for r in rows if r[0] == v]
    stalled = [r for r in mine if float(r[5]) > 1000]
    paced = [float(r[5]) for r in mine if r[1] == "paced" and float(r[5]) <= 1000]
    print(f"{v}: {len(stalled)} of {len(mine)} runs stalled (p99 over 1 s)", end="")
    if paced:
        print(f"; paced runs not stalled: p99 {min(paced)}-{max(paced)} ms", end="")
    print()
PY
