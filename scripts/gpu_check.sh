#!/usr/bin/env bash
# GPU check (needs a CUDA device): builds the nvlink and gds plugins, runs their tests (the CUDA
# ones included), then in the same run
#   - nvlink: two-process device<->device and host->device bandwidth against cudaMemcpy;
#   - gds: file -> GPU through our cuFile path against cuFile called directly and against
#     pread + host->device copy;
#   - accel (tent_bench.gpu_accel): host -> CUDA memory of another process through its target-side
#     staging over TCP (byte-exact, against the wire alone), a READ-only CUDA buffer reached through
#     staging rather than IPC, stream ordering on nvlink (wait for a producer's event, signal a
#     consumer), refhub CUDA tensors in direct and copy mode with on-GPU checksums;
#   - the core's accelerator tests (tests/test_accel_memory.py, test_ordering.py) on this machine.
# Prints one JSON line. SIZE (nvlink, e.g. 256M), GDS_SIZE (e.g. 1G), ITERS and GDS_DIR tune it.
# A machine that cannot reach PyPI needs the missing wheels carried in a folder named by WHEELS
# (prepare it with: pip download --only-binary=:all: --python-version 3.12 -d wheels pyzmq).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
cd "$ROOT"
PY=${PY:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=python3
LOG=${LOG:-$(mktemp -d "${TMPDIR:-/tmp}/tent-gpu-check.XXXXXX")}  # private to this run unless given
mkdir -p "$LOG"
if [ -n "${WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$WHEELS"/*.whl >"$LOG/wheels.log" 2>&1 ||
        { echo '{"ok": false, "stage": "wheels", "log": "'"$LOG"'/wheels.log"}'; exit 1; }
fi
# the core first: the plugins' setup.py build their executors with tent_core.build
{ "$PY" -m pip install -q --no-build-isolation -e . &&
    "$PY" -m pip install -q --no-build-isolation -e plugins/tcp -e plugins/shm -e plugins/nvlink -e plugins/gds \
        -e refhub -e bench; } >"$LOG/pip.log" 2>&1 ||
    { echo '{"ok": false, "stage": "install", "log": "'"$LOG"'/pip.log"}'; exit 1; }
(cd plugins/nvlink && "$PY" -m pytest -q tests) >"$LOG/nvlink_tests.log" 2>&1
NV_RC=$?
(cd plugins/gds && "$PY" -m pytest -q tests) >"$LOG/gds_tests.log" 2>&1
GDS_RC=$?
NV_BENCH=$("$PY" -m tent_nvlink.bench --size "${SIZE:-256M}" --iters "${ITERS:-10}" 2>"$LOG/nvlink_bench.err") || NV_BENCH='null'
"$PY" -m pytest -q tests/test_accel_memory.py tests/test_ordering.py >"$LOG/accel_tests.log" 2>&1
ACCEL_RC=$?
ACCEL=$("$PY" -m tent_bench.gpu_accel --size "${SIZE:-256M}" 2>"$LOG/accel.err") || ACCEL='null'
GDS_BENCH=$("$PY" -m tent_gds.gpu_bench --size "${GDS_SIZE:-1G}" --iters "${ITERS:-5}" --dir "${GDS_DIR:-/var/tmp}" \
    2>"$LOG/gds_bench.err") || GDS_BENCH='null'
"$PY" - "$NV_RC" "$(tail -1 "$LOG/nvlink_tests.log")" "${NV_BENCH:-null}" \
    "$GDS_RC" "$(tail -1 "$LOG/gds_tests.log")" "${GDS_BENCH:-null}" \
    "$ACCEL_RC" "$(tail -1 "$LOG/accel_tests.log")" "${ACCEL:-null}" <<'PYEOF'
import datetime, json, sys
nv_rc, nv_sum, nv_bench, gds_rc, gds_sum, gds_bench, ac_rc, ac_sum, ac = sys.argv[1:10]
nv, gds, accel = json.loads(nv_bench), json.loads(gds_bench), json.loads(ac)
ok = (int(nv_rc) == 0 and int(gds_rc) == 0 and int(ac_rc) == 0 and bool(nv and nv.get("ok"))
      and bool(gds and gds.get("ok")) and bool(accel and accel.get("ok")))
print(json.dumps({"ok": ok, "date": datetime.date.today().isoformat(),
                  "nvlink": {"tests_rc": int(nv_rc), "tests": nv_sum, "bandwidth": nv},
                  "gds": {"tests_rc": int(gds_rc), "tests": gds_sum, "cufile": gds},
                  "accel": {"tests_rc": int(ac_rc), "tests": ac_sum, "checks": accel}}))
PYEOF
