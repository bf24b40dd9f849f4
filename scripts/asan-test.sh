#!/usr/bin/env bash
# Run pytest against an AddressSanitizer build of every compiled part (tent_core's extensions, the
# plugins' executors, tent-bench's helpers), for memory errors in our C: use after free, double
# free, overruns. The first bad access aborts the run with its stack and the allocation and free
# stacks of the memory; each report is printed at the end and fails the run.
#
#   ./scripts/asan-test.sh tests/test_simdev_lifetime.py tests/test_ordering.py    (or: make asan ARGS=...)
#
# The tracked sources are copied to $TENT_ASAN_DIR (default build/asan: ignored by git) and built
# there in place, so the normal build in the tree stays as it is and a rebuild recompiles only what
# changed; the tests run from that copy with the project's virtual environment ($VENV, default .venv:
# `make install` first). The interpreter itself is not instrumented: libasan is preloaded.
# The copy comes first on PYTHONPATH (inherited by the processes the tests start), so tests about
# where an installed package lives (tests/test_packaging.py) fail here by design: leave them out.
# Leak checking is off (CPython's own allocations would drown the report); TENT_ASAN_OPTIONS adds to
# ASAN_OPTIONS.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PY=$VENV/bin/python
DIR=${TENT_ASAN_DIR:-$ROOT/build/asan}
TREE=$DIR/tree
LOGS=$DIR/logs
[ -x "$PY" ] || { echo "asan-test: $PY missing: run make install first" >&2; exit 2; }
LIBASAN=$(${CC:-gcc} -print-file-name=libasan.so)
[ -e "$LIBASAN" ] || { echo "asan-test: libasan not found (gcc with AddressSanitizer needed)" >&2; exit 2; }

echo "==> copying the tracked sources to $TREE"
mkdir -p "$TREE" "$LOGS"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp -p -u --parents -t "$TREE" 2>/dev/null) || true

export CFLAGS="-fsanitize=address -fno-omit-frame-pointer -g -O1"
export LDFLAGS="-fsanitize=address"
build() { # in place: the extension lands next to its package, where the loaders look
  (cd "$1" && "$PY" setup.py -q build_ext --inplace >"$LOGS/build-$(basename "$1").log" 2>&1) ||
    { echo "asan-test: building $1 failed (see $LOGS/build-$(basename "$1").log)" >&2; exit 2; }
}
echo "==> building with AddressSanitizer"
build "$TREE"
for d in "$TREE"/plugins/*/ "$TREE/bench"; do
  [ -f "$d/setup.py" ] && build "$d"
done

PYPATH=$TREE:$TREE/refhub:$TREE/bench
for d in "$TREE"/plugins/*/; do PYPATH=$PYPATH:${d%/}; done
rm -f "$LOGS"/asan.*
echo "==> pytest under AddressSanitizer: $*"
set +e
(cd "$TREE" && PYTHONPATH=$PYPATH LD_PRELOAD=$LIBASAN \
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$LOGS/asan:${TENT_ASAN_OPTIONS:-}" \
  "$PY" -m pytest -p no:cacheprovider "$@")
rc=$?
set -e
reports=$(ls "$LOGS"/asan.* 2>/dev/null || true)
if [ -n "$reports" ]; then
  for f in $reports; do echo "==> AddressSanitizer report $f"; cat "$f"; done
  echo "asan-test: AddressSanitizer reported memory errors (pytest rc=$rc)" >&2
  exit 1
fi
exit $rc
