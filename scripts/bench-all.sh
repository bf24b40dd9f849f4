#!/usr/bin/env bash
# Regenerate every table of docs/benchmarks.md in one series of runs (bench/tent_bench/bench_all.py).
# Run on a quiet machine, as root for the network-namespace fabrics (~25 minutes on 2 cores):
#   sudo scripts/bench-all.sh                 all steps, docs/benchmarks.md updated in place
#   scripts/bench-all.sh --list               the steps and their commands
#   scripts/bench-all.sh --only tcp,shm-cma   some of them
#   scripts/bench-all.sh --quick              smoke test: short runs, writes a copy of the document
# One failing step does not stop the others: its block in the document says why.
set -uo pipefail
cd "$(dirname "$0")/.."
exec "${PY:-.venv/bin/python}" -m tent_bench.bench_all "$@"
