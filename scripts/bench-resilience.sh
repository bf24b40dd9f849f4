#!/usr/bin/env bash
# The resilience and QoS tables of docs/benchmarks.md, in one scripted run (root: it builds network
# namespaces; ~5 minutes, ~3 with --quick). Re-runnable: every run builds its own fabric and tears
# it down, and overwrites the files in OUTDIR.
#   Usage: sudo scripts/bench-resilience.sh [--quick] [OUTDIR]
#   --quick: the shortened scenarios the tests run (bench/tests/test_resilience_fabric.py)
#   OUTDIR/resilience.json, resilience.md: every fault scenario (python -m tent_bench.resilience)
#   OUTDIR/qos.json, qos.md: 64 KiB HIGH mice beside 64 MiB LOW elephants, QoS off / on / on-always
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=()
if [ "${1:-}" = "--quick" ]; then
    QUICK=(--quick)
    shift
fi
OUT=${1:-/tmp/tent-resilience-bench}
mkdir -p "$OUT"
PY=.venv/bin/python
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
$PY -m tent_bench.resilience "${QUICK[@]}" --json "$OUT/resilience.json" --markdown "$OUT/resilience.md"
.venv/bin/tent bench --fabric 4x1gbit --mixed --policy spray --json > "$OUT/qos.json"
$PY - "$OUT/qos.json" > "$OUT/qos.md" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r.get("kind") == "mixed"]
print("| QoS | mice completed | mice P50 ms | mice P99 ms | idle mice P50 ms | elephants Gbit/s | lone LOW flow Gbit/s | lone MID flow Gbit/s |")
print("|---|---|---|---|---|---|---|---|")
g = lambda x: "-" if x is None else f"{x:.3g}"
for r in rows:
    f = lambda us: "-" if us is None else f"{us / 1e3:.3g}"
    print(f"| {r['label']} | {r['mice_count']} | {f(r['mice_p50_us'])} | {f(r['mice_p99_us'])} | {f(r['mice_idle_p50_us'])} "
          f"| {g(r['elephant_gbit'])} | {g(r.get('lone_low_gbit'))} | {g(r.get('lone_mid_gbit'))} |")
PY
echo "## Resilience"
cat "$OUT/resilience.md"
echo
echo "## QoS"
cat "$OUT/qos.md"
echo "results in $OUT"
