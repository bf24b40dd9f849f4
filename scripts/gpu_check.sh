#!/usr/bin/env bash
# GPU check for the nvlink transport (needs a CUDA device; meant for scripts/gpu_check.sh).
# Builds the plugin, runs its tests (CUDA ones included) and a two-process device<->device
# and host->device bandwidth check against cudaMemcpy in the same run. Prints one JSON line.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
cd "$ROOT"
PY=${PY:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
NV=plugins/nvlink
[ -d "$NV" ] || NV=$(dirname "$0")
"$PY" -m pip install -q --no-build-isolation -e "$NV" >/tmp/nvlink_pip.log 2>&1 || { echo '{"ok": false, "stage": "install"}'; exit 1; }
(cd "$NV" && "$PY" -m pytest -q tests) >/tmp/nvlink_tests.log 2>&1
TESTS_RC=$?
TESTS_SUMMARY=$(tail -1 /tmp/nvlink_tests.log)
BENCH=$("$PY" -m tent_nvlink.bench --size "${SIZE:-256M}" --iters "${ITERS:-10}" 2>/tmp/nvlink_bench.err) || BENCH='null'
[ -n "$BENCH" ] || BENCH='null'
"$PY" - "$TESTS_RC" "$TESTS_SUMMARY" "$BENCH" <<'PYEOF'
import json, sys
rc, summary, bench = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
print(json.dumps({"ok": rc == 0 and bench is not None, "tests_rc": rc, "tests": summary, "bandwidth": bench}))
PYEOF
