"""Round trip of one small control request (issue 14, diagnostic): a handle's `list` to a reference
server in another process, over loopback TCP, timed on the caller's thread (what every replicate
pays twice: replicate, replicate_done). Prints the median, 10th and 90th percentile in microseconds.

    python -m tent_bench.refhub.request_rtt [--requests 3000]

For an A/B of refhub itself, run it once per tree, interleaved (PYTHONPATH=<other tree>/refhub
puts that tree's refhub first, here and in the spawned server).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from typing import Any


def _serve(q: Any, stop: Any) -> None:
    from refhub.server import start_embedded

    q.put(start_embedded(hb_timeout=3.0))
    stop.wait(600)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="timed requests after 300 untimed ones")
    args = ap.parse_args(argv)
    if args.requests < 10:
        ap.error("--requests must be at least 10")
    import numpy as np

    import refhub

    n = args.requests
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    srv = ctx.Process(target=_serve, args=(q, stop), daemon=True)
    srv.start()
    try:
        h = refhub.open("rtt", replica="r", server=q.get(timeout=60), hb_interval=0.2)
        h.register("a", np.zeros(1000, np.uint8))
        h.publish(1)
        for _ in range(300):  # warm: connections, allocator, the server's caches
            h.list()
        xs = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            h.list()
            xs.append(time.perf_counter_ns() - t0)
        h.close()
    finally:
        stop.set()
        srv.join(10)
    xs.sort()
    print(json.dumps({"requests": n, "median_us": round(statistics.median(xs) / 1e3, 1),  # noqa: T201 (a command-line tool)
                      "p10_us": round(xs[n // 10] / 1e3, 1), "p90_us": round(xs[9 * n // 10] / 1e3, 1)}))


if __name__ == "__main__":
    main()
