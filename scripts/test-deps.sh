#!/usr/bin/env bash
# Installs what the integration tests drive besides Postgres and Redis:
# the real framework clients (Celery with kombu's Redis transport, RQ,
# redis-py) into a virtual environment at .venv, from PyPI, pinned in
# tests/python/requirements.txt. Tests run them from there
# (tests/it/support.rs: `python()`), and fail with this script's name when it
# is missing: a missing client is an install step, never a skipped test.
# Idempotent and quick when everything is there already.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '>> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null || die "python3 is needed for the framework tests (Debian: apt-get install -y python3 python3-venv)"
req=tests/python/requirements.txt
stamp=.venv/.installed
if [ ! -x .venv/bin/python ]; then
  say "creating .venv for the framework clients"
  python3 -m venv .venv || die "python3 -m venv failed (Debian: apt-get install -y python3-venv)"
fi
if [ ! -f "$stamp" ] || ! cmp -s "$req" "$stamp"; then
  say "installing the framework clients into .venv ($(grep -cv '^#' "$req") packages)"
  .venv/bin/python -m pip install -q --disable-pip-version-check -r "$req"
  cp "$req" "$stamp"
fi
