"""Where the tail of one-at-a-time tcp requests comes from (not a test): the engine's
submit+wait loop and the bare C loop (tent_bench.small's, polling under the same rule), rounds
interleaved, each request's latency kept. Prints per loop and round P50 / P90 / P99 / P99.9, GB/s,
how many requests took more than `--slow` x the loop's P50 and where those fall (bucketed by
latency), and for the engine the executor's counters moved in that round (busy-poll outcomes of
both sides, peer counters).

    python plugins/tcp/tools/small_tail_probe.py [--op READ] [--size 256K] [--rounds 4] [--seconds 0.5]
                                                 [--slow 2.5] [--config JSON] [--dump DIR]
                                                 [--time-ticks] [--tick-s S] [--switch-us US]

--time-ticks times every health tick of the engine's progress thread (wall and thread CPU) and
counts the requests that overlap one; --tick-s and --switch-us change the process for a
diagnosis (the tick's cadence; a third loop under another GIL switch interval). --dump writes
each loop's latencies (seconds, float64) as DIR/<loop>-<round>.npy for a closer look.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

import numpy as np
from tent_bench import small

from tent_core import Engine, Request

BUCKETS_US = (100, 150, 200, 300, 500, 1000, 2000, 5000, 10_000, 1e12)


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KM" else s) * mult


def describe(lat: np.ndarray, block: int, wall: float, slow: float) -> dict[str, Any]:
    us = lat * 1e6
    p50 = float(np.percentile(us, 50))
    out: dict[str, Any] = {"n": len(us), "gbps": round(block * len(us) / wall / 1e9, 3)}
    for q in (50, 90, 99, 99.9):
        out[f"p{q}"] = round(float(np.percentile(us, q)), 1)
    s = us[us > slow * p50]
    out["slow"] = len(s)
    out["slow_share_of_time"] = round(float(s.sum() / us.sum()), 3)
    hist, lo = {}, 0.0
    for b in BUCKETS_US:
        k = int(((s > lo) & (s <= b)).sum())
        if k:
            hist[f"<={int(b)}" if b < 1e12 else f">{int(lo)}"] = k
        lo = b
    out["slow_hist_us"] = hist
    return out


def stamped_loop(eng: Engine, reqs: list[Request], count: int, begins: list[float]) -> list[float]:
    """tent_bench.small.engine_loop that also keeps each request's start (into `begins`)."""
    lat = []
    submit = eng.submit
    clock = time.perf_counter
    begins.clear()
    for _ in range(count):
        t0 = clock()
        submit(reqs).wait()
        lat.append(clock() - t0)
        begins.append(t0)
    return lat


