"""The two call forms side by side in one process: `submit(reqs).wait()` and `Engine.run(reqs)`.

One shm request in flight, to a target process (`tent_bench.small_target`), the forms alternating
every `--block` requests (the order flipping each time), so drift and neighbours hit both alike;
each form's per-request latency is timed like `small`'s loops, and the medians and their
difference are printed per size. What `submit().wait()` costs beyond `run()` (the handle, the
`wait` call) is what the difference shows; a diagnosis tool, not a step of the series.

    python -m tent_bench.call_forms --op WRITE --sizes 64K,256K --blocks 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from tent_core import Engine, Request

from .small import OPS, target

KiB = 1024


def _size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": KiB, "M": KiB * KiB}.get(t[-1:], 1)
    n = int(t[:-1] if t[-1:] in "KM" else t) * mult
    if n <= 0:
        raise argparse.ArgumentTypeError(f"size must be > 0, got {text!r}")
    return n


def compare(op: str, sizes: list[int], blocks: int, per_block: int = 50,
            config: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Per size: median per-request latency (ns) of each form, alternating every `per_block`."""
    if op not in OPS:
        raise ValueError(f"op must be one of {sorted(OPS)}, got {op!r}")
    if blocks < 1 or per_block < 1 or not sizes:
        raise ValueError("blocks and per_block must be >= 1, and sizes not empty")
    rows = []
    with target(max(sizes), config) as t, Engine(config, transports=["shm"]) as eng:
        local = eng.allocate(max(sizes), segment="call-forms")
        for size in sizes:
            reqs = [Request(OPS[op], local, 0, t.segment, 0, size)]
            submit, run, clock = eng.submit, eng.run, time.perf_counter
            for _ in range(20):  # warm: the plan is cached, the pages touched
                submit(reqs).wait()
                run(reqs)
            sw: list[float] = []
            rn: list[float] = []
            for b in range(blocks):
                for form in (0, 1) if b % 2 == 0 else (1, 0):
                    if form == 0:
                        for _ in range(per_block):
                            t0 = clock()
                            submit(reqs).wait()
                            sw.append(clock() - t0)
                    else:
                        for _ in range(per_block):
                            t0 = clock()
                            run(reqs)
                            rn.append(clock() - t0)
            ms, mr = statistics.median(sw) * 1e9, statistics.median(rn) * 1e9
            rows.append({"op": op, "size": size, "submit_wait_ns": ms, "run_ns": mr, "diff_ns": ms - mr,
                         "requests": len(sw)})  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="WRITE", choices=sorted(OPS))
    ap.add_argument("--sizes", default="64K,256K", help="comma-separated request sizes (e.g. 32K,64K,256K)")
    ap.add_argument("--blocks", type=int, default=300, help="alternations of the two forms")
    ap.add_argument("--block", type=int, default=50, help="requests per form per alternation")
    ap.add_argument("--json", dest="as_json", action="store_true")
    a = ap.parse_args()
    try:
        sizes = [_size(s) for s in a.sizes.split(",") if s.strip()]
        rows = compare(a.op, sizes, a.blocks, a.block)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        ap.error(str(exc))
    if a.as_json:
        print(json.dumps(rows))
        return
    for r in rows:
        print(f"{r['op']} {r['size'] // KiB} KiB: submit().wait() {r['submit_wait_ns']:.0f} ns, run() {r['run_ns']:.0f} ns, "
              f"difference {r['diff_ns']:.0f} ns ({r['requests']} requests each)")  # fmt: skip


if __name__ == "__main__":
    main()
