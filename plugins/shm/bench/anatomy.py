"""Anatomy of one-at-a-time shm requests (not a test): where a request's wall time goes.

    python plugins/shm/bench/anatomy.py [--blocks 1M,4M] [--ops READ,WRITE] [--count 2000] [--config JSON]

One engine, one bench target (CMA mode by default), `count` requests of each (op, block) submitted
one at a time. Prints per point: the P50 of submit() and of wait() (a request the executor
finishes inside submit returns done), the submitting thread's own CPU per request (its copies,
and its polling for the workers' last pieces; far below the wall time means it slept or was
preempted while workers copied), and per thread of this process the voluntary and involuntary
context switches per request (from /proc/self/task/*/status: the executor's workers' wake-ups).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import time

MiB = 1 << 20
CMA = {"transports": {"shm": {"mode": "cma"}}}


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def switches() -> dict[str, tuple[int, int]]:
    """Per thread id of this process: (voluntary, involuntary) context switches so far."""
    out = {}
    for path in glob.glob("/proc/self/task/*/status"):
        v = n = 0
        try:
            with open(path) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        v = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        n = int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            continue
        out[path.split("/")[4]] = (v, n)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", default="1M,4M")
    ap.add_argument("--ops", default="READ,WRITE")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--config", default=json.dumps(CMA))
    a = ap.parse_args()
    import threading

    from tent_bench.runner import target_process

    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    config = json.loads(a.config)
    blocks = [parse_size(b) for b in a.blocks.split(",")]
    me = str(threading.get_native_id())
    with target_process(max(blocks), config=config) as target, Engine(config, transports=["shm"]) as eng:
        local = eng.allocate(max(blocks), segment="anatomy-local")
        local.array[:] = 1  # faulted in before timing
        for op in a.ops.upper().split(","):
            for block in blocks:
                reqs = [Request(OpCode[op], local, 0, target["segment"], 0, block)]
                for _ in range(50):
                    eng.submit(reqs).wait()
                sub, wait, tot, cpu = [], [], [], []
                s0 = switches()
                for _ in range(a.count):
                    c0, t0 = time.thread_time(), time.perf_counter()
                    h = eng.submit(reqs)
                    t1 = time.perf_counter()
                    h.wait()
                    t2 = time.perf_counter()
                    cpu.append(time.thread_time() - c0)
                    sub.append(t1 - t0)
                    wait.append(t2 - t1)
                    tot.append(t2 - t0)
                s1 = switches()
                per = {("caller" if k == me else k): ((s1[k][0] - s0[k][0]) / a.count, (s1[k][1] - s0[k][1]) / a.count)
                       for k in s1 if k in s0}  # fmt: skip
                busy = {k: f"{v:.2f}/{n:.2f}" for k, (v, n) in per.items() if k == "caller" or v + n >= 0.02}
                med = statistics.median
                print(f"{op} {block // MiB} MiB: P50 {med(tot) * 1e6:.0f} us ({block / med(tot) / 1e9:.1f} GB/s), "
                      f"submit {med(sub) * 1e6:.0f} us, wait {med(wait) * 1e6:.1f} us, caller CPU {med(cpu) * 1e6:.0f} us; "
                      f"switches per request (voluntary/involuntary) by thread: {busy}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
