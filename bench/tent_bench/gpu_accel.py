"""GPU checks of issue 15's paths, for scripts/gpu_check.sh on a machine with a CUDA device.

    python -m tent_bench.gpu_accel --size 256M

Prints one JSON line. Each check runs on its own and reports its error instead of stopping the rest:

* ``target_staging``: host memory here -> CUDA memory in another process over TCP only (the target
  stages with nvlink on its self-peer), byte-exact both ways, throughput against the same transfer
  into the target's host memory (the wire alone);
* ``read_only``: a READ-only CUDA buffer is not shared over CUDA IPC; a same-host peer with nvlink
  reaches it through the owner's staging (explained) and reads the right bytes;
* ``ordering``: a READ that waits for an event recorded after a slow producer on the caller's
  stream sees the produced bytes (the nvlink executor's stream waits), and a signal event lets a
  consumer stream copy the result;
* ``refhub``: CUDA tensors published and replicated in direct and copy mode, checksums on the GPU;
* ``backend``: which CUDA API was used (cuda.bindings or ctypes).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
import traceback
from typing import Any

import numpy as np

MiB = 1 << 20


class CudaMem:
    """cudaMalloc'd memory with __cuda_array_interface__ (what torch/CuPy tensors offer)."""

    def __init__(self, n: int) -> None:
        from tent_core import cuda as tc

        self.api = tc.api()
        self.api.set_device(0)
        self.n, self.ptr = n, self.api.malloc(n)
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (self.ptr, False), "version": 2,
                                         "strides": None}
        self.device = type("D", (), {"id": 0})()

    def upload(self, a: np.ndarray) -> None:
        self.api.memcpy(self.ptr, a.ctypes.data, a.nbytes)

    def download(self) -> np.ndarray:
        out = np.empty(self.n, np.uint8)
        self.api.memcpy(out.ctypes.data, self.ptr, self.n)
        return out


def _target(conn: Any, n: int) -> None:
    from tent_core import READ_ONLY, Engine
    from tent_core.testing import pattern

    eng = Engine({"target_staging_chunk_bytes": 4 * MiB}, transports=["tcp", "nvlink"])
    rw, ro = CudaMem(n), CudaMem(n)
    ro.upload(pattern(n, 5))
    eng.register(rw, segment="dev")
    eng.register(ro, segment="devro", perm=READ_ONLY)
    eng.allocate(n, segment="host")
    conn.send(eng.engine_id)
    while True:
        cmd = conn.recv()
        if cmd == "quit":
            break
        conn.send(bool(np.array_equal(rw.download(), pattern(n, cmd))))
    eng.close()


def check_target_staging(n: int) -> dict[str, Any]:
    from tent_core import READ, WRITE, Engine, Request
    from tent_core.simdev import SimDevicePlugin  # noqa: F401  (import check only)
    from tent_core.testing import pattern

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_target, args=(child, n), daemon=True)
    proc.start()
    res: dict[str, Any] = {}
    try:
        if not parent.poll(120):
            raise TimeoutError("target did not start")
        remote = parent.recv()
        with Engine(transports=["tcp"]) as eng:
            buf = eng.allocate(n)
            buf.array[:] = pattern(n, 9)
            res["path"] = eng.explain(Request(WRITE, buf, 0, f"{remote}/dev", 0, n)).chosen
            eng.transfer(WRITE, buf, 0, f"{remote}/dev", 0, n, timeout=120)
            parent.send(9)
            res["write_exact"] = parent.recv()
            out = eng.allocate(n)
            eng.transfer(READ, out, 0, f"{remote}/dev", 0, n, timeout=120)
            res["read_exact"] = bool(np.array_equal(out.array, pattern(n, 9)))
            rounds = []
            for _ in range(5):
                t = time.perf_counter()
                eng.transfer(WRITE, buf, 0, f"{remote}/host", 0, n, timeout=120)
                wire = time.perf_counter() - t
                t = time.perf_counter()
                eng.transfer(WRITE, buf, 0, f"{remote}/dev", 0, n, timeout=120)
                staged = time.perf_counter() - t
                rounds.append((n / wire / 1e9, n / staged / 1e9))
            res["wire_GBps"] = float(np.median([r[0] for r in rounds]))
            res["staged_GBps"] = float(np.median([r[1] for r in rounds]))
            res["ratio_median"] = float(np.median([r[1] / r[0] for r in rounds]))
            res["ratio_spread"] = [float(min(r[1] / r[0] for r in rounds)), float(max(r[1] / r[0] for r in rounds))]
        with Engine(transports=["tcp", "nvlink"]) as eng:  # same host, with nvlink: READ-only stays local there
            dst = CudaMem(n)
            lb = eng.register(dst, segment="mine")
            ex = eng.explain(Request(READ, lb, 0, f"{remote}/devro", 0, n))
            eng.transfer(READ, lb, 0, f"{remote}/devro", 0, n, timeout=120)
            res["read_only"] = {"path": ex.chosen, "exact": bool(np.array_equal(dst.download(), pattern(n, 5))),
                                "rw_path": eng.explain(Request(READ, lb, 0, f"{remote}/dev", 0, n)).chosen}
        res["ok"] = bool(res["write_exact"] and res["read_exact"] and res["path"] == "target-staged"
                         and res["read_only"]["exact"] and res["read_only"]["path"] != "direct")
        return res
    finally:
        try:
            parent.send("quit")
        except OSError:
            pass
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def check_ordering(n: int) -> dict[str, Any]:
    from tent_core import READ, Engine, Request
    from tent_core import cuda as tc
    from tent_core.testing import pattern

    api = tc.api()
    with Engine(transports=["nvlink"]) as eng:
        src, dst = CudaMem(n), CudaMem(n)
        eng.register(src, segment="src")
        host = eng.allocate(n)
        staged = api.malloc_host(n)
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * n).from_address(staged))[:] = pattern(n, 3)
        user = api.stream_create()
        api.launch_host_func(user, lambda: time.sleep(0.3))  # a slow producer...
        api.memcpy_async(src.ptr, staged, n, user)  # ...whose result is the pattern
        ev = api.event_create()
        api.event_record(ev, user)
        t0 = time.perf_counter()
        h = eng.submit([Request(READ, host, 0, eng.segment_name("src"), 0, n, wait_event=ev)])
        submit_s = time.perf_counter() - t0
        h.wait(30)
        waited = bool(np.array_equal(host.array, pattern(n, 3)))
        # signal: a consumer stream copies what the transfer wrote, after the signal
        done = api.event_create()
        lb = eng.register(dst, segment="dst")
        host.array[:] = pattern(n, 4)
        h2 = eng.submit([Request(READ, lb, 0, eng.segment_name("src"), 0, n, signal_event=done)])
        cons = api.stream_create()
        api.stream_wait_event(cons, done)
        api.memcpy_async(staged, dst.ptr, n, cons)
        api.stream_synchronize(cons)
        signalled = h2.poll() == "done" and bool(np.array_equal(
            np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * n).from_address(staged)), pattern(n, 3)))
        st = eng.transports["nvlink"].stats()
        return {"ok": waited and signalled and h.ordering == "native", "ordering": h.ordering, "submit_s": submit_s,
                "waited_for_producer": waited, "signal": signalled, "ordered_copies": st.get("ordered", 0)}


