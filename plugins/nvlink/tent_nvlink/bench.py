"""Two-process bandwidth of the nvlink transport vs plain cudaMemcpy, as one JSON line.

    python -m tent_nvlink.bench --size 256M --iters 10

A spawned child allocates a device buffer and exports it (CUDA IPC); the parent moves
`size` bytes with the transport (device <- peer device, pinned host -> peer device) and,
in the same run, with cudaMemcpy on the opened IPC pointer (the baseline).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import time
from typing import Any

CHILD_DEADLINE_S = 120


def _child(conn: Any, n: int) -> None:
    from tent_nvlink import cuda as c

    rt = c.runtime()
    rt.set_device(0)
    p = rt.malloc(n)
    base, size = c.driver().address_range(p)
    conn.send((p, c.pack_ipc_desc(rt.ipc_get(base), 0, p - base, size, os.getpid())))
    conn.recv()
    rt.free(p)


def _gbps(n: int, iters: int, fn: Any) -> float:
    fn()  # warm up
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return n * iters / (time.perf_counter() - t0) / 1e9


def run(size: int, iters: int) -> dict[str, Any]:
    from tent_core import _native, rails  # noqa: F401
    from tent_core.transport import TransportContext
    from tent_core.types import PeerInfo

    from . import cuda as c
    from .plugin import NvlinkTransport

    n_dev, why = c.device_status()
    if not n_dev:
        return {"ok": False, "reason": f"no CUDA device: {why}"}
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(child, size), daemon=True)
    proc.start()
    child.close()  # a child that dies now ends recv() with EOFError instead of a hang
    try:
        if not parent.poll(CHILD_DEADLINE_S):
            raise TimeoutError(f"the exporting child sent nothing within {CHILD_DEADLINE_S} s")
        addr, desc = parent.recv()
        rt = c.runtime()
        rt.set_device(0)
        local, pinned = rt.malloc(size), rt.malloc_host(size)
        t = NvlinkTransport()
        t.start(TransportContext(engine_id="bench", host_id="h", config={}, bind_host="127.0.0.1"))
        pl = t.connect(
            PeerInfo("child", "h", proc.pid or 0, {"nvlink": {"pid": proc.pid}}),
            [{"addr": addr, "length": size, "perm": 3, "kind": "cuda", "desc": {"nvlink": desc}}],
        )
        ex = t.executor

        def ours(op: int, src: int) -> None:
            b = _native.Batch(1)
            assert _native.submit_one(ex.ops, ex.handle, b, op, src, addr, size, pl.handle, 0, 0, 0) == 0
            assert b.wait(60) and b.error == 0, b.error

        peer_ptr = rt.ipc_open(bytes.fromhex(desc["ipc"]), 0) + int(desc["offset"])
        res = {
            "size": size,
            "iters": iters,
            "d2d_tent_gbps": _gbps(size, iters, lambda: ours(0, local)),
            # cudaMemcpy device->device returns before the copy is done: time it to completion
            "d2d_cudamemcpy_gbps": _gbps(size, iters, lambda: (rt.memcpy(local, peer_ptr, size), rt.synchronize())),
            "h2d_tent_gbps": _gbps(size, iters, lambda: ours(1, pinned)),
            "h2d_cudamemcpy_gbps": _gbps(size, iters, lambda: (rt.memcpy(peer_ptr, pinned, size), rt.synchronize())),
        }
        res["d2d_ratio"] = res["d2d_tent_gbps"] / res["d2d_cudamemcpy_gbps"]
        res["h2d_ratio"] = res["h2d_tent_gbps"] / res["h2d_cudamemcpy_gbps"]
        rt.ipc_close(peer_ptr - int(desc["offset"]))
        t.close()
        rt.free(local)
        rt.free_host(pinned)
        res["ok"] = True
        return {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}
    finally:
        try:
            parent.send("done")
        except (BrokenPipeError, OSError):
            pass  # the child is gone already
        proc.join(30)
        if proc.is_alive():
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--size", type=lambda s: int(float(s.rstrip("M")) * (1 << 20)) if s.endswith("M") else int(s), default=256 << 20
    )
    ap.add_argument("--iters", type=int, default=10)
    a = ap.parse_args()
    print(json.dumps(run(a.size, a.iters)))


if __name__ == "__main__":
    main()
