"""The two call forms side by side in one process: `submit(reqs).wait()` and `Engine.run(reqs)`,
and beside them issue 17's baseline, the bare copy from Python (`small.PYTHON_FORMS`).

One shm request in flight, to a target process (`tent_bench.small_target`), the forms alternating
every `--block` requests (the order rotating each time), so drift and neighbours hit all alike;
each form's per-request latency is timed like `small`'s loops, and the medians and their
differences are printed per size. What `submit().wait()` costs beyond `run()` (the handle, the
`wait` call) is the first difference; what the engine costs beyond the bare copy (per request, at
sizes from a few bytes, where the copy is nothing, up) the other; a diagnosis tool, not a step of
the series. The bare Python copy is timed where the link is in memfd mode (a memoryview slice
assignment between the same two mappings); in cma mode its columns are left out.

    python -m tent_bench.call_forms --op WRITE --sizes 64,64K,256K --blocks 300
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from typing import Any

from tent_core import Engine, Request

from .small import OPS, _py_memcpy_loop, _shm_view, target

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
    """Per size: median per-request latency (ns) of each form, alternating every `per_block`
    (`python_ns` and the engine's `*_over_python_ns` only where the link is in memfd mode)."""
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
            mode, mapped = _shm_view(eng, t)  # after the warm-up: the link is up
            pair: tuple[memoryview, memoryview] | None = None  # (destination, source)
            if mode == "memfd":  # the bare copy from Python, as small's one_at_a_time times it
                mine = memoryview((ctypes.c_char * size).from_address(local.addr)).cast("B")
                theirs = memoryview((ctypes.c_char * size).from_address(mapped)).cast("B")
                pair = (mine, theirs) if op == "READ" else (theirs, mine)
            lat: dict[str, list[float]] = {"submit_wait": [], "run": [], "python": []}
            names = [n for n in lat if n != "python" or pair]
            for b in range(blocks):
                for k in range(len(names)):
                    form = names[(b + k) % len(names)]
                    if form == "python" and pair:
                        lat[form] += _py_memcpy_loop(pair[0], pair[1], per_block)
                    elif form == "submit_wait":
                        for _ in range(per_block):
                            t0 = clock()
                            submit(reqs).wait()
                            lat[form].append(clock() - t0)
                    else:
                        for _ in range(per_block):
                            t0 = clock()
                            run(reqs)
                            lat[form].append(clock() - t0)
            ms, mr = statistics.median(lat["submit_wait"]) * 1e9, statistics.median(lat["run"]) * 1e9
            row = {"op": op, "size": size, "shm_mode": mode, "submit_wait_ns": ms, "run_ns": mr, "diff_ns": ms - mr,
                   "requests": len(lat["run"])}  # fmt: skip
            if pair:
                mp = statistics.median(lat["python"]) * 1e9
                row.update(python_ns=mp, submit_wait_over_python_ns=ms - mp, run_over_python_ns=mr - mp)
            rows.append(row)
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
        what = f"{r['size'] // KiB} KiB" if r["size"] % KiB == 0 else f"{r['size']} B"
        line = (f"{r['op']} {what}: submit().wait() {r['submit_wait_ns']:.0f} ns, run() {r['run_ns']:.0f} ns, "
                f"difference {r['diff_ns']:.0f} ns")  # fmt: skip
        if "python_ns" in r:
            line += (f"; bare Python copy {r['python_ns']:.0f} ns, the engine beyond it {r['submit_wait_over_python_ns']:.0f}"
                     f" / {r['run_over_python_ns']:.0f} ns")  # fmt: skip
        print(line + f" ({r['requests']} requests each)")


if __name__ == "__main__":
    main()
