"""Where a 64 MiB request's threads spend their time (not a test): per-thread scheduler accounting.

    python plugins/gds/tools/sched_probe.py READ|WRITE [--requests 128] [--block 64M]
        [--file PATH] [--config JSON]

One engine moves `--requests` requests of `--block` bytes one at a time (submit, wait) between
its memory and a file (made here, random bytes, unless --file), and reads each thread's
`/proc/self/task/*/schedstat` before and after: time on a CPU, time runnable but waiting for one
(other load on the cores), and the rest, asleep. The two busiest threads other than the caller's
are the executor's workers; their sleep per request is the time the request left them idle
(waiting for pieces, for the request's other pieces to finish, for the next submit). Load on the
machine moves the rate and the runnable time; the sleep moves much less.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

MiB = 1 << 20


def sched() -> dict[int, tuple[int, int]]:
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/schedstat") as f:
                on, delay = f.read().split()[:2]
            out[int(t)] = (int(on), int(delay))
        except OSError:  # the thread ended meanwhile
            pass
    return out


def main() -> None:
    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    ap = argparse.ArgumentParser()
    ap.add_argument("op", choices=["READ", "WRITE"])
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--block", default="64M")
    ap.add_argument("--file", default=None)
    ap.add_argument("--config", default=None, help="engine config, JSON")
    a = ap.parse_args()
    block = int(a.block[:-1]) * MiB if a.block[-1:].upper() == "M" else int(a.block)
    tmp = None
    path = a.file
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="gds-sched-", dir="/var/tmp")
        path = os.path.join(tmp.name, "data.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(block))
    try:
        with Engine(json.loads(a.config) if a.config else None, transports=["gds"]) as eng:
            eng.register_file(path, segment="f")
            local = eng.allocate(block, segment="l")
            reqs = [Request(OpCode[a.op], local, 0, eng.segment_name("f"), 0, block)]
            for _ in range(3):
                eng.submit(reqs).wait()
            s0, t0 = sched(), time.perf_counter_ns()
            for _ in range(a.requests):
                eng.submit(reqs).wait()
            wall, s1 = time.perf_counter_ns() - t0, sched()
        me = os.getpid()
        rows = sorted(((s1[t][0] - s0[t][0], s1[t][1] - s0[t][1], t) for t in s1 if t in s0), reverse=True)
        workers = [r for r in rows if r[2] != me][:2]
        main_on, main_delay = next((on, dl) for on, dl, t in rows if t == me)
        asleep = [1 - (on + dl) / wall for on, dl, _ in workers]
        print(json.dumps({
            "op": a.op, "block": block, "requests": a.requests,
            "gbps": round(a.requests * block / wall, 3),
            "cores_on_cpu": round(sum(r[0] for r in rows) / wall, 3),
            "workers_on_runnable_asleep_pct": [[round(100 * on / wall, 1), round(100 * dl / wall, 1), round(100 * s, 1)]
                                               for (on, dl, _), s in zip(workers, asleep, strict=True)],
            "caller_on_runnable_pct": [round(100 * main_on / wall, 1), round(100 * main_delay / wall, 1)],
            "worker_asleep_ms_per_request": round(sum(asleep) / len(asleep) * wall / a.requests / 1e6, 3),
        }))  # fmt: skip
    finally:
        if tmp:
            tmp.cleanup()


if __name__ == "__main__":
    main()
