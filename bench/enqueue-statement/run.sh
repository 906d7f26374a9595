#!/usr/bin/env bash
# The enqueue statement alone under pgbench, as `queue::enqueue` sends it for
# a chunk of unkeyed jobs (100 rows from ten parameter arrays, the tenant
# join, input order), against the same statement with the keyed chunk's
# ON CONFLICT clause, and a bare INSERT like the SQL floor's. Alternated
# RUNS times on a fresh database; prints jobs/s per run and the medians.
#
#   PGPORT=5499 bench/enqueue-statement/run.sh
#
# Env: RUNS (3), SECONDS_EACH (8), CLIENTS (4), B (100), BIN (a build, to
# migrate), PGHOST/PGPORT/PGUSER.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
RUNS=${RUNS:-3} SECONDS_EACH=${SECONDS_EACH:-8} CLIENTS=${CLIENTS:-4} B=${B:-100}
BIN=${BIN:-target/release/qbridge}
db=enqueue_statement
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db" >/dev/null
RUST_LOG=warn "$BIN" migrate --database-url "postgres://$PGUSER@$PGHOST:$PGPORT/$db" >/dev/null

# The ten arrays the producer binds, built by the server (the same cost in
# every variant but `bare`).
arrays="WITH a AS (SELECT array_agg('bench'::text) q, array_agg(NULL::text) k,
  array_agg(NULL::text) ky, array_agg(('{\"i\":' || g || '}')::text) p, array_agg(0) pr,
  array_agg(NULL::timestamptz) ra, array_agg(NULL::int4) ma, array_agg(NULL::text) lk,
  array_agg('live'::text) c, array_agg(NULL::bytea) o FROM generate_series(1, :B) g)"
body="INSERT INTO qbridge.jobs (queue, kind, key, payload, priority, run_at, max_attempts,
                          lock_key, tenant, copy, original)
SELECT t.queue, t.kind, t.key, t.payload::jsonb, t.priority, coalesce(t.run_at, now()),
       coalesce(t.max_attempts, 25), t.lock_key,
       CASE WHEN s.tenant_path IS NOT NULL
            THEN coalesce(t.payload::jsonb #>> s.tenant_path, '') END,
       t.copy, t.original
  FROM a, unnest(a.q, a.k, a.ky, a.p, a.pr, a.ra, a.ma, a.lk, a.c, a.o)
       WITH ORDINALITY AS t(queue, kind, key, payload, priority, run_at, max_attempts,
                            lock_key, copy, original, ord)
  LEFT JOIN qbridge.queue_settings s ON s.queue = t.queue
 ORDER BY t.ord"
printf '%s\n%s\n%s\n' "$arrays" "$body" "RETURNING id, queue, key;" >"$dir/unkeyed.sql"
printf '%s\n%s\n%s\n%s\n' "$arrays" "$body" \
  "ON CONFLICT (queue, key) WHERE key IS NOT NULL AND copy = 'live' DO NOTHING" \
  "RETURNING id, queue, key;" >"$dir/on_conflict.sql"
echo "INSERT INTO qbridge.jobs (queue, payload) SELECT 'bench', jsonb_build_object('i', g) FROM generate_series(1, :B) g;" >"$dir/bare.sql"

out="$dir/out"
for r in $(seq "$RUNS"); do
  for v in on_conflict unkeyed bare; do
    psql -qX -d "$db" -c 'TRUNCATE qbridge.jobs' -c CHECKPOINT >/dev/null
    tps=$(pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$SECONDS_EACH" -D B="$B" -f "$dir/$v.sql" "$db" 2>&1 |
          sed -n 's/^tps = \([0-9.]*\) .*/\1/p')
    jobs=$(awk -v t="$tps" -v b="$B" 'BEGIN{printf "%d", t*b}')
    echo "run $r $v $jobs" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {v: statistics.median(int(r[3]) for r in rows if r[2] == v) for v in ("on_conflict", "unkeyed", "bare")}
for v, m in med.items():
    print(f"median {v}: {m:,} jobs/s ({m / med['on_conflict']:.2f} of on_conflict)")
PY
psql -qX -d postgres -c "DROP DATABASE $db WITH (FORCE)" >/dev/null
