"""Fine-grained interleaved A/B of shm settings in one process (not a test).

    python plugins/shm/bench/settings_ab.py '{"base": {}, "one": {"threads": 1}}' [--blocks 200]
        [--per 10] [--sizes 4M,64M] [--ops READ,WRITE] [--mode cma]

One engine per setting (the first is the reference), all alive at once in this process, against one
bench target. Blocks of `per` x 4 MiB (at least two requests) are timed one request at a time, the
settings taking turns block by block in rotating order, so a neighbour's burst on a shared machine
hits every setting alike; a round of whole-benchmark runs lasts tens of seconds, a block a few
milliseconds. Prints per setting the median and 90th percentile GB/s of its blocks and the median
(and interquartile range) of its per-block ratio to the reference's block next to it. Settings
are the shm transport's config keys; an executor's build cannot vary here (ab_builds.py does that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

MiB = 1 << 20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("settings", help='JSON: {"name": {shm config overrides}, ...}; the first is the reference')
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--per", type=int, default=10, help="4 MiB units per block")
    ap.add_argument("--sizes", default="4M,64M")
    ap.add_argument("--ops", default="READ,WRITE")
    ap.add_argument("--mode", default="cma")
    a = ap.parse_args()
    from tent_bench.cli import parse_size
    from tent_bench.runner import target_process

    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    settings: dict[str, dict] = json.loads(a.settings)
    names = list(settings)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    base = {"mode": a.mode}
    with target_process(max(sizes), config={"transports": {"shm": base}}) as target:
        engines = {}
        try:
            for name, over in settings.items():
                eng = Engine({"transports": {"shm": {**base, **over}}}, transports=["shm"])
                engines[name] = eng
            local = {k: e.allocate(max(sizes), segment=f"ab-{k}") for k, e in engines.items()}
            for buf in local.values():
                buf.array[:] = 1  # faulted in before timing
            for op in a.ops.upper().split(","):
                for size in sizes:
                    n = max(2, a.per * 4 * MiB // size)
                    reqs = {k: [Request(OpCode[op], local[k], 0, target["segment"], 0, size)] for k in names}
                    for k in names:
                        for _ in range(5):
                            engines[k].submit(reqs[k]).wait()
                    got: dict[str, list[float]] = {k: [] for k in names}
                    for i in range(a.blocks):
                        for k in names[i % len(names) :] + names[: i % len(names)]:
                            eng, r = engines[k], reqs[k]
                            t0 = time.perf_counter()
                            for _ in range(n):
                                eng.submit(r).wait()
                            got[k].append(n * size / (time.perf_counter() - t0) / 1e9)
                    for k in names:
                        ratio = [x / y for x, y in zip(got[k], got[names[0]], strict=True)]
                        q = statistics.quantiles(ratio, n=4)
                        print(f"{op} {size // MiB} MiB {k}: GB/s median {statistics.median(got[k]):.2f}, "
                              f"p90 {statistics.quantiles(got[k], n=10)[-1]:.2f}; x {names[0]} per block: median "
                              f"{statistics.median(ratio):.3f} (IQR {q[0]:.2f}-{q[2]:.2f}, {len(ratio)} blocks)", flush=True)  # fmt: skip
        finally:
            for eng in engines.values():
                eng.close()


if __name__ == "__main__":
    main()
