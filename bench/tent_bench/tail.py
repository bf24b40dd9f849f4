"""Tail latency of one transport: many large requests one at a time, P50/P99 and run-to-run spread.

`python -m tent_bench.tail --requests 1000 --run 100 --block 64M --op WRITE` starts a target
process (its buffer holding a fresh pattern), then submits `requests` single requests of `block`
bytes back to back (submit, wait, repeat), in runs of `run` requests. Every request's latency is
kept; each run's GB/s is its bytes over its wall time. Before timing and after the last run the
bytes are checked (a WRITE of a fresh pattern read back; the target's own pattern read). Prints
one JSON object: P50, P99, max, P99 / P50, the GB/s of every run, the slowest run / the median
run, and the slowest requests with their time from the start (to find stalls).

Targets (issue 14): P99 <= 3x P50 over 1000 requests, and no run below half the median run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from tent_core.engine import Engine, Request
from tent_core.testing import first_mismatch, fresh_seed, pattern
from tent_core.types import OpCode

from .cli import parse_size
from .runner import target_process

SLOWEST = 10
# Kernel TCP counters whose movement during the runs explains a stall (retransmission timeouts,
# memory pressure, drops); read from /proc/net/{snmp,netstat}, for the whole network namespace.
TCP_COUNTERS = ("RetransSegs", "TCPTimeouts", "TCPLossProbes", "TCPMemoryPressures", "TCPRcvQDrop", "TCPBacklogDrop",
                "TCPZeroWindowDrop", "PruneCalled", "TCPOFODrop", "TCPRcvCollapsed", "TCPSpuriousRTOs",
                "TCPFromZeroWindowAdv", "TCPToZeroWindowAdv", "TCPWantZeroWindowAdv")  # fmt: skip


def tcp_counters() -> dict[str, int]:
    out: dict[str, int] = {}
    for path in ("/proc/net/snmp", "/proc/net/netstat"):
        try:
            lines = open(path).read().splitlines()
        except OSError:
            continue
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            for k, v in zip(names.split()[1:], values.split()[1:], strict=False):
                if k in TCP_COUNTERS:
                    try:
                        out[k] = int(v)
                    except ValueError:
                        pass
    return out


def measure(transport: str, op: str, block: int, requests: int, run: int, warmup: int = 5,
            config: dict[str, Any] | None = None, host: str = "127.0.0.1") -> dict[str, Any]:  # fmt: skip
    if requests < 1 or run < 1 or block < 1:
        raise ValueError("requests, run and block must be >= 1")
    opcode = OpCode[op]
    with target_process(block, host, config) as target, Engine(config, host=host, transports=[transport]) as eng:
        remote = target["segment"]
        local = eng.allocate(block, segment="tail-local")
        # bytes checked before timing: the target's pattern READ, then a fresh one WRITTEN and read back
        local.array[:] = 0
        eng.submit([Request(OpCode.READ, local, 0, remote, 0, block)]).wait()
        if first_mismatch(local.array, target["seed"]) is not None:
            raise RuntimeError("tail: READ of the target's pattern returned wrong bytes")
        seed = fresh_seed()
        local.array[:] = pattern(block, seed)
        eng.submit([Request(OpCode.WRITE, local, 0, remote, 0, block)]).wait()
        local.array[:] = 0
        eng.submit([Request(OpCode.READ, local, 0, remote, 0, block)]).wait()
        if first_mismatch(local.array, seed) is not None:
            raise RuntimeError("tail: WRITE then READ returned wrong bytes")
        verified = 3 * block
        if opcode is OpCode.WRITE:
            local.array[:] = pattern(block, seed)
        req = [Request(opcode, local, 0, remote, 0, block)]
        for _ in range(warmup):
            eng.submit(req).wait()
        lat: list[float] = []
        stamps: list[float] = []
        failed: list[int] = []  # slices that failed (and were retried) during each request

        def errors() -> int:
            return sum(r["errors"] for r in eng.rail_stats() if r["transport"] == transport)

        e_prev = errors()
        runs: list[dict[str, Any]] = []
        counters0 = tcp_counters()
        t_begin = time.perf_counter()
        done = 0
        while done < requests:
            n = min(run, requests - done)
            t_run = time.perf_counter()
            for _ in range(n):
                t0 = time.perf_counter()
                eng.submit(req).wait()
                t1 = time.perf_counter()
                lat.append(t1 - t0)
                stamps.append(t0 - t_begin)
                e_now = errors()
                failed.append(e_now - e_prev)
                e_prev = e_now
            wall = time.perf_counter() - t_run
            runs.append({"requests": n, "seconds": round(wall, 4), "gbps": round(n * block / wall / 1e9, 4)})
            done += n
        counters1 = tcp_counters()
        # after the last run: what the target holds is what we wrote (WRITE) / what we read is its (READ)
        if opcode is OpCode.WRITE:
            local.array[:] = 0
            eng.submit([Request(OpCode.READ, local, 0, remote, 0, block)]).wait()
            ok = first_mismatch(local.array, seed) is None
        else:
            ok = first_mismatch(local.array, seed) is None
        if not ok:
            raise RuntimeError("tail: the bytes after the timed runs are wrong")
        verified += block
        rails = [r for r in eng.rail_stats() if r["transport"] == transport]
        slice_errors = sum(r["errors"] for r in rails)  # failed (e.g. timed-out) slices, retried
        slices = sum(r["slices"] for r in rails)
    arr = np.asarray(lat)
    p50, p99 = float(np.percentile(arr, 50)), float(np.percentile(arr, 99))
    med_run = statistics.median(r["gbps"] for r in runs)
    slow_idx = np.argsort(arr)[::-1][:SLOWEST]
    return {
        "transport": transport,
        "op": op,
        "block_size": block,
        "requests": len(lat),
        "run_requests": run,
        "p50_us": round(p50 * 1e6, 1),
        "p99_us": round(p99 * 1e6, 1),
        "max_us": round(float(arr.max()) * 1e6, 1),
        "p99_over_p50": round(p99 / p50, 3),
        "gbps": round(len(lat) * block / float(arr.sum()) / 1e9, 4),
        "median_run_gbps": round(med_run, 4),
        "slowest_run_over_median": round(min(r["gbps"] for r in runs) / med_run, 3),
        "runs": runs,
        "slowest": [{"index": int(i), "at_s": round(stamps[i], 4), "us": round(lat[i] * 1e6, 1), "failed_slices": failed[i]}
                    for i in slow_idx],  # fmt: skip
        "requests_with_failed_slices": sum(1 for f in failed if f),
        "verified_bytes": verified,
        "slices": slices,
        "slice_errors": slice_errors,
        "tcp_counters": {k: counters1[k] - counters0.get(k, 0) for k in counters1 if counters1[k] != counters0.get(k, 0)},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.tail", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--op", default="WRITE", choices=["READ", "WRITE"])
    ap.add_argument("--block", default="64M")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--run", type=int, default=100, help="requests per run (a run's GB/s is one sample)")
    ap.add_argument("--config", default=None, help="engine config (JSON) for both sides")
    args = ap.parse_args(argv)
    try:
        block = parse_size(args.block)
    except Exception as exc:  # click.BadParameter outside click
        ap.error(str(exc))
    cfg = json.loads(args.config) if args.config else None
    print(json.dumps(measure(args.transport, args.op, block, args.requests, args.run, config=cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
