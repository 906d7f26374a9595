#!/usr/bin/env bash
# Driver for the shared peer harness (../shared/bench/peers/run-all.sh):
#   EXTRA_PEERS="qbridge=$PWD/bench/peer-driver/run.sh {DB} {N} {W}" ../shared/bench/peers/run-all.sh
# Prints the harness's `RESULT {json}` line for one burn-down run.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
bin=${QBRIDGE_BIN:-$here/target/release/qbridge}
[ -x "$bin" ] || (cd "$here" && cargo build --release -q)
RUST_LOG=warn exec "$bin" bench burndown --database-url "$1" --jobs "$2" --workers "$3" --peer-result
