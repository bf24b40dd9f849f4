"""Lone requests on a fresh fabric, each rail's part of each one timed: where a request's time goes.

``sudo .venv/bin/python -m tent_bench.fabric_lone --degrade 3:0.5 --requests 12 --gap 0.5``

Builds a `Fabric` as `tent bench --fabric` does (the same initiator and target configs), then READs
`--block` bytes `--requests` times, one at a time, `--gap` seconds apart (each request finds the rails
idle, as under a light open-loop load). The initiator samples every rail's completed bytes about
every millisecond; for each request it reports its time, the bytes each rail carried, when each
rail completed its first and its last bytes (ms after submit), and the engine's bandwidth estimate
and health state of each rail just before the submit (what the spray was planned with).
The first request meets fresh connections and the nominal rates; `summary` leaves it out.
Prints one JSON object; with --text, a line per request.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

from .fabric_bench import FabricBenchSpec, _reset_rails, initiator_config, parse_degrade, target_config
from .runner import target_process
from .testbed.fabric import Fabric, parse_fabric_spec

MiB = 1 << 20


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Inside node 0: the requests and the per-rail byte timeline."""
    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    block = int(spec["block"])
    with Engine(spec["config"], host=spec["host"], transports=["tcp"]) as eng:
        local = eng.allocate(block, segment="lone")
        eng.submit([Request(OpCode.READ, local, 0, spec["remote"], 0, min(block, 8 * MiB))], deadline=30).wait()

        def rails() -> list[dict[str, Any]]:
            return sorted((r for r in eng.rail_stats() if r["transport"] == "tcp"), key=lambda r: r["index"])

        samples: list[tuple[float, list[int]]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.monotonic(), [r["bytes"] for r in rails()]))
                stop.wait(0.001)

        th = threading.Thread(target=sample, name="lone-sampler", daemon=True)
        th.start()
        reqs = []
        try:
            for _ in range(int(spec["requests"])):
                time.sleep(float(spec["gap"]))
                view = rails()
                t0 = time.monotonic()
                samples.append((t0, [r["bytes"] for r in view]))  # the request's baseline
                eng.submit([Request(OpCode.READ, local, 0, spec["remote"], 0, block)], deadline=60).wait()
                t1 = time.monotonic()
                # every byte is counted once wait() returns; the sampler thread may not have run since
                samples.append((t1, [r["bytes"] for r in rails()]))
                reqs.append({"t0": t0, "t1": t1, "est_gbit": [round(r["bandwidth_GBps"] * 8, 3) for r in view],
                             "state": [r["state"][0] for r in view]})  # fmt: skip
        finally:
            stop.set()
            th.join(timeout=5)
    return {"reqs": reqs, "samples": samples}


def analyze(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Per request: ms, MiB per rail, first and last completion per rail (ms after submit)."""
    samples = sorted(raw["samples"], key=lambda s: s[0])
    out = []
    for q in raw["reqs"]:
        t0, t1 = q["t0"], q["t1"]
        win = [(t, b) for t, b in samples if t0 <= t <= t1]
        if len(win) < 2:
            continue
        base = win[0][1]
        total = [e - s for s, e in zip(base, win[-1][1], strict=True)]
        first: list[float | None] = []
        last: list[float | None] = []
        for r, tot in enumerate(total):
            moved = [t for t, b in win if b[r] - base[r] > 0]
            full = [t for t, b in win if b[r] - base[r] >= tot]
            first.append(round((moved[0] - t0) * 1e3, 1) if moved and tot else None)
            last.append(round((full[0] - t0) * 1e3, 1) if full and tot else None)
        ends = [x for x in last if x is not None]
        out.append({"ms": round((t1 - t0) * 1e3, 1), "mib": [round(b / MiB, 2) for b in total], "first_ms": first,
                    "last_ms": last, "skew_ms": round(max(ends) - min(ends), 1) if ends else None,
                    "est_gbit": q["est_gbit"], "state": q["state"]})  # fmt: skip
    return out


def summary(rows: list[dict[str, Any]], slow: int | None) -> dict[str, Any]:
    """Medians over the requests after the first."""
    rest = rows[1:]
    if not rest:
        return {}
    ms = [r["ms"] for r in rest]
    out: dict[str, Any] = {"requests": len(rest), "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms),
                           "median_skew_ms": statistics.median(r["skew_ms"] for r in rest if r["skew_ms"] is not None)}  # fmt: skip
    if slow is not None:
        out["median_slow_share"] = round(statistics.median(r["mib"][slow] / max(sum(r["mib"]), 1e-9) for r in rest), 4)
    return out


def run(fabric: str, degrade: str | None, requests: int, gap: float, block: int) -> dict[str, Any]:
    spec = FabricBenchSpec(fabric=fabric, degrade=parse_degrade(degrade))
    with Fabric(nodes=2, rails=len(parse_fabric_spec(fabric)), rate=parse_fabric_spec(fabric)) as fab:
        fab.up_all()
        _reset_rails(fab, spec.degrade)
        with target_process(block, fab.addrs(1)[0], target_config(fab, spec), True, fab.exec_argv(1, [])) as tgt:
            ws = {"remote": tgt["segment"], "host": fab.addrs(0, peer=1)[0], "config": initiator_config(fab, spec, "spray"),
                  "requests": requests, "gap": gap, "block": block}  # fmt: skip
            argv = [sys.executable, "-m", "tent_bench.fabric_lone", "--worker", json.dumps(ws)]
            p = subprocess.run(fab.exec_argv(0, argv), capture_output=True, text=True, timeout=120 + requests * (gap + 30))
            if p.returncode != 0:
                raise RuntimeError(f"fabric_lone worker failed (rc={p.returncode}): {p.stderr[-2000:]}")
            raw = json.loads(p.stdout.strip().splitlines()[-1])
        sysctl = subprocess.run(fab.exec_argv(0, ["sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle",
                                                  "net.ipv4.tcp_congestion_control"]),
                                capture_output=True, text=True, timeout=10).stdout.split()  # fmt: skip
    rows = analyze(raw)
    slow = spec.degrade[0][0] if spec.degrade else None
    return {"fabric": fabric, "degrade": degrade, "block": block, "gap_s": gap, "tcp_slow_start_after_idle": sysctl[:1],
            "tcp_congestion_control": sysctl[1:2], "rows": rows, "summary": summary(rows, slow)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.fabric_lone", description=__doc__.split("\n")[0])
    ap.add_argument("--fabric", default="4x1gbit")
    ap.add_argument("--degrade", default=None, help="I:FACTOR[,..] as tent bench --degrade")
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--gap", type=float, default=0.5, help="seconds of idle before each request")
    ap.add_argument("--block", type=int, default=64 * MiB)
    ap.add_argument("--text", action="store_true", help="a line per request instead of JSON")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        sys.stdout.write(json.dumps(_worker(json.loads(args.worker))) + "\n")
        return 0
    if args.requests < 1 or args.gap < 0 or args.block <= 0:
        ap.error("--requests >= 1, --gap >= 0 and --block > 0")
    res = run(args.fabric, args.degrade, args.requests, args.gap, args.block)
    if not args.text:
        sys.stdout.write(json.dumps(res) + "\n")
        return 0
    for k, r in enumerate(res["rows"]):
        sys.stdout.write(f"req {k}: {r['ms']} ms, MiB {r['mib']}, first {r['first_ms']}, last {r['last_ms']}, "
                         f"est {r['est_gbit']} Gbit/s, states {''.join(r['state'])}\n")  # fmt: skip
    sys.stdout.write(json.dumps(res["summary"]) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
