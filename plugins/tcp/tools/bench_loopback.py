"""Loopback throughput sanity check for the TCP executor (not a test).

    python plugins/tcp/tools/bench_loopback.py [--size-mib 64] [--slice-kib 1024] [--iters 10]
        [--threads 4] [--conns 2] [--sockbuf N] [--baseline]

Two processes: this one drives the executor through tent_core._native, a child serves
a registered buffer. Prints GB/s for WRITE and READ (and, with --baseline, a plain Python
socket stream of 4 MiB sendall/recv_into chunks between two processes for comparison).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


from tent_tcp.native import PERM_REMOTE_READ, PERM_REMOTE_WRITE, TcpExecutor  # noqa: E402

from tent_core import _native  # noqa: E402
from tent_core.abi import SLICE_DTYPE as SLICE  # noqa: E402


def serve(size: int, cfg: dict[str, int]) -> None:
    ex = TcpExecutor(cfg)
    port = ex.listen("127.0.0.1", 0)
    buf = np.ones(size, np.uint8)
    ex.register_region(buf.ctypes.data, size, PERM_REMOTE_READ | PERM_REMOTE_WRITE)
    print(json.dumps({"port": port, "addr": buf.ctypes.data}), flush=True)
    sys.stdin.readline()
    ex.close()


def _sink(port_q: mp.Queue, total: int) -> None:
    ls = socket.create_server(("127.0.0.1", 0))
    port_q.put(ls.getsockname()[1])
    c, _ = ls.accept()
    buf = bytearray(4 << 20)
    mv = memoryview(buf)
    got = 0
    while got < total:
        n = c.recv_into(mv)
        if not n:
            break
        got += n
    c.sendall(b"k")
    c.close()


def baseline(size: int, iters: int) -> float:
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    total = size * iters
    p = ctx.Process(target=_sink, args=(q, total))
    p.start()
    s = socket.create_connection(("127.0.0.1", q.get()))
    chunk = bytes(4 << 20)
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        s.sendall(chunk)
        sent += len(chunk)
    s.recv(1)
    dt = time.perf_counter() - t0
    s.close()
    p.join()
    return total / dt / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--size-mib", type=int, default=64)
    ap.add_argument("--slice-kib", type=int, default=1024)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--conns", type=int, default=2)
    ap.add_argument("--sockbuf", type=int, default=4 << 20)
    ap.add_argument("--baseline", action="store_true")
    ap.add_argument("--ops", default="WRITE,READ")
    a = ap.parse_args()
    size = a.size_mib << 20
    cfg = {"threads": a.threads, "conns_per_rail": a.conns, "sockbuf": a.sockbuf}
    if a.serve:
        serve(size, cfg)
        return
    srv = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            "--size-mib",
            str(a.size_mib),
            "--threads",
            "2",
            "--sockbuf",
            str(a.sockbuf),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert srv.stdout is not None and srv.stdin is not None
    hello = json.loads(srv.stdout.readline())
    ex = TcpExecutor(cfg)
    peer = ex.add_peer([""], ["127.0.0.1"], [hello["port"]])
    local = np.zeros(size, np.uint8)
    local[:] = 7
    sl = a.slice_kib << 10
    n = (size + sl - 1) // sl
    arr = np.zeros(n, SLICE)
    offs = np.arange(n, dtype=np.uint64) * sl
    arr["local_addr"] = local.ctypes.data + offs
    arr["remote_addr"] = hello["addr"] + offs
    arr["length"] = np.minimum(sl, size - offs.astype(np.int64))
    arr["peer"] = peer
    results = {}
    for name in a.ops.split(","):
        op = {"WRITE": 1, "READ": 0}[name]
        arr["opcode"] = op
        rates = []
        for i in range(a.iters + 1):
            b = _native.Batch(n)
            t0 = time.perf_counter()
            assert _native.submit(ex.ops, ex.handle, b, arr) == 0
            assert b.wait(60.0) and b.error == 0, b.error
            dt = time.perf_counter() - t0
            if i:  # first iteration warms up connections
                rates.append(size / dt / 1e9)
        results[name] = (float(np.median(rates)), max(rates))
        print(
            f"{name:5s} {a.size_mib} MiB x{a.iters} slice {a.slice_kib} KiB threads {a.threads} conns {a.conns}: "
            f"median {results[name][0]:.2f} GB/s, best {results[name][1]:.2f} GB/s",
            flush=True,
        )
    ex.close()
    srv.stdin.write("\n")
    srv.stdin.flush()
    srv.wait(10)
    if a.baseline:
        print(f"python socket baseline (4 MiB sendall/recv_into): {baseline(size, a.iters):.2f} GB/s")


if __name__ == "__main__":
    main()
