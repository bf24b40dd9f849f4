#!/usr/bin/env bash
# Small transfers (64 KiB, 256 KiB) over shm, one process to another: the engine with and without
# the wait poll (wait_spin_us), next to bare process_vm_readv/writev (the physical path) in the
# same run. Prints one JSON line per setting. ITERS tunes it (default 1000).
set -euo pipefail
cd "$(dirname "$0")/.."
TENT=${TENT:-.venv/bin/tent}
for spin in 0 50; do
    TENT_WAIT_SPIN_US=$spin "$TENT" bench --transport shm --baseline cma --block-sizes 64K,256K \
        --iters "${ITERS:-1000}" --json 2>/dev/null | python3 -c "
import json, sys
rows = json.load(sys.stdin)
out = {'wait_spin_us': $spin}
for r in rows:
    if r.get('engine') == 'tent':
        k = f\"{r['op'].lower()}_{r['block_size'] >> 10}k\"
        out[k] = {'gbps': round(r['gbps'], 2), 'x_cma': r['x_cma'], 'p99_us': round(r['p99_us'], 1)}
print(json.dumps(out))"
done
