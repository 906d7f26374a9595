#!/usr/bin/env bash
# Makes sure PostgreSQL answers on 127.0.0.1:5432 and Redis on 127.0.0.1:6379.
# Starts them when they are installed but down. With --install, installs them
# from the OS packages first when missing (Debian/Ubuntu: apt-get); without it,
# a missing server is an error that prints the install command.
set -euo pipefail

install=0
[ "${1:-}" = "--install" ] && install=1

say() { printf '>> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else die "need root for: $*"; fi
}

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

apt_install() {
  command -v apt-get >/dev/null || die "no apt-get here: install PostgreSQL (15+) and Redis (7+) with your OS package manager"
  say "installing $* from the OS packages"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# --- PostgreSQL -------------------------------------------------------------
if ! pg_up; then
  if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    [ "$install" = 1 ] || die "PostgreSQL is not installed. Install it: sudo apt-get install -y postgresql postgresql-client (or run ./scripts/services.sh --install)"
    apt_install postgresql postgresql-client
    fresh_pg=1
  fi
  version=$(ls /etc/postgresql | sort -V | tail -1)
  say "starting PostgreSQL $version"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
  for _ in $(seq 50); do pg_up && break; sleep 0.2; done
  pg_up || die "PostgreSQL $version did not start; see /var/log/postgresql/"
  if [ "${fresh_pg:-0}" = 1 ]; then
    # A fresh Debian cluster wants a password over TCP: give postgres the one
    # the defaults use (postgres://postgres:postgres@127.0.0.1:5432/postgres).
    as_root su postgres -c "psql -qXc \"ALTER USER postgres PASSWORD 'postgres'\"" >/dev/null
  fi
fi

# --- Redis ------------------------------------------------------------------
if ! redis_up; then
  if ! command -v redis-server >/dev/null; then
    [ "$install" = 1 ] || die "Redis is not installed. Install it: sudo apt-get install -y redis-server (or run ./scripts/services.sh --install)"
    apt_install redis-server
  fi
  say "starting Redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
  for _ in $(seq 50); do redis_up && break; sleep 0.1; done
  redis_up || die "Redis did not start"
fi
say "PostgreSQL and Redis are up"

# --- redis-py ----------------------------------------------------------------
# One integration test pushes through the proxy with a real Python client.
if command -v python3 >/dev/null && ! python3 -c 'import redis' 2>/dev/null; then
  say "installing redis-py (the Python client the proxy test uses)"
  python3 -m pip install -q redis 2>/dev/null \
    || python3 -m pip install -q --user redis 2>/dev/null \
    || python3 -m pip install -q --break-system-packages redis 2>/dev/null \
    || say "could not install redis-py; the redis-py proxy test will say it skipped"
fi
