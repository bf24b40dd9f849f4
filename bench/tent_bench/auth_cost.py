"""What authentication costs: TCP and shm throughput with and without the cluster token, one run.

    python -m tent_bench.auth_cost [--sizes 4M,64M] [--rounds 7] [--budget 0.6] [--json]

Two target processes (`tent_bench.target`, a pattern-filled engine-allocated buffer), one started
with a cluster token and one without; in this process, four initiator engines (tcp and shm, each
with and without the token). Every round measures every point (transport x op x size) for both
settings back to back, the order alternating between rounds, so drift on a shared machine hits both
alike. A point moves `size` bytes again and again for `budget` seconds (one request in flight)
and reports GB/s; the table gives each setting's median over the rounds, its spread (min-max) and
the ratio token / no token. Authentication is a handshake per connection (control port, each TCP
data connection, the shm fd server), nothing per byte: the target is within 2%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from typing import Any

from tent_core import Engine, OpCode, Request
from tent_core.auth import new_token

MiB = 1 << 20
_TOKEN_VARS = ("TENT_AUTH_TOKEN", "TENT_AUTH_TOKEN_FILE")


def _target(size: int, token: str | None) -> tuple[subprocess.Popen[str], str]:
    env = {k: v for k, v in os.environ.items() if k not in _TOKEN_VARS}
    if token:
        env["TENT_AUTH_TOKEN"] = token
    p = subprocess.Popen([sys.executable, "-m", "tent_bench.target", "--size", str(size), "--pattern"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline() if p.stdout else ""
    if not line:
        p.kill()
        raise RuntimeError("bench target did not start")
    return p, json.loads(line)["segment"]


def _point(eng: Engine, buf: Any, seg: str, op: OpCode, size: int, budget_s: float) -> float:
    """GB/s of back-to-back single requests of `size` bytes for about `budget_s` seconds."""
    eng.submit([Request(op, buf, 0, seg, 0, size)]).wait()  # warm: connections, mappings
    moved = 0
    t0 = time.perf_counter()
    while True:
        eng.submit([Request(op, buf, 0, seg, 0, size)]).wait()
        moved += size
        dt = time.perf_counter() - t0
        if dt >= budget_s:
            return moved / dt / 1e9


def run(sizes: tuple[int, ...] = (4 * MiB, 64 * MiB), transports: tuple[str, ...] = ("tcp", "shm"),
        ops: tuple[str, ...] = ("READ", "WRITE"), rounds: int = 7, budget_s: float = 0.6) -> dict[str, Any]:
    token = new_token()
    saved = {k: os.environ.pop(k) for k in _TOKEN_VARS if k in os.environ}  # the no-token engines must not see one
    samples: dict[tuple[str, str, int, str], list[float]] = {}
    try:
        with ExitStack() as stack:
            targets = {}
            for mode, tok in (("token", token), ("none", None)):
                p, seg = _target(max(sizes), tok)
                stack.callback(lambda p=p: (p.stdin and p.stdin.close(), p.wait(10)))
                targets[mode] = seg
            engines = {}
            for mode in ("token", "none"):
                for t in transports:
                    cfg = {"auth_token": token} if mode == "token" else {}
                    eng = stack.enter_context(Engine(cfg, transports=[t]))
                    if t not in eng.transports:
                        raise RuntimeError(f"transport {t} unavailable: {eng.availability.get(t)}")
                    engines[(mode, t)] = (eng, eng.allocate(max(sizes)))
            for r in range(rounds):
                order = ("token", "none") if r % 2 == 0 else ("none", "token")
                for t in transports:
                    for op in ops:
                        for size in sizes:
                            for mode in order:
                                eng, buf = engines[(mode, t)]
                                gbps = _point(eng, buf, targets[mode], OpCode[op], size, budget_s)
                                samples.setdefault((t, op, size, mode), []).append(gbps)
    finally:
        os.environ.update(saved)
    rows = []
    for t in transports:
        for op in ops:
            for size in sizes:
                tok, none = samples[(t, op, size, "token")], samples[(t, op, size, "none")]
                mt, mn = statistics.median(tok), statistics.median(none)
                rows.append({
                    "transport": t, "op": op, "size_MiB": size // MiB,
                    "token_gbps": round(mt, 2), "token_spread": [round(min(tok), 2), round(max(tok), 2)],
                    "none_gbps": round(mn, 2), "none_spread": [round(min(none), 2), round(max(none), 2)],
                    "ratio": round(mt / mn, 3),
                })
    return {"bench": "auth_cost", "rounds": rounds, "budget_s": budget_s, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.auth_cost", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="4M,64M", help="comma-separated sizes in MiB suffixed M (4M,64M)")
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--budget", type=float, default=0.6, help="seconds per point and round")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sizes = tuple(int(s.strip().upper().removesuffix("M")) * MiB for s in a.sizes.split(",") if s.strip())
    res = run(sizes, tuple(a.transports.split(",")), rounds=a.rounds, budget_s=a.budget)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print("| transport | op | size | no token GB/s (min-max) | token GB/s (min-max) | token / no token |")
    print("|---|---|---|---|---|---|")
    for row in res["rows"]:
        print(f"| {row['transport']} | {row['op']} | {row['size_MiB']} MiB | {row['none_gbps']:.2f} "
              f"({row['none_spread'][0]:.2f}-{row['none_spread'][1]:.2f}) | {row['token_gbps']:.2f} "
              f"({row['token_spread'][0]:.2f}-{row['token_spread'][1]:.2f}) | **{row['ratio']:.3f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
