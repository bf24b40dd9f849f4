"""Quick throughput sanity for the shm transport (not a test).

64 MiB READs from a target process: executor in CMA and memfd mode vs one bare
process_vm_readv of the same bytes and vs a numpy memcpy. Pre-faulted, reused buffers.

    .venv/bin/python plugins/shm/bench/shm_throughput.py [--size MiB] [--iters N] [--threads T]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))

from test_shm import READ, Target, make_transport, one  # noqa: E402


class _Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _median_gbps(size: int, fn, iters: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return size / statistics.median(times) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=64, help="MiB")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=4 << 20)
    a = ap.parse_args()
    size = a.size << 20
    t = Target([{"name": "m", "size": size, "memfd": True}])
    try:
        dst = np.ones(size, np.uint8)  # pre-faulted
        libc = ctypes.CDLL(None, use_errno=True)
        lv, rv = _Iov(dst.ctypes.data, size), _Iov(t.addr("m"), size)

        def bare() -> None:
            n = libc.process_vm_readv(t.pid, ctypes.byref(lv), 1, ctypes.byref(rv), 1, 0)
            assert n == size, ctypes.get_errno()

        src = np.ones(size, np.uint8)
        results = {"bare process_vm_readv": _median_gbps(size, bare, a.iters)}
        results["numpy memcpy"] = _median_gbps(size, lambda: np.copyto(dst, src), a.iters)
        for mode in ("cma", "memfd"):
            tr = make_transport(mode, threads=a.threads, chunk=a.chunk)
            pl = tr.connect(t.peer(), t.bufs)

            def run(tr=tr, h=pl.handle) -> None:
                b = one(tr, READ, dst.ctypes.data, t.addr("m"), size, h)
                assert b.wait(30) and b.error == 0

            results[f"executor {mode}"] = _median_gbps(size, run, a.iters)
            tr.close()
        for k, v in results.items():
            print(f"{k:24s} {v:7.2f} GB/s")
        print(f"cma / bare   = {results['executor cma'] / results['bare process_vm_readv']:.2f}x  (target >= 0.9)")
        print(f"memfd / memcpy = {results['executor memfd'] / results['numpy memcpy']:.2f}x  (target >= 0.7)")
    finally:
        t.close()


if __name__ == "__main__":
    main()
