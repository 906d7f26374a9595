#!/usr/bin/env bash
# qbridge against the SQL floor, in one run on one database:
#   1. the pgbench floor (insert + SKIP LOCKED claim + delete per transaction),
#      8 clients, at batch B;
#   2. qbridge's own enqueue, claim and completion statements under pgbench, on
#      qbridge's table (bench/compare/qbridge-cycle.sql): the SQL's share of the cost;
#   3. qbridge's burn-down (enqueue N, then drain with W workers) at claim batch B;
#   4. qbridge's steady state at full speed (enqueue and drain at once, like the floor);
# repeated RUNS times, round-robin; prints medians and the ratios.
# Env: DB (qbridge_compare, dropped and recreated), B (100), N (50000), W (2),
#      P (producers of the steady state; W by default: two producers, each
#      with one enqueue in flight, set the pace on this 2-core machine),
#      RUNS (3), FLOOR_SECONDS (15), FLOOR_CLIENTS (8), PGHOST/PGPORT/PGUSER,
#      BIN and CYCLE_SQL (another build and its statements, for before/after).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
DB=${DB:-qbridge_compare}; B=${B:-100}; N=${N:-50000}; W=${W:-2}; P=${P:-$W}; RUNS=${RUNS:-3}
FLOOR_SECONDS=${FLOOR_SECONDS:-15}; FLOOR_CLIENTS=${FLOOR_CLIENTS:-8}
URL="postgres://$PGUSER${PGPASSWORD:+:$PGPASSWORD}@$PGHOST:$PGPORT/$DB"

# BIN: another build to measure (a before/after pair); CYCLE_SQL: the
# statements it runs, as they were at that build.
if [ -z "${BIN:-}" ]; then cargo build --release -q; fi
bin=${BIN:-target/release/qbridge}
cycle=${CYCLE_SQL:-bench/compare/qbridge-cycle.sql}
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
RUST_LOG=warn $bin migrate --database-url "$URL" >/dev/null

out=$(mktemp); trap 'rm -f "$out"' EXIT
for r in $(seq "$RUNS"); do
  echo ">> run $r/$RUNS: SQL floor B=$B" >&2
  psql -qX -d "$DB" -f bench/compare/floor-schema.sql >/dev/null
  psql -qX -d "$DB" -c 'VACUUM ANALYZE qbridge_floor.jobs' -c CHECKPOINT >/dev/null
  tps=$(pgbench -n -M prepared -c "$FLOOR_CLIENTS" -j 2 -T "$FLOOR_SECONDS" -D B="$B" -f bench/compare/floor.sql "$DB" 2>&1 |
        sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
  echo "floor $(awk -v t="$tps" -v b="$B" 'BEGIN{printf "%d", t*b}')" >>"$out"
  psql -qX -d "$DB" -c 'DROP SCHEMA qbridge_floor CASCADE' -c CHECKPOINT >/dev/null

  echo ">> run $r/$RUNS: qbridge's statements under pgbench B=$B" >&2
  psql -qX -d "$DB" -c 'VACUUM ANALYZE qbridge.jobs' -c CHECKPOINT >/dev/null
  # Planned at every run, as qbridge's own connections plan them (db::plan_every_run).
  tps=$(PGOPTIONS='-c plan_cache_mode=force_custom_plan' \
        pgbench -n -M prepared -c "$FLOOR_CLIENTS" -j 2 -T "$FLOOR_SECONDS" -D B="$B" -f "$cycle" "$DB" 2>&1 |
        sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
  echo "cycle $(awk -v t="$tps" -v b="$B" 'BEGIN{printf "%d", t*b}')" >>"$out"
  psql -qX -d "$DB" -c "DELETE FROM qbridge.jobs WHERE queue = 'cycle'" -c 'VACUUM ANALYZE qbridge.jobs' -c CHECKPOINT >/dev/null

  echo ">> run $r/$RUNS: qbridge burn-down N=$N W=$W batch=$B" >&2
  RUST_LOG=warn $bin bench burndown --database-url "$URL" --jobs "$N" --workers "$W" --batch "$B" --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("burndown", int(d["drain_jobs_s"]), int(d["enqueue_jobs_s"]), d["ok"], round(d["rss_peak_mib"],1))' >>"$out"

  echo ">> run $r/$RUNS: qbridge steady state (full speed) batch=$B producers=$P" >&2
  RUST_LOG=warn $bin bench steady --database-url "$URL" --workers "$W" --batch "$B" --rate 0 \
      --producers "$P" --producer-batch "$B" --duration "${FLOOR_SECONDS}s" --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("steady", int(d["completed_jobs_s"]), d["ok"], int(d["enqueue_jobs_s"]), round(d["qbridge_cores"], 2), round(d["other_cores"], 2))' >>"$out"
done

python3 - "$out" "$B" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
B = sys.argv[2]
med = lambda k, i=1: statistics.median(int(r[i]) for r in rows if r[0] == k)
floor, cycle, burn, steady, enq = med("floor"), med("cycle"), med("burndown"), med("steady"), med("burndown", 2)
ok = all(r[3] == "True" for r in rows if r[0] == "burndown") and all(r[2] == "True" for r in rows if r[0] == "steady")
print(f"| measure (batch {B}, median of {sum(r[0]=='floor' for r in rows)}) | jobs/s | vs SQL floor |")
print("|---|---|---|")
print(f"| SQL floor (pgbench, insert+claim+delete) | {floor:,.0f} | 1.00 |")
print(f"| qbridge's statements under pgbench (enqueue+claim+complete) | {cycle:,.0f} | {cycle/floor:.2f} |")
print(f"| qbridge burn-down drain | {burn:,.0f} | {burn/floor:.2f} |")
print(f"| qbridge steady state (enqueue+drain at once) | {steady:,.0f} | {steady/floor:.2f} |")
print(f"| qbridge batched enqueue | {enq:,.0f} | - |")
fmed = lambda k, i: statistics.median(float(r[i]) for r in rows if r[0] == k)
print(f"steady state: producers enqueued {med('steady', 3):,.0f} jobs/s while workers completed {steady:,.0f}; "
      f"CPU cores busy: qbridge process {fmed('steady', 4):.2f}, the rest (Postgres) {fmed('steady', 5):.2f}")
print(f"every job ran exactly once in every qbridge run: {ok}")
PY
