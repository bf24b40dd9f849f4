"""A/B/C of the tcp executor's busy poll (not a test): small requests one at a time (and batches
of 16 x 64 KiB) over loopback with polling off (`busy_poll_us` 0), fixed (`--poll-us`, default
50, every time: `busy_poll_adaptive` 0) and adaptive (the default: up to `--poll-us`, learnt per
connection), interleaved round by round, the order rotating.

    python plugins/tcp/tools/busy_poll_ab.py [--rounds 4] [--budget 32M] [--sizes 64K,256K] [--poll-us 50]
                                             [--variants off,fixed,adaptive]

Each round runs tent_bench.small's one_at_a_time scenario (engine and its bare C loop; the bare
loop polls under the same rule as the engine, the same code, and beside it the bare loop that
always sleeps) once per variant, so every engine figure has bare figures taken beside it under
the same load. Every line carries the 1-minute load average when it was taken (this is a shared
host: the loaded and quiet regimes differ). Prints each round and the medians: engine GB/s, bare
GB/s (polling as the engine), bare sleeping GB/s, engine / bare, engine and bare P50 us; for
batches the engine GB/s and P50.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
from typing import Any

from tent_bench import small

KEYS = ("tent_gbps", "bare_gbps", "bare_sleep_gbps", "ratio", "tent_p50_us", "bare_p50_us", "bare_sleep_p50_us")


def variants(poll_us: int) -> dict[str, dict[str, Any]]:
    def tcp(us: int, adaptive: int) -> dict[str, Any]:
        return {"transports": {"tcp": {"busy_poll_us": us, "busy_poll_adaptive": adaptive}}}

    return {"off": tcp(0, 0), "fixed": tcp(poll_us, 0), "adaptive": tcp(poll_us, 1)}


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KM" else s) * mult


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budget", default="32M", help="bytes per timed loop")
    ap.add_argument("--sizes", default="64K,256K")
    ap.add_argument("--ops", default="READ,WRITE")
    ap.add_argument("--no-batches", action="store_true")
    ap.add_argument("--poll-us", type=int, default=50)
    ap.add_argument("--variants", default="off,fixed,adaptive")
    a = ap.parse_args()
    allv = variants(a.poll_us)
    chosen = {k: allv[k] for k in a.variants.split(",")}
    logging.basicConfig(level=logging.ERROR)
    sizes, ops, budget = [_size(x) for x in a.sizes.split(",")], a.ops.split(","), _size(a.budget)
    res: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    names = list(chosen)
    for r in range(a.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            cfg = chosen[name]
            load = os.getloadavg()[0]
            rows = small.one_at_a_time("tcp", sizes, ops, 1, budget, cfg)
            if not a.no_batches:
                rows += small.batches("tcp", 16, 64 << 10, ops, 1, budget, cfg)
            for row in rows:
                what = f"{row['batch']}x{row['block'] >> 10}K" if row["batch"] > 1 else f"{row['block'] >> 10}K"
                got = {key: float(row[key]) for key in KEYS if key in row}
                got["load"] = load
                res.setdefault((what, row["op"], name), []).append(got)
                print(f"round {r} {name} {what} {row['op']}: " + ", ".join(f"{key} {v:.2f}" for key, v in got.items()), flush=True)
    for (what, op, name), rows in sorted(res.items()):
        print(f"median {what} {op} {name}: "
              + ", ".join(f"{key} {statistics.median(x[key] for x in rows):.2f}" for key in rows[0]))  # fmt: skip


if __name__ == "__main__":
    main()