def overlap(
    lat: np.ndarray, begins_s: list[float], ticks: list[tuple[float, float, float]], slow: float
) -> dict[str, Any]:
    """Requests that overlap a health tick (both timed on the same clock)."""
    begins = np.asarray(begins_s, np.float64)
    ends = begins + lat
    hit = np.zeros(len(lat), bool)
    for t0, t1, _ in ticks:
        hit |= (begins < t1) & (ends > t0)
    us = lat * 1e6
    is_slow = us > slow * np.percentile(us, 50)
    return {"ticks": len(ticks), "tick_wall_us_p50": round(float(np.median([t1 - t0 for t0, t1, _ in ticks])) * 1e6, 1),
            "tick_cpu_us_p50": round(float(np.median([c for _, _, c in ticks])) * 1e6, 1),
            # the mean and P90 too: a tick that folds kept snapshots (health.single_rail_fold_ticks)
            # costs more than the median one
            "tick_cpu_us_mean": round(float(np.mean([c for _, _, c in ticks])) * 1e6, 1),
            "tick_cpu_us_p90": round(float(np.percentile([c for _, _, c in ticks], 90)) * 1e6, 1),
            "overlap_tick": int(hit.sum()), "overlap_tick_slow": int((hit & is_slow).sum()),
            "overlap_tick_p50_us": round(float(np.median(us[hit])), 1) if hit.any() else 0.0,
            "slow_without_tick": int((is_slow & ~hit).sum())}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="READ", choices=["READ", "WRITE"])
    ap.add_argument("--size", default="256K")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=0.5)
    ap.add_argument("--slow", type=float, default=2.5, help="a request is slow above this x its loop's P50")
    ap.add_argument("--config", default=None)
    ap.add_argument("--dump", default=None)
    ap.add_argument(
        "--tick-s",
        type=float,
        default=0.0,
        help="diagnosis only: the progress thread's health cadence (recovery.HEALTH_TICK_S) for this run",
    )
    ap.add_argument(
        "--switch-us",
        type=float,
        default=0.0,
        help="diagnosis only: add a loop 'tent_sw', the engine's loop under sys.setswitchinterval(this) "
        "(restored after it): a thread waiting for the GIL asks for it after this long, not 5 ms",
    )
    ap.add_argument(
        "--nice-progress",
        type=int,
        default=0,
        help="diagnosis only: add a loop 'tent_nice', the engine's loop with the progress thread at this nice "
        "value (back to its own after it)",
    )
    ap.add_argument(
        "--time-ticks",
        action="store_true",
        help="time every health tick of the engine (wall and thread CPU) and count the requests that overlap one",
    )
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    block = _size(a.size)
    if a.tick_s > 0:
        from tent_core import recovery

        recovery.HEALTH_TICK_S = a.tick_s  # read by the progress thread at every step
    cfg = json.loads(a.config) if a.config else None
    with small.target(block, cfg) as t, Engine(cfg, transports=["tcp"]) as eng:
        local = eng.allocate(block, segment="probe-local")
        reqs = [Request(small.OPS[a.op], local, 0, t.segment, 0, block)]
        small.engine_loop(eng, reqs, 50)
        nat = eng.transports["tcp"].native
        begins: list[float] = []
        ticks: list[tuple[float, float, float]] = []  # (start, end, thread CPU) per health tick
        if a.time_ticks:
            orig = eng._health_tick

            def timed(now: float) -> Any:
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return orig(now)
                finally:
                    ticks.append((t0, time.perf_counter(), time.thread_time() - c0))

            eng._health_tick = timed  # type: ignore[method-assign]
        makers = {
            "tent": lambda c: lambda: stamped_loop(eng, reqs, c, begins),
            "bare": lambda c: small._bare_one(eng, t, "tcp", a.op, block, c, local.addr),
        }
        if a.switch_us > 0:

            def switched(c: int) -> Any:
                inner = stamped_loop

                def run() -> list[float]:
                    old = sys.getswitchinterval()
                    sys.setswitchinterval(a.switch_us * 1e-6)
                    try:
                        return inner(eng, reqs, c, begins)
                    finally:
                        sys.setswitchinterval(old)

                return run

            makers["tent_sw"] = switched
        if a.nice_progress:
            from tent_core import recovery

            def niced(c: int) -> Any:
                def run() -> list[float]:
                    th = recovery.PROGRESS._thread
                    tid = th.native_id if th is not None else None
                    old = os.getpriority(os.PRIO_PROCESS, tid) if tid else 0
                    if tid:
                        os.setpriority(os.PRIO_PROCESS, tid, a.nice_progress)
                    try:
                        return stamped_loop(eng, reqs, c, begins)
                    finally:
                        if tid:
                            os.setpriority(os.PRIO_PROCESS, tid, old)

                return run

            makers["tent_nice"] = niced
        loops = {n: small._steady(m, block, a.seconds, probe=200) for n, m in makers.items()}
        for r in range(a.rounds):
            for name in list(loops) if r % 2 == 0 else list(loops)[::-1]:
                fn, count = loops[name]
                bp0, ps0 = nat.busy_poll_stats(), nat.peer_stats()
                ticks.clear()
                res = fn()
                lat = np.asarray(res["lat"], np.float64)
                wall = block * len(lat) / res["gbps"] / 1e9
                d = describe(lat, block, wall, a.slow)
                if a.time_ticks and name != "bare" and ticks:
                    d.update(overlap(lat, begins, list(ticks), a.slow))
                d["load1"] = round(os.getloadavg()[0], 2)
                if name != "bare":
                    bp1, ps1 = nat.busy_poll_stats(), nat.peer_stats()
                    d["busy_poll"] = {s: {k: bp1[s][k] - bp0[s][k] for k in bp1[s]} for s in bp1}
                    d["peer"] = {k: ps1[k] - ps0.get(k, 0) for k in ps1 if ps1[k] != ps0.get(k, 0)}
                print(json.dumps({"round": r, "loop": name, **d}), flush=True)
                if a.dump:
                    os.makedirs(a.dump, exist_ok=True)
                    np.save(os.path.join(a.dump, f"{name}-{r}.npy"), lat)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
