#!/usr/bin/env bash
# The resilience and QoS tables of docs/benchmarks.md, in one scripted run (root: it builds network
# namespaces; ~3 minutes). Every fault scenario and every QoS variant runs once per round
# (ROUNDS, default 3; the order rotating), each figure reported as the median with its min-max.
# Re-runnable: every run builds its own fabric and tears it down, and overwrites the files in OUTDIR.
#   Usage: sudo scripts/bench-resilience.sh [--quick] [--json] [OUTDIR]
#   --quick: the shortened scenarios the tests run (bench/tests/test_resilience_fabric.py), one round
#   --json: print {"resilience": ..., "qos": [...]} (what scripts/bench-all.sh renders) instead of the tables
#   OUTDIR/resilience.json, resilience.md: every fault scenario (python -m tent_bench.resilience)
#   OUTDIR/qos.json, qos.md: 64 KiB HIGH mice beside 64 MiB LOW elephants, QoS off / on / on-always
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=()
JSON=0
ROUNDS=${ROUNDS:-3}
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=(--quick); ROUNDS=${QUICK_ROUNDS:-1}; shift ;;
        --json) JSON=1; shift ;;
        *) break ;;
    esac
done
OUT=${1:-/tmp/tent-resilience-bench}
mkdir -p "$OUT"
PY=.venv/bin/python
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
$PY -m tent_bench.resilience "${QUICK[@]}" --rounds "$ROUNDS" --json "$OUT/resilience.json" --markdown "$OUT/resilience.md"
.venv/bin/tent bench --fabric 4x1gbit --mixed --policy spray --rounds "$ROUNDS" "${QUICK[@]}" --json > "$OUT/qos.json"
$PY -c 'import json, sys; from tent_bench.fabric_bench import qos_markdown
sys.stdout.write(qos_markdown(json.load(open(sys.argv[1]))))' "$OUT/qos.json" > "$OUT/qos.md"
if [ "$JSON" = 1 ]; then
    $PY -c 'import json, sys
print(json.dumps({"resilience": json.load(open(sys.argv[1])), "qos": json.load(open(sys.argv[2]))}))' \
        "$OUT/resilience.json" "$OUT/qos.json"
    exit 0
fi
echo "## Resilience"
cat "$OUT/resilience.md"
echo
echo "## QoS"
cat "$OUT/qos.md"
echo "results in $OUT"
