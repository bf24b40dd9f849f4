"""What one request at a time costs over loopback TCP with nothing above the socket (not a test):
the bare C loop of tent_bench._bare (one connection, TCP_NODELAY, a WRITE's header and payload in
one writev, the answer read before the next request), sleeping in the kernel between requests vs
polling the socket first every time (`--spin-us`, the tcp transport's `busy_poll_us` with
`busy_poll_adaptive` 0) vs polling under the adaptive rule (the transport's default), alternated;
each round prints the 1-minute load average.

    python plugins/tcp/tools/bare_round_trip.py [--count 5000] [--rounds 2] [--spin-us 50] [--calls-only]

A 16-byte READ is the round trip alone (two thread wake-ups); 64 KiB adds the copies. Each round
also prints "calls only": the same exchange's four socket calls made by one thread on both ends of
one connection (`_bare.tcp_calls`), so no thread ever waits or is woken: the round trip with free
wake-ups, each call's median, and a memcpy of the same bytes for scale. `--calls-only` prints just
that (to profile the kernel's side alone: `perf record -g -- python ... --calls-only`).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from tent_bench import _bare


def calls(op: int, n: int, count: int) -> None:
    """One line: the median of each socket call of `count` exchanges made without waiting."""
    t = np.median(np.frombuffer(_bare.tcp_calls(op, n, count), np.float64).reshape(-1, 5), axis=0) * 1e6
    names = ("send header", "recv header", "send payload", "recv payload") if op == 0 else (
        "writev header+payload", "recv header+payload", "send answer", "recv answer")  # fmt: skip
    parts = ", ".join(f"{k} {v:.1f}" for k, v in zip(names, t[:4], strict=True))
    print(f"      calls only {'READ ' if op == 0 else 'WRITE'} {n:6d} B: {t[:4].sum():6.1f} us, {n / t[:4].sum() / 1e3:5.2f} GB/s "
          f"({parts}; memcpy {t[4]:.1f} us)", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--spin-us", type=int, default=50)
    ap.add_argument("--calls-only", action="store_true", help="only the socket calls, one thread, no waits")
    a = ap.parse_args()
    modes = {"sleep": (0, 0), f"poll {a.spin_us} us": (a.spin_us, 0), f"adaptive {a.spin_us} us": (a.spin_us, 1)}
    for r in range(a.rounds):
        print(f"round {r}: load average {os.getloadavg()[0]:.2f}", flush=True)
        for op, n in ((0, 65536), (1, 65536), (0, 262144), (1, 262144)):
            calls(op, n, a.count)
        if a.calls_only:
            continue
        for mode, (spin, adaptive) in modes.items():
            port = _bare.tcp_serve("127.0.0.1", 0, 0, spin, adaptive)
            for op, n in ((0, 16), (0, 65536), (1, 65536), (0, 262144), (1, 262144)):
                lat = np.frombuffer(_bare.tcp("127.0.0.1", port, op, n, a.count, 0, spin, adaptive), np.float64)
                print(f"{mode:>16} {'READ ' if op == 0 else 'WRITE'} {n:6d} B: P50 {np.median(lat) * 1e6:6.1f} us, "
                      f"P99 {np.percentile(lat, 99) * 1e6:7.1f} us, {n * len(lat) / lat.sum() / 1e9:5.2f} GB/s", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
