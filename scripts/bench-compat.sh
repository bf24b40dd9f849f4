#!/usr/bin/env bash
# Mooncake-compatible facade vs TENT's native API on the same engine (interleaved rounds, medians),
# next to the real Mooncake when it is installed (make bench-deps), at the best setting of its TCP knobs
# (swept first over the same points: lanes per peer, slice size, connection pool; the choice is reported).
# ROUNDS / DURATION / TUNE_DURATION (seconds per point and knob setting in the sweep) tune it.
# TENT is restricted to TCP here so all three move bytes over the same kind of path (Mooncake's
# non-CUDA wheel has only TCP on this host); drop --force-tcp to let TENT pick (shm on one host).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
extra=()
"$PY" -c 'import mooncake.engine' 2>/dev/null && extra+=(--mooncake)
"$PY" -m tent_bench.compat_facade --rounds "${ROUNDS:-7}" --duration "${DURATION:-0.5}" --force-tcp \
    --tune-duration "${TUNE_DURATION:-0.25}" "${extra[@]}" "$@"
