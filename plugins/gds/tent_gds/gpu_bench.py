"""File -> GPU memory through the gds transport's cuFile path, next to cuFile called directly
and to the host-staged way (pread into pinned memory, then a copy to the device), in one run.

    python -m tent_gds.gpu_bench --size 1G --iters 5 --dir /var/tmp

Needs a CUDA device, PyTorch with CUDA and libcufile (the nvidia-cufile wheel). Prints one JSON
object; ``ok`` is false with a ``reason`` where something is missing. Run by scripts/gpu_check.sh.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from tent_core import READ_ONLY, Engine

from .bench import parse_size, prepare_file
from .plugin import find_cufile_library


class _CfError(ctypes.Structure):
    _fields_ = [("err", ctypes.c_int), ("cu_err", ctypes.c_int)]


class _CfDescr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("fd", ctypes.c_void_p), ("fs_ops", ctypes.c_void_p)]


def _best_gbps(size: int, iters: int, fn: Callable[[], None], sync: Callable[[], None]) -> float:
    fn()  # warm-up: registration, first-touch, page cache
    sync()
    best = float("inf")
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e9


def run(size: int, iters: int, directory: str) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"ok": False, "reason": "PyTorch is not installed"}
    if not torch.cuda.is_available():
        return {"ok": False, "reason": "no CUDA device"}
    private = tempfile.mkdtemp(prefix="tent-gds-gpu-bench-", dir=directory)  # mode 0700, removed below
    try:
        return _run(torch, size, iters, os.path.join(private, "data.bin"))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _run(torch: Any, size: int, iters: int, path: str) -> dict[str, Any]:
    prepare_file(path, size)
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(size, dtype=torch.uint8, pin_memory=True)
    res: dict[str, Any] = {"size": size, "iters": iters, "file": path}
    with Engine(transports=["gds"]) as eng:
        gds = eng.transports.get("gds")
        if gds is None or not gds.cufile_active:
            reason = gds.cufile_reason if gds is not None else eng.availability["gds"].reason
            return {"ok": False, "reason": f"cuFile unusable: {reason}"}
        eng.register_file(path, segment="bench-file", perm=READ_ONLY)
        buf = eng.register(dev)
        seg = eng.segment_name("bench-file")
        res["tent_gbps"] = _best_gbps(size, iters, lambda: eng.read(buf, seg, size, timeout=600), torch.cuda.synchronize)
        stats = gds.stats()
        eng.unregister(buf)

    lib = ctypes.CDLL(find_cufile_library() or "libcufile.so.0")
    lib.cuFileDriverOpen.restype = _CfError
    lib.cuFileHandleRegister.restype = _CfError
    lib.cuFileBufRegister.restype = _CfError
    lib.cuFileRead.restype = ctypes.c_ssize_t
    lib.cuFileRead.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_int64]
    assert lib.cuFileDriverOpen().err == 0
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    descr = _CfDescr(1, fd, None)
    fh = ctypes.c_void_p()
    err = lib.cuFileHandleRegister(ctypes.byref(fh), ctypes.byref(descr))
    if err.err != 0:  # cuFile refuses files here: the engine served them through its bounce buffer
        res["cufile_gbps"] = None
        res["cufile_refused"] = f"cuFileHandleRegister: error {err.err} (cuda {err.cu_err}) for a file in {os.path.dirname(path)}"
    else:
        ptr = ctypes.c_void_p(dev.data_ptr())
        lib.cuFileBufRegister(ptr, ctypes.c_size_t(size), 0)

        def cufile_read() -> None:
            n = lib.cuFileRead(fh, ptr, size, 0, 0)
            assert n == size, n

        res["cufile_gbps"] = _best_gbps(size, iters, cufile_read, torch.cuda.synchronize)
        lib.cuFileBufDeregister(ptr)
        lib.cuFileHandleDeregister(fh)
    os.close(fd)

    host_fd = os.open(path, os.O_RDONLY)
    view = memoryview(pinned.numpy())

    def staged() -> None:
        got = os.preadv(host_fd, [view], 0)
        assert got == size, got
        dev.copy_(pinned, non_blocking=True)

    res["staged_gbps"] = _best_gbps(size, iters, staged, torch.cuda.synchronize)
    os.close(host_fd)
    res["ratio_vs_cufile"] = res["tent_gbps"] / res["cufile_gbps"] if res["cufile_gbps"] else None
    res["tent_path"] = {k: v for k, v in stats.items() if k in ("gpu_bytes", "bounce_bytes")}
    res["ratio_vs_staged"] = res["tent_gbps"] / res["staged_gbps"]
    res["ok"] = True
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1G")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"))
    a = ap.parse_args()
    print(json.dumps(run(parse_size(a.size), a.iters, a.dir)))


if __name__ == "__main__":
    main()
