#!/usr/bin/env bash
# What authentication costs: 4 MiB and 64 MiB READ/WRITE over tcp and shm between two processes,
# with and without the cluster token, interleaved rounds in one run (bench/tent_bench/auth_cost.py).
# Prints the markdown table of docs/benchmarks.md; ROUNDS and BUDGET (seconds per point) tune it.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m tent_bench.auth_cost --sizes 4M,64M --transports tcp,shm \
    --rounds "${ROUNDS:-7}" --budget "${BUDGET:-0.6}" "$@"
