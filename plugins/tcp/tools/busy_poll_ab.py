"""A/B of the tcp executor's bounded busy poll (not a test): small requests one at a time (and
batches of 16 x 64 KiB) over loopback with `busy_poll_us` 0 (the default: always sleep in the
kernel) and `--poll-us` (default 50), interleaved round by round.

    python plugins/tcp/tools/busy_poll_ab.py [--rounds 4] [--budget 32M] [--sizes 64K,256K] [--poll-us 50]

Each round runs tent_bench.small's one_at_a_time scenario (engine and its bare C loop, both
polling as long as the engine's `busy_poll_us`) once per variant, so every engine figure has a
bare figure taken beside it under the same load. Prints each round and the medians: engine GB/s,
bare GB/s, engine / bare, engine and bare P50 us; for batches the engine GB/s and P50.
"""

from __future__ import annotations

import argparse
import logging
import statistics
from typing import Any

from tent_bench import small


def _variants(poll_us: int) -> dict[str, dict[str, Any]]:
    return {"poll off (default)": {}, f"poll {poll_us} us": {"transports": {"tcp": {"busy_poll_us": poll_us}}}}


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
    a = ap.parse_args()
    variants = _variants(a.poll_us)
    logging.basicConfig(level=logging.ERROR)
    sizes, ops, budget = [_size(x) for x in a.sizes.split(",")], a.ops.split(","), _size(a.budget)
    keys = ("tent_gbps", "bare_gbps", "ratio", "tent_p50_us", "bare_p50_us")
    res: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for r in range(a.rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            cfg = variants[name]
            rows = small.one_at_a_time("tcp", sizes, ops, 1, budget, cfg)
            if not a.no_batches:
                rows += small.batches("tcp", 16, 64 << 10, ops, 1, budget, cfg)
            for row in rows:
                what = f"{row['batch']}x{row['block'] >> 10}K" if row["batch"] > 1 else f"{row['block'] >> 10}K"
                got = {k: float(row[k]) for k in keys if k in row}
                res.setdefault((what, row["op"], name), []).append(got)
                print(f"round {r} {name} {what} {row['op']}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    for (what, op, name), rows in sorted(res.items()):
        print(f"median {what} {op} {name}: "
              + ", ".join(f"{k} {statistics.median(x[k] for x in rows):.2f}" for k in rows[0]))  # fmt: skip


if __name__ == "__main__":
    main()
