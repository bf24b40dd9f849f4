#!/usr/bin/env bash
# The multi-rail spraying benchmarks and fault timelines of docs/benchmarks.md (root; ~5 minutes);
# the QoS and resilience tables come from scripts/bench-resilience.sh.
# Usage: scripts/bench-fabric.sh [OUTDIR]   (JSON per run in OUTDIR, timelines in docs/)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d "${TMPDIR:-/tmp}/tent-fabric-bench.XXXXXX")}  # private to this run unless given
mkdir -p "$OUT"
T=".venv/bin/tent bench --fabric 4x1gbit --json"
$T --policy spray,round_robin --block-sizes 1M,64M                          > "$OUT/equal.json"
$T --degrade 3:0.5 --policy spray,round_robin --block-sizes 1M,64M \
   --timeline docs/timeline-degraded.png                                   > "$OUT/degraded.json"
$T --degrade 3:0.5 --policy spray,round_robin --block-sizes 64M --offered-load 0.8,1.2,1.6 --seeds 3 > "$OUT/degraded-open.json"
$T --mixed --policy spray                                                  > "$OUT/mixed.json"
$T --fault "down 0 at 1s; up 0 at 3s" --duration 5 --timeline docs/timeline-down-up.png > "$OUT/down-up.json"
$T --fault "degrade 2:0.5 at 1s; restore 2 at 3s" --duration 5 --timeline docs/timeline-degrade.png > "$OUT/degrade.json"
$T --fault "flap 1 every 300ms from 1s until 11s" --duration 12 --timeline docs/timeline-flap.png > "$OUT/flap.json"
echo "results in $OUT"
