#!/usr/bin/env bash
# Installs the version matrix of the Python fleet adapters: one virtual
# environment per release line of Celery (with its kombu and a redis-py it
# supports) and of RQ, under .matrix/<cell> (git-ignored), each from its
# exact pins in tests/python/matrix/<cell>.txt so a run repeats. psycopg is
# in every cell (the adapters' SQL reporting path). scripts/test-matrix runs
# the adapters' tests and the drill on every cell.
#
#   scripts/matrix-deps.sh            every cell
#   scripts/matrix-deps.sh rq-1.16    the cells named
#
# Idempotent and quick when everything is there already: a cell is
# reinstalled only when its pins changed (a stamp beside it).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '>> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

command -v python3 >/dev/null \
  || die "python3 is needed for the matrix (Debian: apt-get install -y python3 python3-venv)"
python3 -c 'import ensurepip, venv' 2>/dev/null \
  || die "python3's venv module is needed for the matrix (Debian: apt-get install -y python3-venv)"

pins=tests/python/matrix
if [ "$#" -gt 0 ]; then
  cells=("$@")
else
  cells=()
  for file in "$pins"/*.txt; do cells+=("$(basename "$file" .txt)"); done
fi

for cell in "${cells[@]}"; do
  req="$pins/$cell.txt"
  [ -f "$req" ] || die "no cell $cell: $req does not exist (cells: $(ls "$pins" | sed 's/\.txt$//' | tr '\n' ' '))"
  venv=".matrix/$cell"
  stamp="$venv/.installed"
  if [ -f "$stamp" ] && cmp -s "$req" "$stamp" && [ -x "$venv/bin/python" ]; then
    continue
  fi
  say "installing the $cell cell into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" || die "python3 -m venv $venv failed (Debian: apt-get install -y python3-venv)"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$req" \
    || die "pip could not install $req into $venv"
  # --no-deps installs exactly the pins; check pins nothing is missing from.
  "$venv/bin/python" -m pip check --disable-pip-version-check >/dev/null \
    || die "$req is incomplete: $("$venv/bin/python" -m pip check 2>&1 | head -1)"
  cp "$req" "$stamp"
done
