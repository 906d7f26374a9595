#!/usr/bin/env bash
# Two variants of the steady state at full speed, A and B, alternated PAIRS
# times, each run on a database created fresh for it (a reused one bloats,
# and its runs drift down: one fell to 413 jobs/s). A variant is a build
# (BIN_A, BIN_B) and SQL run in it after migrating (SQL_A, SQL_B; e.g.
# "ALTER DATABASE steady_ab SET qbridge.notify_max_usage = 0" for no NOTIFY).
#
#   PGPORT=5499 BIN_A=/tmp/qb-before BIN_B=/tmp/qb-after bench/steady-ab/run.sh
#
# Env: PAIRS (3), W (2 worker runtimes), P (producers; W by default), RATE (jobs/s
# over all producers; 0, the default: full speed), B (100: claim
# and producer batch), DURATION (15s), ARGS (more `bench steady` arguments;
# ARGS_A, ARGS_B: a variant's own, e.g. "--concurrency 200"),
# PGHOST/PGPORT/PGUSER. Prints one line per run, then the medians.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
PAIRS=${PAIRS:-3} W=${W:-2} P=${P:-$W} B=${B:-100} DURATION=${DURATION:-15s}
BIN_A=${BIN_A:-target/release/qbridge} BIN_B=${BIN_B:-$BIN_A}
db=steady_ab
url="postgres://$PGUSER${PGPASSWORD:+:$PGPASSWORD}@$PGHOST:$PGPORT/$db"
out=$(mktemp); trap 'rm -f "$out"' EXIT

run() { # variant bin sql args
    psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
    RUST_LOG=warn "$2" migrate --database-url "$url" >/dev/null
    [ -z "$3" ] || psql -qX -d "$db" -c "$3" >/dev/null
    psql -qX -d "$db" -c CHECKPOINT >/dev/null
    # shellcheck disable=SC2086 # ARGS is a list of arguments
    RUST_LOG=warn "$2" bench steady --database-url "$url" --workers "$W" --batch "$B" --rate "${RATE:-0}" \
        --producers "$P" --producer-batch "$B" --duration "$DURATION" ${ARGS:-} $4 --json |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print(sys.argv[1], int(d["completed_jobs_s"]), int(d["enqueue_jobs_s"]), round(d["latency_p50_ms"],1), round(d["latency_p99_ms"],1), round(d["qbridge_cores"],2), round(d["other_cores"],2), d["ok"])' "$1" |
        tee -a "$out"
}

echo "variant completed/s enqueued/s p50_ms p99_ms qbridge_cores other_cores ok"
for _ in $(seq "$PAIRS"); do
    run A "$BIN_A" "${SQL_A:-}" "${ARGS_A:-}"
    run B "$BIN_B" "${SQL_B:-}" "${ARGS_B:-}"
done
python3 - "$out" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for v in ("A", "B"):
    r = [x for x in rows if x[0] == v]
    med = lambda i: statistics.median(float(x[i]) for x in r)
    print(f"median {v}: completed {med(1):,.0f}/s, enqueued {med(2):,.0f}/s, p50 {med(3)} ms, p99 {med(4)} ms, "
          f"cores qbridge {med(5):.2f} / Postgres {med(6):.2f}; all ok: {all(x[7] == 'True' for x in r)}")
PY
