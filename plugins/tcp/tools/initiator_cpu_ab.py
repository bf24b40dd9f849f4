"""Initiator CPU per tcp request one at a time, two trees interleaved (not a test).

    python plugins/tcp/tools/initiator_cpu_ab.py --other TREE [--pairs 6] [--count 20000]
        [--block 64K] [--op READ] [--config JSON]

Wall-clock rates of one request at a time swing by tens of % between runs on a shared host; the
CPU time of the submitting thread per request (CLOCK_THREAD_CPUTIME_ID: user and kernel, its own
system calls included) moves far less, and it is where the engine's own work per request shows.
Each run starts a target process (`tent_bench.small_target`) and an initiator engine in a child
of the tree's `.venv/bin/python`, times `count` requests of `submit().wait()`, of `run()` and of
the bare C loop (`tent_bench._bare`, the same thread) in that order, and reports the CPU and wall
microseconds per request of each; the trees' runs alternate (this, other, other, this, ...).
Busy polling is off by default (`{"transports": {"tcp": {"busy_poll_us": 0}}}`, both ends of the
bare loop too): a spin's length depends on timing and would enter the CPU figure. Prints per pair
and the medians (lowest-highest) per tree, and this tree minus the other, paired by run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
from tent_bench.small import target, engine_loop, run_loop, _bare_one, _verify, OPS
from tent_core import Engine, Request
block, op, count, cfg = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
with target(block, cfg) as t, Engine(cfg, transports=["tcp"]) as eng:
    local = eng.allocate(block, segment="cpu-ab-local")
    _verify(eng, local, t.segment, block, t.seed)
    reqs = [Request(OPS[op], local, 0, t.segment, 0, block)]
    engine_loop(eng, reqs, count // 10)
    run_loop(eng, reqs, count // 10)
    bare = _bare_one(eng, t, "tcp", op, block, count, local.addr)
    bare()
    out = {}
    for name, fn in (("wait", lambda: engine_loop(eng, reqs, count)), ("run", lambda: run_loop(eng, reqs, count)),
                     ("bare", bare)):
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        fn()
        out[name] = {"cpu_us": (time.thread_time_ns() - c0) / count / 1e3,
                     "wall_us": (time.perf_counter_ns() - w0) / count / 1e3}
    print(json.dumps(out))
"""


def _size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def _run(tree: str, block: int, op: str, count: int, config: str) -> dict[str, dict[str, float]]:
    py = os.path.join(tree, ".venv", "bin", "python")
    out = subprocess.run([py, "-c", CHILD, str(block), op, str(count), config], cwd=tree, capture_output=True, text=True,
                         timeout=900, check=True)  # fmt: skip
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _med(v: list[float]) -> str:
    return f"{statistics.median(v):.2f} ({min(v):.2f} to {max(v):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", required=True, help="the other tree (its .venv built by make install)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--count", type=int, default=20000)
    ap.add_argument("--block", default="64K")
    ap.add_argument("--op", choices=("READ", "WRITE"), default="READ")
    ap.add_argument("--config", default=json.dumps({"transports": {"tcp": {"busy_poll_us": 0}}}))
    a = ap.parse_args()
    trees = {"this": os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")),
             "other": os.path.abspath(a.other)}  # fmt: skip
    res: dict[str, list[dict[str, dict[str, float]]]] = {"this": [], "other": []}
    for p in range(a.pairs):
        for name in ("this", "other") if p % 2 == 0 else ("other", "this"):
            r = _run(trees[name], _size(a.block), a.op, a.count, a.config)
            res[name].append(r)
            cells = ", ".join(f"{k} cpu {v['cpu_us']:.2f} wall {v['wall_us']:.2f}" for k, v in r.items())
            print(f"pair {p} {name:5}: {cells}", flush=True)
    print(f"\n{a.op} {a.block}, {a.count} requests a loop, {a.pairs} pairs; us per request, median (lowest to highest)")
    for loop in ("wait", "run", "bare"):
        for what in ("cpu_us", "wall_us"):
            this = [r[loop][what] for r in res["this"]]
            other = [r[loop][what] for r in res["other"]]
            diff = [x - y for x, y in zip(this, other, strict=True)]
            print(f"{loop:4} {what:7}: this {_med(this)}, other {_med(other)}, this - other {_med(diff)}, "
                  f"this lower in {sum(d < 0 for d in diff)} of {len(diff)}")  # fmt: skip
        for what in ("cpu_us", "wall_us"):
            if loop == "bare":
                continue
            over = {n: [r[loop][what] - r["bare"][what] for r in res[n]] for n in res}
            print(f"{loop:4} {what:7} above the bare loop: this {_med(over['this'])}, other {_med(over['other'])}")


if __name__ == "__main__":
    sys.exit(main())
