#!/usr/bin/env bash
# A throwaway PostgreSQL cluster with the server's default settings
# (autovacuum on, unlike the shared development server), for benchmarks
# whose numbers depend on vacuum: start it, run the benchmark against the
# URL it prints, stop it.
#
#   bench/cluster/run.sh start [DIR=/tmp/qbridge-bench-pg] [PORT=5499]
#       prints the database URL (database "bench", created empty)
#   bench/cluster/run.sh stop  [DIR=/tmp/qbridge-bench-pg]
#
# env: PROFILE=1 also loads pg_stat_statements (for finding where the time
# goes; leave it off for the numbers: it costs a little per statement).
set -euo pipefail
cmd=${1:-}
dir=${2:-/tmp/qbridge-bench-pg}
port=${3:-5499}
bin=$(dirname "$(command -v initdb || echo /usr/lib/postgresql/15/bin/initdb)")
[ -x "$bin/initdb" ] || bin=/usr/lib/postgresql/15/bin
as=()
# initdb refuses to run as root: run the server as the postgres user then.
if [ "$(id -u)" = 0 ]; then as=(runuser -u postgres --); fi
case $cmd in
start)
    if [ ! -d "$dir" ]; then
        mkdir -p "$dir"
        [ ${#as[@]} -eq 0 ] || chown postgres "$dir"
        "${as[@]}" "$bin/initdb" -D "$dir/data" -U postgres --auth=trust >"$dir/initdb.log"
        {
            echo "port = $port"
            echo "listen_addresses = '127.0.0.1'"
            echo "unix_socket_directories = '$dir'"
            echo "max_connections = 200"
            if [ "${PROFILE:-0}" = 1 ]; then
                echo "shared_preload_libraries = 'pg_stat_statements'"
                echo "pg_stat_statements.track = all"
            fi
        } >>"$dir/data/postgresql.conf"
    fi
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atqc \
        "SELECT 1 FROM pg_database WHERE datname = 'bench'" | grep -q 1 ||
        psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE DATABASE bench"
    echo "postgres://postgres@127.0.0.1:$port/bench"
    ;;
stop)
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
    rm -rf "$dir"
    ;;
*)
    echo "usage: bench/cluster/run.sh start|stop [DIR] [PORT]" >&2
    exit 2
    ;;
esac
