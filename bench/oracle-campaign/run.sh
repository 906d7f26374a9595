#!/usr/bin/env bash
# A long campaign of the randomized cutover oracle: SEEDS seeds from FIRST,
# split over PARALLEL processes (each walk starts its own throwaway Postgres
# and Redis, so they do not share servers), then one summary line.
#
#   bench/oracle-campaign/run.sh [SEEDS=1000] [PARALLEL=6] [FIRST=100] [STEPS=12]
#   (env: OUT=<results dir>, PATIENCE=<drain wait, default 90s>, BIN=<the
#   qbridge binary: a copy keeps a rebuild during the campaign out of it>)
#
# Writes each process's output to target/oracle-<date>/part-<n>.txt (its
# log to part-<n>.err), a
# failed content-hash seed's numbering rows to .../dumps/, and the summary to
# .../summary.txt. Uses $BIN, else target/release/qbridge when built, else
# target/debug.
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds=${1:-1000} parallel=${2:-6} first=${3:-100} steps=${4:-12}
bin=${BIN:-target/release/qbridge}
[ -x "$bin" ] || bin=target/debug/qbridge
out=${OUT:-target/oracle-$(date -u +%Y-%m-%d)}
mkdir -p "$out/dumps"
# Absolute, for the walks: $out as given when absolute, else under here.
case $out in /*) dumps=$out/dumps ;; *) dumps=$PWD/$out/dumps ;; esac
export QBRIDGE_CHAOS_DUMP_DIR="$dumps"
export DATABASE_URL=${DATABASE_URL:-postgres://postgres:postgres@127.0.0.1:5432/postgres}
per=$(( (seeds + parallel - 1) / parallel ))
pids=()
for ((p = 0; p < parallel; p++)); do
    start=$(( first + p * per ))
    n=$(( seeds - p * per < per ? seeds - p * per : per ))
    (( n > 0 )) || break
    "$bin" chaos --scenario cutover-random --seeds "$n" --seed "$start" --steps "$steps" \
        --rate 40 --patience "${PATIENCE:-90s}" >"$out/part-$p.txt" 2>"$out/part-$p.err" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
{
    echo "campaign: $seeds seeds from $first, $steps steps each, $parallel processes, $bin"
    grep -h '^seed ' "$out"/part-*.txt | awk '{n++; if ($NF != "ok") f++} END {print n " seeds run, " f+0 " failed"}'
    # A process without its closing line ended on an error (not a failed
    # seed: e.g. its servers would not start): its remaining seeds did not run.
    for ((p = 0; p < ${#pids[@]}; p++)); do
        grep -q 'acknowledged jobs' "$out/part-$p.txt" ||
            echo "process $p ended early: $(tail -n 1 "$out/part-$p.err")"
    done
    grep -h '^seed ' "$out"/part-*.txt | grep -v ': ok$' || true
    grep -h 'acknowledged jobs' "$out"/part-*.txt
} | tee "$out/summary.txt"
exit $status
