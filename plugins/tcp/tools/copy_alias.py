"""How fast the kernel copies a TCP payload into the socket, by where the copy lands (not a test).

    python plugins/tcp/tools/copy_alias.py [HEADER:SOURCE_OFFSET ...] [--iters 200]

One request/response exchange per message over loopback, as the executor's READ answers go: the
sender sendmsg()s a HEADER-byte header and 1 MiB taken SOURCE_OFFSET bytes into a page-aligned
buffer, the receiver reads it all and acks (so the sender's socket buffer pages are released and
the next message is copied into them from offset 0 again). Prints the sender's CPU time per MiB
inside sendmsg. The payload lands HEADER bytes into those pages: when that is 1-31 bytes ahead of
its source modulo 4 KiB (e.g. 24:0, the tcp READ answer before the wire-version-2 gap), the copy
runs 2-3x slower on this machine's x86 cores (4K aliasing); behind the source, level with it, or
32 bytes and more ahead, it runs at full speed (docs/benchmarks.md, "Why tcp READ was slower than
WRITE").
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing as mp
import socket
import time

import numpy as np

MiB = 1 << 20


def _sink(port: int, n: int, header: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = mmap.mmap(-1, 2 * MiB)
    mv = memoryview(buf)
    for _ in range(n):
        got, want = 0, header + MiB
        while got < want:
            got += s.recv_into(mv[got:want])
        s.sendall(b"k")
    s.close()


def sendmsg_cpu_us_per_mib(header: int, src_off: int, iters: int) -> float:
    m = mmap.mmap(-1, 2 * MiB)  # page aligned
    np.frombuffer(m, np.uint8)[:] = 3
    ls = socket.create_server(("127.0.0.1", 0))
    p = mp.get_context("fork").Process(target=_sink, args=(ls.getsockname()[1], iters, header))
    p.start()
    c, _ = ls.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):  # the executor's sockbuf
        c.setsockopt(socket.SOL_SOCKET, opt, 4 * MiB)
    mv, hdr, cpu = memoryview(m), bytes(header), 0.0
    for _ in range(iters):
        t = time.thread_time()
        c.sendmsg([hdr, mv[src_off : src_off + MiB]] if header else [mv[src_off : src_off + MiB]])
        cpu += time.thread_time() - t
        c.recv(1)
    p.join(30)
    c.close()
    ls.close()
    return cpu / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=["24:0", "8:0", "32:0", "64:0", "24:24", "24:64", "64:40"])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    cases = [tuple(int(x) for x in c.split(":")) for c in a.cases]
    for _ in range(a.rounds):
        print("  ".join(f"hdr {h:2d} src+{s:<4d} (ahead {(h - s) % 4096:4d}): {sendmsg_cpu_us_per_mib(h, s, a.iters):4.0f} us/MiB"
                        for h, s in cases), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
