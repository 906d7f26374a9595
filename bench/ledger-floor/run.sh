#!/usr/bin/env bash
# What one mirrored item costs Postgres to record, against the cheapest
# records that could replace it: the evidence behind the proxy's depth-1
# ratio (docs/src/internals/performance.md, "The RESP proxy").
#
#   bench/ledger-floor/run.sh URL [ROUNDS=3] [SECONDS=10]
#   env: PRELOAD=300000 rows already in each per-item table (a ledger
#   holding its dedup window); 0 is the bench's own nearly empty ledger.
#
# URL: a throwaway cluster started with `PROFILE=1 bench/cluster/run.sh start`
# (pg_stat_statements must be preloaded). The script migrates it, works in
# its own schema `ledger_floor` and drops it at the end.
#
# Each variant writes batches of 114 items (the mirror's batch at depth 1)
# with pgbench, one client, into a table preloaded with PRELOAD rows. The
# figure is the statement's execution time per item from
# pg_stat_statements (CPU inside Postgres, without commit or WAL flush),
# minus the time to generate the same rows without writing them.
#   ledger     the mirror's statement (KEYS_SQL in src/ingest/keys.rs, kept in
#              step by hand) into a copy of job_keys
#   keyed-row  the least a per-item ledger could write: (queue, key), its
#              primary key, a plain insert, no payload, no duplicate check
#   batch-row  one row per batch: the keys and payloads as arrays
set -euo pipefail
url=${1:?usage: bench/ledger-floor/run.sh URL [ROUNDS] [SECONDS]}
rounds=${2:-3}
secs=${3:-10}
preload=${PRELOAD:-300000}
export PGOPTIONS="-c client_min_messages=warning"
qbridge=${QBRIDGE:-target/release/qbridge}
psql=(psql "$url" -qAtX -v ON_ERROR_STOP=1)
[ -x "$qbridge" ] || { echo "$qbridge not found: cargo build --release, or set QBRIDGE" >&2; exit 1; }
"$qbridge" --database-url "$url" migrate >/dev/null
"${psql[@]}" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null ||
    { echo "pg_stat_statements is not loaded: start the cluster with PROFILE=1" >&2; exit 1; }
"${psql[@]}" <<'SQL'
DROP SCHEMA IF EXISTS ledger_floor CASCADE;
CREATE SCHEMA ledger_floor;
CREATE TABLE ledger_floor.job_keys (LIKE qbridge.job_keys INCLUDING ALL);
CREATE TABLE ledger_floor.keyed (queue text NOT NULL, key text NOT NULL, PRIMARY KEY (queue, key));
CREATE TABLE ledger_floor.batches (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL, keys text[] NOT NULL, originals bytea[] NOT NULL, pushed_at timestamptz NOT NULL);
SQL
work=$(mktemp -d)
trap 'rm -rf "$work"; "${psql[@]}" -c "DROP SCHEMA IF EXISTS ledger_floor CASCADE" >/dev/null' EXIT
rows="SELECT 'bench'::text AS queue, gen_random_uuid()::text AS key, 'mirror'::text AS copy,
      'proxy'::text AS via, NULL::text AS flagged, now() AS pushed_at, NULL::timestamptz AS due_at,
      convert_to(repeat('x', 200), 'UTF8') AS original FROM generate_series(1, 114)"
cat >"$work/ledger.sql" <<SQL
INSERT INTO ledger_floor.job_keys (queue, key, copy, via, flagged, pushed_at, due_at, original)
SELECT t.queue, t.key, t.copy, t.via, t.flagged, t.pushed_at, t.due_at,
       CASE WHEN t.original IS NOT NULL AND NOT EXISTS (SELECT 1 FROM qbridge.outcomes o
            WHERE o.queue = t.queue AND o.key = t.key AND o.side = 'redis' AND o.outcome IN ('ok', 'dead'))
            THEN t.original END
  FROM ($rows) t ORDER BY t.queue, t.key ON CONFLICT (queue, key) DO NOTHING RETURNING queue, key;
SQL
echo "SELECT t.queue, t.key FROM ($rows) t ORDER BY t.queue, t.key;" >"$work/ledger-gen.sql"
echo "INSERT INTO ledger_floor.keyed (queue, key) SELECT t.queue, t.key FROM ($rows) t;" >"$work/keyed-row.sql"
echo "SELECT t.queue, t.key FROM ($rows) t;" >"$work/keyed-row-gen.sql"
cat >"$work/batch-row.sql" <<SQL
INSERT INTO ledger_floor.batches (queue, keys, originals, pushed_at)
SELECT 'bench', array_agg(t.key), array_agg(t.original), now() FROM ($rows) t;
SQL
echo "SELECT 'bench', array_agg(t.key), array_agg(t.original), now() FROM ($rows) t;" >"$work/batch-row-gen.sql"

# Execution time per item (µs) of one script's statement, on fresh tables.
per_item() {
    "${psql[@]}" >/dev/null <<SQL
TRUNCATE ledger_floor.job_keys, ledger_floor.keyed, ledger_floor.batches;
INSERT INTO ledger_floor.job_keys (queue, key, copy, via, pushed_at, original)
SELECT 'bench', gen_random_uuid()::text, 'mirror', 'proxy', now(), convert_to(repeat('x', 200), 'UTF8')
  FROM generate_series(1, $preload);
INSERT INTO ledger_floor.keyed SELECT queue, key FROM ledger_floor.job_keys;
VACUUM ANALYZE ledger_floor.job_keys, ledger_floor.keyed, ledger_floor.batches;
CHECKPOINT;
SELECT pg_stat_statements_reset();
SQL
    pgbench "$url" -n -M simple -c 1 -T "$secs" -f "$work/$1.sql" >/dev/null 2>&1
    "${psql[@]}" -c "SELECT round((sum(total_exec_time) / sum(calls) * 1000 / 114)::numeric, 2)
                       FROM pg_stat_statements WHERE query ~* '^(INSERT INTO ledger_floor|SELECT)'
                        AND query ~ 'generate_series' AND calls > 10"
}

printf '%-10s %8s %8s %8s   (µs per item, execution; %s rounds of %ss; %s rows preloaded)\n' variant write generate net "$rounds" "$secs" "$preload"
for round in $(seq "$rounds"); do
    for v in ledger keyed-row batch-row; do
        w=$(per_item "$v")
        g=$(per_item "$v-gen")
        printf '%-10s %8s %8s %8s   round %s\n' "$v" "$w" "$g" "$(echo "$w - $g" | bc)" "$round"
    done
done
