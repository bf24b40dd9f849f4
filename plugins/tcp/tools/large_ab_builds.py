"""Interleaved A/B of tcp executor builds on large READs and WRITEs (not a test).

    python plugins/tcp/tools/large_ab_builds.py [--block 4M] [--rounds 12] [--iters 30] [--ops READ,WRITE]
        LIB [LIB ...]

Each LIB is a compiled executor (`_executor*.so`, e.g. this checkout's `plugins/tcp/tent_tcp/`
one and another built from main with `gcc -O2 -shared -fPIC -fvisibility=hidden -pthread
-I tent_core/include -o /tmp/main.so plugins/tcp/csrc/tcp_executor.c`), optionally followed by
`@{json}` with extra config for its server and `@{json}` for its client. Every build gets its own
server process (a memfd buffer, as the engine allocates) and client executor (4 connections, 1 MiB
slices, as the transport's defaults); each round runs every build once per op, the order rotating,
so all see the same load. Prints per build the median GB/s (with the quartiles) and the median of
the per-round ratios to the first build: on a loaded, shared machine the ratio is what counts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from tent_tcp.native import PERM_REMOTE_READ, PERM_REMOTE_WRITE, TcpExecutor

from tent_core import _native
from tent_core.abi import SLICE_DTYPE
from tent_core.memory import MemfdBuffer

MiB = 1 << 20


def serve(lib: str, size: int, extra: str) -> None:
    ex = TcpExecutor({"threads": 2, "sockbuf": 4 << 20, **json.loads(extra)}, path=lib)
    port = ex.listen("127.0.0.1", 0)
    buf = MemfdBuffer(size)
    buf.array[:] = 1
    ex.register_region(buf.addr, size, PERM_REMOTE_READ | PERM_REMOTE_WRITE)
    print(json.dumps({"port": port, "addr": buf.addr}), flush=True)
    sys.stdin.readline()
    ex.close()


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


class Side:
    """One build: its server process, client executor, local buffer and the slices of one block."""

    def __init__(self, spec: str, block: int) -> None:
        parts = spec.split("@")
        self.name = os.path.basename(os.path.dirname(parts[0])) or parts[0]
        if len(parts) > 1:
            self.name += "@" + "@".join(parts[1:])
        self.srv = subprocess.Popen([sys.executable, __file__, "--serve", parts[0], str(block), parts[1] if len(parts) > 1 else "{}"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self.srv.stdout is not None
        hello = json.loads(self.srv.stdout.readline())
        extra = json.loads(parts[2]) if len(parts) > 2 else {}
        self.ex = TcpExecutor({"threads": 5, "conns_per_rail": 4, "sockbuf": 4 << 20, **extra}, path=parts[0])
        peer = self.ex.add_peer([""], ["127.0.0.1"], [hello["port"]])
        self.buf = MemfdBuffer(block)
        piece = min(block, MiB)  # the transport's split_bytes
        offs = np.arange(0, block, piece, dtype=np.uint64)
        self.slices = np.zeros(len(offs), SLICE_DTYPE)
        self.slices["local_addr"] = self.buf.addr + offs
        self.slices["remote_addr"] = hello["addr"] + offs
        self.slices["length"] = np.minimum(piece, block - offs.astype(np.int64))
        self.slices["peer"] = peer

    def move(self, op: str, times: int) -> None:
        self.slices["opcode"] = {"READ": 0, "WRITE": 1}[op]
        for _ in range(times):
            b = _native.Batch(len(self.slices))
            assert _native.submit(self.ex.ops, self.ex.handle, b, self.slices) == 0
            assert b.wait(60.0) and b.error == 0, b.error

    def close(self) -> None:
        self.ex.close()
        assert self.srv.stdin is not None
        self.srv.stdin.write("\n")
        self.srv.stdin.flush()
        self.srv.wait(10)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--block", default="4M")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--iters", type=int, default=30, help="blocks per build, op and round")
    ap.add_argument("--ops", default="READ,WRITE")
    ap.add_argument("libs", nargs="+")
    a = ap.parse_args()
    block = parse_size(a.block)
    ops = a.ops.split(",")
    sides = [Side(spec, block) for spec in a.libs]
    gbps: dict[tuple[int, str], list[float]] = {(i, op): [] for i in range(len(sides)) for op in ops}
    try:
        for r in range(a.rounds):
            for op in ops:
                order = list(range(len(sides)))
                for i in order[r % len(order) :] + order[: r % len(order)]:
                    sides[i].move(op, 2)  # warm: connections open, buffers hot
                    t0 = time.perf_counter()
                    sides[i].move(op, a.iters)
                    gbps[(i, op)].append(block * a.iters / (time.perf_counter() - t0) / 1e9)
    finally:
        for s in sides:
            s.close()
    for op in ops:
        for i, s in enumerate(sides):
            v = np.array(gbps[(i, op)])
            x = v / np.array(gbps[(0, op)])
            print(f"{op:5s} {a.block:>4s} {s.name:>12s}: {np.median(v):.2f} GB/s (quartiles {np.percentile(v, 25):.2f}-"
                  f"{np.percentile(v, 75):.2f}), x first build {np.median(x):.2f} ({np.percentile(x, 25):.2f}-{np.percentile(x, 75):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
