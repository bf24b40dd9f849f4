#!/usr/bin/env bash
# The KV-cache regime (issue 17) and the same-host gaps of issue 14, in one go (~4 minutes on two
# cores): small requests one at a time and in batches next to their bare C limits, shm requests
# of 4 and 64 MiB against two threads copying 1 MiB pieces, two engines in one process, segments
# of 10,000 buffers, the QoS tail, the cost of submit(), and 64 KiB mice over two tcp rails
# (multi_rail_mice; BASE=<a tent-core tree, e.g. main's, built in place> runs it beside this one).
# Engine and limit run interleaved, ROUNDS rounds (default 5), median and spread. Writes small.json
# and small.md (the tables of docs/benchmarks.md) and submit.json into OUTDIR. The tcp rows of
# one_at_a_time and batches are timed by the clock instead (TCP_SECONDS per loop after an untimed
# warm-up, TCP_ROUNDS rounds: tcp's loops moved 64 MiB in 10-30 ms, and its rows moved more between
# runs than their margins); ~1 minute.
# Usage: scripts/bench-small.sh [OUTDIR]
#   (ROUNDS=5 BUDGET=64M TRANSPORTS=shm,tcp TCP_SECONDS=0.3 TCP_ROUNDS=9 BASE=<tree>)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/tent-small-bench}
mkdir -p "$OUT"
PY=.venv/bin/python
$PY -m tent_bench.small --rounds "${ROUNDS:-5}" --budget "${BUDGET:-64M}" --transports "${TRANSPORTS:-shm,tcp}" \
    --tcp-seconds "${TCP_SECONDS:-0.3}" --tcp-rounds "${TCP_ROUNDS:-9}" ${BASE:+--base "$BASE"} --json > "$OUT/small.json"
$PY -c "import json, sys; from tent_bench import small; d = json.load(open(sys.argv[1])); print(small.markdown(d['rows']))" \
    "$OUT/small.json" > "$OUT/small.md"
# submit() call to return, 200 queued before any wait (issue 14's "queued median"); three runs
for i in 1 2 3; do
    .venv/bin/tent bench --json --transport tcp --block-sizes 64K --iters 200 --ops WRITE --submit-cost 2>/dev/null |
        $PY -c "import json, sys; print(json.dumps([r for r in json.load(sys.stdin) if r.get('kind') == 'submit_cost'][0]))"
done > "$OUT/submit.json"
cat "$OUT/small.md" "$OUT/submit.json"
$PY -c "import json, sys; from tent_bench import small; print(); print('- ' + small.submit_target([json.loads(x) for x in open(sys.argv[1]) if x.strip()]))" \
    "$OUT/submit.json"
echo "results in $OUT"
