"""Per-round evidence for tcp batch rounds that come out fast or slow (issue 17's bimodal WRITE
batch): each round's rate, P50, longest batch, the system's TCP loss counters, and per thread of
both processes (this one and its `tent_bench.small_target`) the share of the round it ran and
waited on the run queue (/proc/<pid>/task/*/schedstat), its context switches and the CPU it was
on last; `ss -tinp` of both processes' connections at the end.

    python plugins/tcp/tools/batch_rounds_probe.py [--op WRITE] [--rounds 20] [--seconds 0.2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from typing import Any

import numpy as np
from tent_bench import small

from tent_core import Engine, Request

KiB = 1024
KEYS = ["TcpExt.TCPLossProbes", "TcpExt.TCPTimeouts", "Tcp.RetransSegs", "TcpExt.TCPBacklogDrop",
        "TcpExt.TCPRcvQDrop", "TcpExt.TCPSpuriousRTOs", "TcpExt.PruneCalled", "TcpExt.TCPZeroWindowDrop",
        "TcpExt.TCPFastRetrans"]  # fmt: skip


def threads(pid: int) -> dict[str, dict[str, Any]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            comm = open(f"{base}/comm").read().strip()
            stat = open(f"{base}/stat").read().rsplit(")", 1)[1].split()
            run, wait, _ = map(int, open(f"{base}/schedstat").read().split())
            ctx = {ln.split(":")[0]: int(ln.split()[1]) for ln in open(f"{base}/status") if "ctxt_switches" in ln}
        except OSError:
            continue  # the thread ended
        out[tid] = {"comm": comm, "cpu": int(stat[36]), "run": run, "wait": wait,
                    "vol": ctx.get("voluntary_ctxt_switches", 0), "invol": ctx.get("nonvoluntary_ctxt_switches", 0)}  # fmt: skip
    return out


def netstat() -> dict[str, int]:
    out = {}
    for f in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = open(f).read().splitlines()
        for head, vals in zip(lines[::2], lines[1::2], strict=False):
            proto = head.split(":")[0]
            for k, x in zip(head.split()[1:], vals.split()[1:], strict=False):
                out[f"{proto}.{k}"] = int(x)
    return out


def busy(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], wall: float) -> str:
    """Threads that ran at least 2% of the round: name@cpu, run and run-queue wait shares, switches."""
    res = []
    for tid, x in b.items():
        y = a.get(tid)
        if y is None or (x["run"] - y["run"]) / 1e9 / wall < 0.02:
            continue
        res.append(f"{x['comm'][:10]}@{x['cpu']} run{(x['run'] - y['run']) / 1e7 / wall:.0f}% "
                   f"wait{(x['wait'] - y['wait']) / 1e7 / wall:.0f}% v{x['vol'] - y['vol']} i{x['invol'] - y['invol']}")  # fmt: skip
    return "; ".join(res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", default="WRITE", choices=list(small.OPS))
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=0.2)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    n, block = args.batch, 64 * KiB
    with small.target(n * block) as t, Engine(None, transports=["tcp"]) as eng:
        local = eng.allocate(n * block, segment="small-local")
        reqs = [Request(small.OPS[args.op], local, i * block, t.segment, i * block, block) for i in range(n)]
        one, _ = small._steady(lambda c: lambda: small.engine_loop(eng, reqs, c), n * block, args.seconds, 20)
        me, tp = os.getpid(), t.proc.pid
        for r in range(args.rounds):
            a, b, ns = threads(me), threads(tp), netstat()
            t0 = time.perf_counter()
            res = one()
            wall = time.perf_counter() - t0
            a2, b2, ns2 = threads(me), threads(tp), netstat()
            lat = np.asarray(res["lat"])
            net = {k.split(".")[1]: ns2[k] - ns[k] for k in KEYS if ns2.get(k, 0) != ns.get(k, 0)}
            print(f"r{r:02d} {res['gbps']:.2f} GB/s P50 {np.median(lat) * 1e6:.0f} us max {lat.max() * 1e3:.1f} ms "
                  f"{net or ''} load {os.getloadavg()[0]:.1f} | initiator {busy(a, a2, wall)} | target {busy(b, b2, wall)}",
                  flush=True)  # fmt: skip
        lines = subprocess.run(["ss", "-tinp"], capture_output=True, text=True, timeout=10).stdout.splitlines()
        for i, line in enumerate(lines):
            if f"pid={me}," in line or f"pid={tp}," in line:
                print(line.strip())
                print("   ", lines[i + 1].strip() if i + 1 < len(lines) else "")


if __name__ == "__main__":
    main()
