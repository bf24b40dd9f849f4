"""A/B of the tcp QoS bulk cap (not a test): the QoS-tail scenario of tent_bench.small
(64 KiB HIGH READs one at a time, alone and beside a 64 MiB LOW WRITE stream to the same peer,
QoS on) with the executor's `qos_bulk_conns` cap off (0) and on (the default), interleaved; with
`--compare poll`, busy polling off (`busy_poll_us` 0) against the default (adaptive); with
`--compare nice`, the bulk threads' demotion while small requests are active (`qos_bulk_nice`)
off, at nice 19 (the default) and under SCHED_IDLE (20); with `--compare piece`, those threads
moving their bytes in whole system calls (`qos_bulk_piece` 0) against pieces of 128 KiB (the
default) with a yield between two, at nice 19 and under SCHED_IDLE; `--compare idle`, SCHED_IDLE
with and without pieces against nice 19 with them.

    python plugins/tcp/tools/qos_tail_ab.py [--rounds 6] [--count 400] [--compare cap|poll|nice|side|piece|idle]
                                            [--bulk-alone]

Prints each round and the medians (and the range over the rounds): idle and loaded P99 of the
HIGH READs, their ratio, and the stream's GB/s. `--bulk-alone`: the stream alone instead (64 MiB
LOW WRITEs, then READs, no small request), GB/s of each: what the knobs must not change.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

from tent_bench import small

from tent_core import Engine, OpCode, Priority, Request

COMPARE: dict[str, dict[str, dict[str, Any]]] = {
    "cap": {"cap off": {"transports": {"tcp": {"qos_bulk_conns": 0}}}, "cap on (default)": {}},
    "poll": {"poll off": {"transports": {"tcp": {"busy_poll_us": 0}}}, "adaptive poll (default)": {}},
    "nice": {"bulk nice 0": {"transports": {"tcp": {"qos_bulk_nice": 0}}},
             "bulk nice 19 (default)": {},
             "bulk SCHED_IDLE": {"transports": {"tcp": {"qos_bulk_nice": 20}}}},
    "piece": {"whole calls": {"transports": {"tcp": {"qos_bulk_piece": 0}}},
              "pieces 128 KiB (default)": {},
              "pieces, SCHED_IDLE": {"transports": {"tcp": {"qos_bulk_nice": 20}}}},
    "idle": {"nice 19, pieces": {"transports": {"tcp": {"qos_bulk_nice": 19}}},
             "SCHED_IDLE, pieces": {"transports": {"tcp": {"qos_bulk_nice": 20}}},
             "SCHED_IDLE, whole calls": {"transports": {"tcp": {"qos_bulk_nice": 20, "qos_bulk_piece": 0}}}},
    "side": {"bulk nice 0": {"transports": {"tcp": {"qos_bulk_nice": 0}}},
             "initiator only": {"transports": {"tcp": {"qos_serve_nice": 0}}},
             "both sides (default)": {}},
}


def bulk_alone(config: dict[str, Any], count: int = 8, stream: int = 64 << 20) -> dict[str, float]:
    """GB/s of `count` 64 MiB LOW WRITEs, then READs, one at a time, with no small request at all:
    what the QoS knobs must leave as it was (they act only while small requests are active)."""
    cfg = {**config, "qos": {"enabled": True}}
    out = {}
    with small.target(stream, cfg) as t, Engine(cfg, transports=["tcp"]) as eng:
        local = eng.allocate(stream, segment="small-local")
        for op in (OpCode.WRITE, OpCode.READ):
            req = [Request(op, local, 0, t.segment, 0, stream, Priority.LOW)]
            small.engine_loop(eng, req, 2)
            t0 = time.perf_counter()
            small.engine_loop(eng, req, count)
            out[f"{op.name.lower()}_gbps"] = stream * count / (time.perf_counter() - t0) / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--count", type=int, default=400, help="HIGH READs per phase")
    ap.add_argument("--compare", choices=sorted(COMPARE), default="cap")
    ap.add_argument("--bulk-alone", action="store_true", help="the 64 MiB stream alone (WRITE and READ GB/s), no small requests")
    a = ap.parse_args()
    variants = COMPARE[a.compare]
    logging.basicConfig(level=logging.ERROR)
    keys = ("write_gbps", "read_gbps") if a.bulk_alone else ("idle_p99_us", "loaded_p50_us", "loaded_p99_us", "ratio", "stream_gbps")
    res: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    for r in range(a.rounds):
        for name in list(variants) if r % 2 == 0 else list(variants)[::-1]:
            row = bulk_alone(variants[name]) if a.bulk_alone else small.qos_tail("tcp", 1, count=a.count, config=variants[name])[0]
            res[name].append({k: float(row[k]) for k in keys})
            print(f"round {r} {name} (load {os.getloadavg()[0]:.2f}): " + ", ".join(f"{k} {row[k]:.2f}" for k in keys),
                  flush=True)  # fmt: skip
    for name, rows in res.items():
        spread = ", ".join(f"{k} {min(x[k] for x in rows):.2f}-{max(x[k] for x in rows):.2f}" for k in keys)
        print(f"median {name}: " + ", ".join(f"{k} {statistics.median(x[k] for x in rows):.2f}" for k in keys)
              + f" (range: {spread})")  # fmt: skip


if __name__ == "__main__":
    main()