def check_refhub(n: int) -> dict[str, Any]:
    from refhub.server import start_embedded, stop_embedded

    from refhub import client as C
    from tent_core import Engine
    from tent_core.testing import pattern

    addr = start_embedded(hb_timeout=3.0)
    out: dict[str, Any] = {}
    try:
        with Engine(transports=["tcp", "nvlink"]) as eng:
            for pm, rm in (("direct", "direct"), ("copy", "copy"), ("direct", "copy")):
                sizes = [n, 3 * MiB + 5, 1000]
                src = [CudaMem(s) for s in sizes]
                for i, t in enumerate(src):
                    t.upload(pattern(sizes[i], 20 + i))
                p = C.open("g", replica=f"p{pm}{rm}", server=addr, mode=pm, engine=eng)
                for i, t in enumerate(src):
                    p.register(f"t{i}", t)
                t0 = time.perf_counter()
                p.publish(1)
                pub_s = time.perf_counter() - t0
                r = C.open("g", replica=f"r{pm}{rm}", server=addr, mode=rm, engine=eng)
                dst = [CudaMem(s) for s in sizes]
                for i, t in enumerate(dst):
                    r.register(f"t{i}", t)
                r.replicate(1, timeout=120)
                exact = all(np.array_equal(d.download(), pattern(s, 20 + i)) for i, (d, s) in enumerate(zip(dst, sizes, strict=True)))
                out[f"{pm}/{rm}"] = {"exact": exact, "GBps": r.stats.get("GBps"), "verified": r.stats.get("verified"),
                                     "device_checksums": r.stats.get("device_checksums"), "publish_s": pub_s}
                r.close()
                p.close()
    finally:
        stop_embedded(addr)
    out["ok"] = all(v["exact"] and v["verified"] for v in out.values() if isinstance(v, dict))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="256M")
    a = ap.parse_args()
    t = a.size.upper()
    n = int(float(t[:-1]) * (1 << {"K": 10, "M": 20, "G": 30}[t[-1]])) if t[-1] in "KMG" else int(t)
    from tent_core import cuda as tc

    count, why = tc.device_status()
    res: dict[str, Any] = {"backend": tc.backend(), "devices": count}
    if not count:
        print(json.dumps({**res, "ok": False, "reason": f"no CUDA device: {why}"}))
        return
    os.environ.setdefault("CUPY_CUDA_ARRAY_INTERFACE_EXPORT_VERSION", "3")
    for name, fn in (("target_staging", check_target_staging), ("ordering", check_ordering), ("refhub", check_refhub)):
        try:
            res[name] = fn(n if name != "ordering" else min(n, 64 * MiB))
        except Exception as exc:
            res[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    res["ok"] = all(res[k].get("ok") for k in ("target_staging", "ordering", "refhub"))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
