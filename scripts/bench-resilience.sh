#!/usr/bin/env bash
# The resilience and QoS tables of docs/benchmarks.md, in one scripted run (root: it builds network
# namespaces; ~5 minutes). Usage: sudo scripts/bench-resilience.sh [OUTDIR]
#   OUTDIR/resilience.json, resilience.md: every fault scenario (python -m tent_bench.resilience)
#   OUTDIR/qos.json: 64 KiB HIGH mice beside 64 MiB LOW elephants, QoS off / on / on-always
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/tent-resilience-bench}
mkdir -p "$OUT"
PY=.venv/bin/python
[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
$PY -m tent_bench.resilience --json "$OUT/resilience.json" --markdown "$OUT/resilience.md"
.venv/bin/tent bench --fabric 4x1gbit --mixed --policy spray --json > "$OUT/qos.json"
cat "$OUT/resilience.md"
$PY - "$OUT/qos.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1])) if r.get("kind") == "mixed"]
print("| QoS | mice completed | mice P50 ms | mice P99 ms | idle mice P50 ms | elephants Gbit/s | lone LOW flow Gbit/s | lone MID flow Gbit/s |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    f = lambda us: "-" if us is None else f"{us / 1e3:.3g}"
    print(f"| {r['label']} | {r['mice_count']} | {f(r['mice_p50_us'])} | {f(r['mice_p99_us'])} | {f(r['mice_idle_p50_us'])} "
          f"| {r['elephant_gbit']:.3g} | {r.get('lone_low_gbit') or '-'} | {r.get('lone_mid_gbit') or '-'} |")
PY
echo "results in $OUT"
