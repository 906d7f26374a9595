#!/usr/bin/env bash
# Installs what the benchmark commands compare against besides Postgres and
# Redis: twemproxy (Debian's nutcracker), the reference side of
# `qbridge bench proxy`, which refuses to run without it (or pass
# --without-twemproxy). Root with apt installs it; otherwise it says what to
# install and fails. Idempotent.
set -euo pipefail
have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ]; }
have nutcracker && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  printf '>> installing nutcracker (twemproxy, Debian package)\n' >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nutcracker >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nutcracker >/dev/null; }
fi
have nutcracker || { printf 'error: twemproxy is needed for bench proxy (Debian: apt-get install -y nutcracker)\n' >&2; exit 1; }
