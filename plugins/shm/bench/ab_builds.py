"""Interleaved A/B of two (or more) checkouts of the engine on shm requests (not a test).

    python plugins/shm/bench/ab_builds.py [--rounds 8] [--blocks 4M,64M] [--ops READ,WRITE]
        [--bytes 1G] [--config JSON] CHECKOUT [CHECKOUT ...]

Each CHECKOUT is a source tree with its own `.venv` (`make install` there; e.g. `git archive
<commit> | tar -x -C /tmp/before` for an older commit). Every round starts, for each checkout in
rotating order, a fresh process under that checkout's Python: it starts a bench target (a second
process, its buffer pattern-filled), checks the bytes of one READ, then times one request at a
time at every (op, block) point until `--bytes` have moved, recording the wall time and the CPU
time of its own process (every thread: the submitting thread and the executor's workers; in
CMA mode the copies run in this process). Prints per checkout and point the median GB/s and
CPU seconds per GB with their spread, and the median of the per-round ratios to the first
checkout: on a loaded, shared machine the ratio within a round and the CPU per GB are what
count. Default config: CMA mode (`{"transports": {"shm": {"mode": "cma"}}}`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

MiB = 1 << 20
CMA = {"transports": {"shm": {"mode": "cma"}}}


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def measure(blocks: list[int], ops: list[str], nbytes: int, config: dict) -> list[dict]:
    """In the checkout's own Python: one engine, one target, every point timed."""
    import time

    import numpy as np
    from tent_bench.runner import target_process

    from tent_core.engine import Engine, Request
    from tent_core.testing import pattern
    from tent_core.types import OpCode

    size = max(blocks)
    rows = []
    with target_process(size, config=config) as target, Engine(config, transports=["shm"]) as eng:
        local = eng.allocate(size, segment="ab-local")
        n = min(size, 8 * MiB)
        local.array[:n] = 0
        eng.submit([Request(OpCode.READ, local, 0, target["segment"], 0, n)]).wait()
        if not np.array_equal(local.array[:n], pattern(n, target["seed"])):
            raise SystemExit("A/B: the shm READ returned wrong bytes")
        for op in ops:
            for block in blocks:
                reqs = [Request(OpCode[op], local, 0, target["segment"], 0, block)]
                for _ in range(3):
                    eng.submit(reqs).wait()
                count = max(3, -(-nbytes // block))
                cpu0, t0 = time.process_time(), time.perf_counter()
                for _ in range(count):
                    eng.submit(reqs).wait()
                wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                moved = count * block
                rows.append({"op": op, "block": block, "gbps": moved / wall / 1e9, "cpu_s_per_gb": cpu / (moved / 1e9)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--blocks", default="4M,64M")
    ap.add_argument("--ops", default="READ,WRITE")
    ap.add_argument("--bytes", default="1G", help="bytes per point and run")
    ap.add_argument("--config", default=json.dumps(CMA))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("checkouts", nargs="*")
    a = ap.parse_args()
    blocks = [parse_size(b) for b in a.blocks.split(",")]
    ops = [o.upper() for o in a.ops.split(",")]
    if a.child:
        print(json.dumps(measure(blocks, ops, parse_size(a.bytes), json.loads(a.config))), flush=True)
        return
    if not a.checkouts:
        ap.error("name at least one checkout")
    names = [os.path.abspath(c) for c in a.checkouts]
    got: dict[str, list[list[dict]]] = {c: [] for c in names}
    for r in range(a.rounds):
        for c in names[r % len(names):] + names[: r % len(names)]:
            argv = [os.path.join(c, ".venv/bin/python"), os.path.abspath(__file__), "--child", "--blocks", a.blocks,
                    "--ops", a.ops, "--bytes", a.bytes, "--config", a.config]  # fmt: skip
            out = subprocess.run(argv, cwd=c, capture_output=True, text=True, timeout=900)
            if out.returncode != 0:
                raise SystemExit(f"{c}: {out.stderr[-2000:]}")
            got[c].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    first = names[0]
    for i, point in enumerate((op, b) for op in ops for b in blocks):
        print(f"{point[0]} {point[1] // MiB} MiB")
        for c in names:
            g = [run[i]["gbps"] for run in got[c]]
            cpu = [run[i]["cpu_s_per_gb"] for run in got[c]]
            ratio = [x / y for x, y in zip(g, (run[i]["gbps"] for run in got[first]), strict=True)]
            cratio = [x / y for x, y in zip(cpu, (run[i]["cpu_s_per_gb"] for run in got[first]), strict=True)]
            print(f"  {c}: {statistics.median(g):.2f} GB/s ({min(g):.2f}-{max(g):.2f}), "
                  f"CPU {statistics.median(cpu):.3f} s/GB ({min(cpu):.3f}-{max(cpu):.3f}); per-round x first: "
                  f"GB/s {statistics.median(ratio):.3f} ({min(ratio):.2f}-{max(ratio):.2f}), "
                  f"CPU/GB {statistics.median(cratio):.3f} ({min(cratio):.2f}-{max(cratio):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
