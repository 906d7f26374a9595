#!/usr/bin/env bash
# qbridge behind PgBouncer in transaction mode vs straight to Postgres, in
# one run on one database:
#   1. burn-down (enqueue N, drain with W workers): direct vs through PgBouncer
#      (pool_mode = transaction, default_pool_size = POOL), RUNS times
#      alternating, medians;
#   2. idle pickup latency (jobs enqueued one at a time onto an idle queue):
#      direct with LISTEN, through PgBouncer with LISTEN over [database]
#      direct_url, and through PgBouncer with polling only (no direct_url,
#      poll_interval = POLL).
# Env: DB (qbridge_pooler, dropped and recreated), N (50000), W (2), B (500),
#      RUNS (3), POOL (20), POLL (250ms), SAMPLES (200), PGHOST/PGPORT/PGUSER.
# Needs pgbouncer on PATH (scripts/test-deps.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
DB=${DB:-qbridge_pooler}; N=${N:-50000}; W=${W:-2}; B=${B:-500}; RUNS=${RUNS:-3}
POOL=${POOL:-20}; POLL=${POLL:-250ms}; SAMPLES=${SAMPLES:-200}
command -v pgbouncer >/dev/null || { echo "error: pgbouncer is not installed (scripts/test-deps.sh)" >&2; exit 1; }
DIRECT="postgres://$PGUSER@$PGHOST:$PGPORT/$DB"

cargo build --release -q
bin=target/release/qbridge
psql -qX -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
RUST_LOG=warn $bin migrate --database-url "$DIRECT" >/dev/null

dir=$(mktemp -d); chmod 777 "$dir"
bport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$dir/pgbouncer.ini" <<INI
[databases]
* = host=$PGHOST port=$PGPORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $bport
unix_socket_dir =
auth_type = trust
auth_file = $dir/users.txt
pool_mode = transaction
default_pool_size = $POOL
max_client_conn = 1000
logfile = $dir/pgbouncer.log
INI
printf '"%s" ""\n' "$PGUSER" >"$dir/users.txt"
chmod -R a+rwX "$dir"
as=(); [ "$(id -u)" = 0 ] && as=(-u nobody)
pgbouncer "${as[@]}" "$dir/pgbouncer.ini" & bpid=$!
out=$(mktemp)
trap 'kill $bpid 2>/dev/null; rm -rf "$dir" "$out"' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$bport) 2>/dev/null && break; sleep 0.1; done
POOLED="postgres://$PGUSER@127.0.0.1:$bport/$DB"
printf '[database]\npooler = "pgbouncer-transaction"\ndirect_url = "%s"\n' "$DIRECT" >"$dir/with-direct.toml"

burndown() { # label, extra args...
  local label=$1; shift
  RUST_LOG=warn $bin bench burndown "$@" --jobs "$N" --workers "$W" --batch "$B" --json |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print("'"$label"'", int(d["drain_jobs_s"]), int(d["enqueue_jobs_s"]), d["ok"])' >>"$out"
}
for r in $(seq "$RUNS"); do
  echo ">> run $r/$RUNS: burn-down direct, then through PgBouncer" >&2
  psql -qX -d "$DB" -c CHECKPOINT >/dev/null
  burndown direct --database-url "$DIRECT"
  psql -qX -d "$DB" -c CHECKPOINT >/dev/null
  burndown pgbouncer --database-url "$POOLED" --pooler pgbouncer-transaction
done

latency() { # label, extra args...
  local label=$1; shift
  RUST_LOG=warn $bin bench latency "$@" --samples "$SAMPLES" --poll-interval "$POLL" --json |
    python3 -c '
import json,sys; d=json.load(sys.stdin)
for k,v in d.items():
    if isinstance(v,(int,float)) and ("p50" in k or "p99" in k): print("'"$label"'", k, round(v,2))' >>"$out"
}
echo ">> idle pickup: direct (LISTEN and the poll backstop)" >&2
latency latency-direct --database-url "$DIRECT"
echo ">> idle pickup: through PgBouncer, LISTEN over direct_url" >&2
latency latency-pgbouncer-listen -c "$dir/with-direct.toml" --database-url "$POOLED"
echo ">> idle pickup: through PgBouncer, polling only" >&2
latency latency-pgbouncer-poll --database-url "$POOLED" --pooler pgbouncer-transaction

python3 - "$out" "$RUNS" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
med = lambda xs: statistics.median(xs) if xs else float("nan")
d = [int(r[1]) for r in rows if r[0] == "direct"]
p = [int(r[1]) for r in rows if r[0] == "pgbouncer"]
de = [int(r[2]) for r in rows if r[0] == "direct"]
pe = [int(r[2]) for r in rows if r[0] == "pgbouncer"]
ok = all(r[3] == "True" for r in rows if r[0] in ("direct", "pgbouncer"))
print(f"burn-down (median of {sys.argv[2]}): drain jobs/s direct {med(d):.0f} vs PgBouncer {med(p):.0f} "
      f"(x{med(p)/med(d):.2f}); enqueue jobs/s {med(de):.0f} vs {med(pe):.0f} (x{med(pe)/med(de):.2f}); all ok: {ok}")
print("  direct drains:", d, " PgBouncer drains:", p)
for r in rows:
    if r[0].startswith("latency"):
        print(f"  {r[0]:<26} {r[1]:<28} {r[2]} ms")
PY
