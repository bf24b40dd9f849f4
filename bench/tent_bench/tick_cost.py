"""CPU cost of the engine's progress thread (`tent-progress`: failures, health ticks, sweeps).

Four cases, each for `--seconds`: an idle engine with one connected tcp peer; the same engine
during a tcp one-at-a-time 64 KiB READ loop; an idle engine whose route has several loopback tcp
rails; one 64 KiB READ after each 1.5 s of idling (its submit-to-wait-return time: the first submit
after the progress thread went to sleep wakes it). Per case: the progress thread's CPU seconds per wall second (from /proc/self/task/<tid>/schedstat,
its run time), the CPU time of one health tick in it (thread_time around the engine's tick), and for the loop the requests per second. ``--base`` runs another tent-core tree
(e.g. main's, built in place) interleaved with this one, one child process per case and round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from tent_core import Engine, OpCode, Request

from .small import KiB, _verify, engine_loop, spread, target

CASES = ["idle", "loop64k", "rails4", "wake64k"]
WAKE_GAP_S = 1.5  # wake64k: idle this long before each request (past progress_idle_after_s: asleep)
RAILS4 = {"tcp": {"rails": ["127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"]}}


def _thread_cpu(name: str) -> float:
    """CPU seconds of this process's thread named `name` (schedstat: nanoseconds, where stat's
    utime+stime count 10 ms clock ticks); 0.0 if none."""
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                return int(f.read().split()[0]) / 1e9
        except OSError:
            continue
    return 0.0


def _name_progress_thread() -> None:
    """Python names its threads only for itself: give the OS thread the same name, so /proc shows it."""
    for t in threading.enumerate():
        if t.name == "tent-progress" and t.native_id is not None:
            with open(f"/proc/self/task/{t.native_id}/comm", "w") as f:
                f.write("tent-progress")


def once(case: str, seconds: float, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """One case in this process: the progress thread's CPU per second, and the loop's rate."""
    cfg = dict(config or {})
    if case == "rails4":
        cfg["transports"] = {**RAILS4, **(cfg.get("transports") or {})}
    block = 64 * KiB
    ticks = [0, 0.0]  # health ticks of this engine, and the progress thread's CPU seconds in them
    tick = Engine._health_tick

    def timed_tick(self: Engine, now: float) -> Any:
        c0 = time.thread_time()
        try:
            return tick(self, now)  # whether the tick needs the next one on time (an idle thread sleeps long)
        finally:
            ticks[0] += 1
            ticks[1] += time.thread_time() - c0

    with target(block, cfg or None) as t, Engine(cfg or None, transports=["tcp"]) as eng:
        local = eng.allocate(block, segment="tick-local")
        _verify(eng, local, t.segment, block, t.seed)  # connects the peer (every rail)
        reqs = [Request(OpCode.READ, local, 0, t.segment, 0, block)]
        engine_loop(eng, reqs, 50)
        _name_progress_thread()
        time.sleep(0.2)
        Engine._health_tick = timed_tick  # type: ignore[method-assign]
        c0, w0 = _thread_cpu("tent-progress"), time.monotonic()
        p0 = time.process_time()
        n = 0
        first: list[float] = []
        if case == "wake64k":  # one request after each idle gap: what the first submit after a sleep pays
            end = w0 + seconds
            while time.monotonic() < end or not first:
                time.sleep(WAKE_GAP_S)
                first += engine_loop(eng, reqs, 1)
        elif case == "loop64k":
            end = w0 + seconds
            while time.monotonic() < end:
                engine_loop(eng, reqs, 100)
                n += 100
        else:
            time.sleep(seconds)
        wall = time.monotonic() - w0
        cpu = _thread_cpu("tent-progress") - c0
        proc = time.process_time() - p0
        Engine._health_tick = tick  # type: ignore[method-assign]
    return {"case": case, "wall_s": wall, "progress_cpu_per_s": cpu / wall, "process_cpu_per_s": proc / wall,
            "req_per_s": n / wall, "tick_cpu_us": ticks[1] / max(1, ticks[0]) * 1e6, "ticks_per_s": ticks[0] / wall,
            "after_idle_us": float(np.median(first)) * 1e6 if first else 0.0}


def _child(python: str, case: str, seconds: float, config: dict[str, Any] | None) -> dict[str, Any]:
    argv = [python, "-m", "tent_bench.tick_cost", "--once", case, "--seconds", str(seconds)]
    if config:
        argv += ["--config", json.dumps(config)]
    # this bench's own tent_bench, whichever tree's tent_core the python imports
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    # cwd "/": `python -m` puts the working directory first on sys.path, and run from a tree's root
    # it imported that tree's tent_core whichever python ran (a --base run measured this tree)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds * 4 + 120, check=True, env=env, cwd="/")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.tick_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--config", default=None, help="JSON engine config for both sides")
    ap.add_argument("--base", default=None, help="a tent-core tree's python (e.g. main's .venv/bin/python) run interleaved")
    ap.add_argument("--once", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    config = json.loads(args.config) if args.config else None
    if args.once:
        print(json.dumps(once(args.once, args.seconds, config)))
        return 0
    variants = {"this": sys.executable, **({"base": args.base} if args.base else {})}
    res: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for case in args.cases.split(","):
            for name, py in variants.items():
                res.setdefault((case, name), []).append(_child(py, case, args.seconds, config))
    for (case, name), rows in res.items():
        cpu = [r["progress_cpu_per_s"] * 100 for r in rows]
        rate = [r["req_per_s"] for r in rows]
        s = spread(cpu)
        us = spread([r["tick_cpu_us"] for r in rows])
        tps = spread([r.get("ticks_per_s", 0.0) for r in rows])
        line = (f"{case:8s} {name:5s} progress thread {np.median(cpu):6.2f}% of a core ({s['lo']:.2f}-{s['hi']:.2f}), "
                f"{us['med']:6.1f} us CPU per health tick ({us['lo']:.1f}-{us['hi']:.1f}), "
                f"{tps['med']:5.1f} ticks/s ({tps['lo']:.1f}-{tps['hi']:.1f})")
        if any(r.get("after_idle_us") for r in rows):
            a = spread([r["after_idle_us"] for r in rows])
            line += f"  one 64 KiB READ after {WAKE_GAP_S} s idle {a['med']:.0f} us ({a['lo']:.0f}-{a['hi']:.0f})"
        if any(rate):
            r = spread(rate)
            line += f"  {np.median(rate):8.0f} req/s ({r['lo']:.0f}-{r['hi']:.0f})"
        print(line)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
