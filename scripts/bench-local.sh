#!/usr/bin/env bash
# The same-host benchmarks of docs/benchmarks.md (3 interleaved rounds each, ~8 minutes; scripts/bench-all.sh
# regenerates the document). Needs `make bench-deps`
# for the Mooncake baseline. Usage: scripts/bench-local.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d "${TMPDIR:-/tmp}/tent-local-bench.XXXXXX")}  # private to this run unless given
mkdir -p "$OUT"
T=".venv/bin/tent bench --json"
$T --transport tcp --block-sizes 4M,64M --iters 100 --baseline socket,mooncake         > "$OUT/tcp.json"
$T --transport shm --block-sizes 4M,64M --iters 40 --baseline cma                     > "$OUT/shm-cma.json"
$T --transport shm --block-sizes 4M,64M --iters 40 --baseline memcpy \
   --config '{"transports": {"shm": {"mode": "memfd"}}}'                               > "$OUT/shm-memfd.json"
$T --transport tcp --block-sizes 64K --iters 200 --ops WRITE --submit-cost             > "$OUT/submit.json"
$T --transport gds --block-sizes 1M,64M --iters 40 --min-bytes 4G --rounds 5 --baseline fio > "$OUT/gds-fio.json"
$T --path file:tcp --block-sizes 64M --iters 20                                        > "$OUT/path-buffered.json"
$T --path file:tcp --block-sizes 64M --iters 20 \
   --config '{"transports": {"gds": {"direct": 1}}}'                                   > "$OUT/path-direct.json"
echo "results in $OUT"
