#!/usr/bin/env bash
# Installs what the integration tests drive besides Postgres and Redis:
# Sidekiq 6.4 (Debian's ruby-sidekiq, with ruby-gitlab-sidekiq-fetcher and
# ruby-redis-namespace) and what the vendored Sidekiq 7 needs (ruby-rack,
# ruby-concurrent), chromium with chromedriver (the
# console's browser tests), pgbouncer and redis-sentinel and the Python framework clients
# (Celery with kombu's Redis transport, RQ, redis-py) into a virtual
# environment at .venv, from PyPI, pinned in
# tests/python/requirements.txt. Tests run them from there
# (tests/it/support.rs: `python()`), and fail with this script's name when it
# is missing: a missing client is an install step, never a skipped test.
# Idempotent and quick when everything is there already.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '>> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Debian packages this needs, installed when missing and we may (root, apt).
apt_install() {
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing $* (Debian packages)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null; }
  else
    return 1
  fi
}

command -v python3 >/dev/null || apt_install python3 python3-venv \
  || die "python3 is needed for the framework tests (Debian: apt-get install -y python3 python3-venv)"
python3 -c 'import ensurepip, venv' 2>/dev/null || apt_install python3-venv \
  || die "python3's venv module is needed (Debian: apt-get install -y python3-venv)"
# Sidekiq 6.4 from Debian for the Sidekiq tests (tests/ruby/*.rb).
ruby -e 'require "sidekiq"' >/dev/null 2>&1 || apt_install ruby-sidekiq \
  || die "Ruby with Sidekiq is needed for the Sidekiq tests (Debian: apt-get install -y ruby-sidekiq)"
# gitlab-sidekiq-fetcher, a real reliable fetch (private lists per worker),
# for the structures qbridge counts (tests/ruby/sidekiq_reliable_fetch.rb)
# and the survey (tests/it/survey.rs), and redis-namespace for the survey's
# namespaced Sidekiq.
ruby -e 'require "sidekiq-reliable-fetch"' >/dev/null 2>&1 || apt_install ruby-gitlab-sidekiq-fetcher \
  || die "gitlab-sidekiq-fetcher is needed for the reliable fetch tests (Debian: apt-get install -y ruby-gitlab-sidekiq-fetcher)"
ruby -e 'require "redis-namespace"' >/dev/null 2>&1 || apt_install ruby-redis-namespace \
  || die "redis-namespace is needed for the survey tests (Debian: apt-get install -y ruby-redis-namespace)"
# Sidekiq 7.3.10 itself is vendored (vendor/ruby); the two libraries it
# needs that it does not bring come from Debian.
ruby -e 'require "rack"; require "concurrent"' >/dev/null 2>&1 || apt_install ruby-rack ruby-concurrent \
  || die "Ruby's rack and concurrent-ruby are needed for the Sidekiq 7 tests (Debian: apt-get install -y ruby-rack ruby-concurrent)"
# The pg gem for the Sidekiq adapter's SQL reporting path (adapters/ruby).
ruby -e 'require "pg"' >/dev/null 2>&1 || apt_install ruby-pg \
  || die "Ruby's pg gem is needed for the Sidekiq adapter's tests (Debian: apt-get install -y ruby-pg)"
# Chromium and its WebDriver for the console's browser tests
# (tests/it/console/webdriver.rs).
{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } \
  || apt_install chromium chromium-driver \
  || die "chromium and chromedriver are needed for the console tests (Debian: apt-get install -y chromium chromium-driver)"
# PgBouncer (transaction-mode pooler tests: tests/it/pooler.rs and the fault
# suite's --via-pgbouncer runs) and Redis Sentinel (tests/it/sentinel.rs).
command -v pgbouncer >/dev/null || apt_install pgbouncer \
  || die "pgbouncer is needed for the pooler tests (Debian: apt-get install -y pgbouncer)"
command -v redis-sentinel >/dev/null || apt_install redis-sentinel \
  || die "redis-sentinel is needed for the Sentinel tests (Debian: apt-get install -y redis-sentinel)"
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

# Cells of the framework version matrix the suite runs besides .venv's
# newest lines (tests/it/support.rs: `matrix_python`): RQ 2.12, whose
# scheduling differs from 3.0's. scripts/matrix-deps.sh installs them.
./scripts/matrix-deps.sh rq-2.12
