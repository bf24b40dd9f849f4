"""The target's CPU per request, one request at a time over tcp: servers side by side (not a test).

    python plugins/tcp/tools/server_cpu_ab.py [--python PY ...] [--op WRITE] [--block 65536]
        [--count 10000] [--rounds 10] [--spin-ns 0] [--engine-client] [--config JSON]

Starts one `tent_bench.small_target` per PY (a checkout's interpreter, e.g. main's worktree
`.venv/bin/python`; default this one's), each an engine serving its buffer over tcp beside the bare
C request/response server of bench/csrc/bare.c, the engines with polling off unless `--config`
says otherwise (the bare server used is the one that always sleeps; the C client never polls).
Every round drives each engine's tcp server, and the first target's bare server, with the same C client
(plugins/tcp/tools/wire_client.c, built here with cc), in turn, the order flipping every round; with
`--engine-client` also with this checkout's engine as the initiator (`submit().wait()` in a Python
loop, as `tent_bench.small` times it) and the bare C client of bench/csrc/bare.c. The target's CPU
is the sum over its threads of /proc schedstat run time (sampled while the loop runs, so a bare
server's connection thread, gone when its client closes, counts too), divided by the requests.
Prints per round, then per server the median (lowest-highest round) and the difference to the
first server paired by round. `--spin-ns` makes the C client spin that long between requests: a
server's CPU per request grows with the time it sleeps between requests (docs/benchmarks.md,
"The target's CPU per request").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
CFG: dict[str, Any] = {"transports": {"tcp": {"busy_poll_us": 0}}}


def _cpu_ns(pid: int) -> dict[str, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0])
    return out


def _measure(pid: int, run: Callable[[], float], count: int, block: int) -> tuple[float, float]:
    """(target CPU us per request, GB/s) of one loop."""
    before = _cpu_ns(pid)
    seen = dict(before)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.003):
            seen.update(_cpu_ns(pid))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        wall = run()
    finally:
        stop.set()
        th.join()
    seen.update(_cpu_ns(pid))
    ns = sum(v - before.get(t, 0) for t, v in seen.items())
    return ns / count / 1e3, block * count / wall / 1e9


def _c_loop(argv: list[str], env: dict[str, str]) -> Callable[[], float]:
    def run() -> float:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        if out.returncode:
            raise RuntimeError(f"wire_client: {out.stderr.strip()}")
        return float(out.stdout)

    return run


def main() -> int:
    ap = argparse.ArgumentParser(prog="server_cpu_ab.py")
    ap.add_argument("--python", action="append", default=[], help="a checkout's interpreter (repeatable)")
    ap.add_argument("--op", default="WRITE", choices=["READ", "WRITE"])
    ap.add_argument("--block", type=int, default=64 << 10)
    ap.add_argument("--count", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--spin-ns", type=int, default=0)
    ap.add_argument("--engine-client", action="store_true")
    ap.add_argument("--config", default=None, help="JSON engine config of both sides (default: tcp polling off)")
    a = ap.parse_args()
    cfg = json.loads(a.config) if a.config else CFG
    pys = a.python or [sys.executable]
    sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))
    from tent_bench import _bare, small

    from tent_core import Engine, OpCode, Request

    tmp = tempfile.mkdtemp(prefix="wire_client")
    client = os.path.join(tmp, "wire_client")
    subprocess.run(["cc", "-O2", "-o", client, os.path.join(HERE, "wire_client.c")], check=True)
    env = dict(os.environ, TC_SPIN_NS=str(a.spin_ns))
    op, block, n = a.op, a.block, a.count
    _bare.tcp_congestion("cubic,reno")  # the engine's loopback congestion control (tcp loopback_congestion)
    with contextlib.ExitStack() as st:
        eng = st.enter_context(Engine(cfg, transports=["tcp"]))
        local = eng.allocate(block, segment="server-cpu-ab")
        loops: dict[str, tuple[int, Callable[[], float]]] = {}
        first = None
        for i, py in enumerate(pys):
            real, sys.executable = sys.executable, py  # small.target starts `sys.executable -m ...`
            try:
                t = st.enter_context(small.target(block, cfg))
            finally:
                sys.executable = real
            first = first or t
            peer, _ = eng.peers.resolve(t.segment, 10)
            port = int(peer.info.transports["tcp"]["rails"][0]["port"])
            pid, addr = int(t.info["pid"]), str(t.info["addr"])
            loops[f"tent{i}"] = (pid, _c_loop([client, str(port), "tent", op, str(block), str(n), addr], env))
            if a.engine_client:
                reqs = [Request(OpCode[op], local, 0, t.segment, 0, block)]
                small.engine_loop(eng, reqs, 200)

                def eng_loop(reqs: list[Request] = reqs) -> float:
                    t0 = time.perf_counter()
                    small.engine_loop(eng, reqs, n)
                    return time.perf_counter() - t0

                loops[f"tent{i}+engine"] = (pid, eng_loop)
        assert first is not None
        bport = str(first.info["bare_tcp_sleep_port"])
        loops["bare"] = (int(first.info["pid"]), _c_loop([client, bport, "bare", op, str(block), str(n), "0"], env))
        if a.engine_client:
            o = 0 if op == "READ" else 1

            def bare_loop() -> float:
                t0 = time.perf_counter()
                _bare.tcp("127.0.0.1", int(bport), o, block, n, local.addr, 0, 0)
                return time.perf_counter() - t0

            loops["bare+bareclient"] = (int(first.info["pid"]), bare_loop)
        for pid, run in loops.values():  # connections up, pages touched
            _measure(pid, run, n, block)
        names = list(loops)
        cpu: dict[str, list[float]] = {k: [] for k in names}
        gbps: dict[str, list[float]] = {k: [] for k in names}
        for r in range(a.rounds):
            for k in names if r % 2 == 0 else names[::-1]:
                us, g = _measure(*loops[k], n, block)
                cpu[k].append(us)
                gbps[k].append(g)
            print(
                f"round {r}: " + "  ".join(f"{k} {cpu[k][-1]:.2f} us {gbps[k][-1]:.2f} GB/s" for k in names), flush=True
            )
    for i, py in enumerate(pys):
        print(f"tent{i}: {py}")
    ref = f"{names[0]}+engine" if f"{names[0]}+engine" in names else names[0]
    for k in names:
        if k.endswith("+engine") and k != ref:
            g = [x / y for x, y in zip(gbps[k], gbps[ref], strict=True)]
            print(f"{k:16s} GB/s / {ref}'s, paired by round: {statistics.median(g):.3f} ({min(g):.2f}-{max(g):.2f}), "
                  f"higher in {sum(x > 1 for x in g)}/{len(g)}")  # fmt: skip
    for k in names:
        d = [x - y for x, y in zip(cpu[k], cpu[names[0]], strict=True)]
        q = statistics.quantiles(d, n=4) if len(d) > 1 else [d[0], d[0], d[0]]
        print(f"{k:16s} target CPU/request {statistics.median(cpu[k]):6.2f} us ({min(cpu[k]):.2f}-{max(cpu[k]):.2f}), "
              f"GB/s {statistics.median(gbps[k]):.2f}; minus {names[0]} paired by round {statistics.median(d):+.2f} us "
              f"(quartiles {q[0]:+.2f} / {q[2]:+.2f}), lower in {sum(x < 0 for x in d)}/{len(d)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
