"""Drive GPU <-> file transfers through the gds transport's cuFile path against a stand-in
library (cufile_double.c) and print what happened as JSON.

Runs in its own process (the test starts it): the executor loads cuFile once per process, and
the stand-in must not leak into the other tests. Usage: cufile_double_run.py LIB DIR SCENARIO
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tent_core import READ, READ_ONLY, WRITE, Engine, NoPathError, PermissionDeniedError, Request
from tent_core.errors import InvalidRequestError
from tent_core.types import MemoryKind


class DeviceArrayStandIn:
    """Host memory presented through ``__cuda_array_interface__`` (the stand-in's "device")."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.arr.size,), "typestr": "|u1", "data": (self.arr.ctypes.data, False), "version": 3}


def counters(lib: ctypes.CDLL) -> dict[str, int]:
    out = (ctypes.c_int64 * 8)()
    lib.cufile_double_counters(out)
    keys = ("driver_open", "driver_close", "handles_live", "bufs_live", "reads", "writes", "ctx_miss", "range_miss")
    return dict(zip(keys, (int(v) for v in out), strict=True))


def active(lib_path: str, work: Path, double: ctypes.CDLL) -> dict[str, Any]:
    res: dict[str, Any] = {}
    n = (3 << 20) + 5  # several executor chunks and a short tail
    data = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
    path = work / "weights.bin"
    data.tofile(path)
    cfg = {"transports": {"gds": {"cufile": "on", "cufile_lib": lib_path, "cuda_lib": lib_path, "threads": 4, "chunk": 1 << 20}}}
    with Engine(cfg, transports=["gds"]) as eng:
        gds = eng.transports["gds"]
        res["active"] = gds.cufile_active
        res["cuda_pair"] = (MemoryKind.CUDA, MemoryKind.FILE) in gds.capabilities().kind_pairs
        eng.register_file(str(path), segment="files")
        dev_mem = np.zeros(n, np.uint8)
        dev = eng.register(DeviceArrayStandIn(dev_mem))
        res["kind"] = dev.kind.value
        res["bufs_after_register"] = counters(double)["bufs_live"]
        double.cufile_double_current_ctx.restype = ctypes.c_void_p
        res["caller_ctx_kept"] = double.cufile_double_current_ctx() is None  # registering did not leave it switched

        try:  # a second registration over the same device memory
            eng.register(DeviceArrayStandIn(dev_mem[4096:8192]))
            res["overlap_refused"] = ""
        except InvalidRequestError as exc:
            res["overlap_refused"] = str(exc)
        res["bufs_after_overlap"] = counters(double)["bufs_live"]

        eng.read(dev, eng.segment_name("files"), n, timeout=30)
        res["read_ok"] = bool(np.array_equal(dev_mem, data))

        dev_mem[:] = np.random.default_rng(8).integers(0, 256, n, dtype=np.uint8)
        eng.write(dev, eng.segment_name("files"), n - 4101, local_offset=4101, remote_offset=17, timeout=30)
        on_disk = np.fromfile(path, np.uint8)
        res["write_ok"] = bool(
            np.array_equal(on_disk[17 : 17 + n - 4101], dev_mem[4101:]) and np.array_equal(on_disk[:17], data[:17])
        )

        # one batch mixing host memory and "device" memory: each slice takes its own path
        host_mem = np.zeros(1 << 20, np.uint8)
        hb = eng.register(host_mem)
        dev_mem[:] = 0
        seg = eng.segment_name("files")
        h = eng.submit([Request(READ, dev, 0, seg, 0, 1 << 20), Request(READ, hb, 0, seg, 1 << 20, 1 << 20)])
        res["mixed_ok"] = bool(
            h.wait(30) and np.array_equal(dev_mem[: 1 << 20], on_disk[: 1 << 20])
            and np.array_equal(host_mem, on_disk[1 << 20 : 2 << 20])
        )

        ro_path = work / "ro.bin"
        data[:8192].tofile(ro_path)
        eng.register_file(str(ro_path), segment="ro", perm=READ_ONLY)
        try:
            eng.submit([Request(WRITE, dev, 0, eng.segment_name("ro"), 0, 4096)])
            res["ro_refused"] = False
        except PermissionDeniedError:
            res["ro_refused"] = True

        res["stats"] = gds.stats()
        eng.unregister(dev)
        res["bufs_after_unregister"] = counters(double)["bufs_live"]
        res["handles_before_close"] = counters(double)["handles_live"]
    res["after_close"] = counters(double)
    return res


def ordered(lib_path: str, work: Path, double: ctypes.CDLL) -> dict[str, Any]:
    """Requests that wait for a CUDA event (the stand-in's events are host ints): the executor's
    workers hold the I/O until the event is done; past the deadline the batch fails."""
    import time

    from tent_core import DeadlineExceededError
    from tent_core.errors import TentError

    res: dict[str, Any] = {}
    n = (2 << 20) + 3
    data = np.random.default_rng(11).integers(0, 256, n, dtype=np.uint8)
    path = work / "w.bin"
    data.tofile(path)
    cfg = {"transports": {"gds": {"cufile": "on", "cufile_lib": lib_path, "cuda_lib": lib_path, "threads": 2, "chunk": 1 << 20}}}
    with Engine(cfg, transports=["gds"]) as eng:
        gds = eng.transports["gds"]
        eng.register_file(str(path), segment="files")
        dev_mem = np.zeros(n, np.uint8)
        dev = eng.register(DeviceArrayStandIn(dev_mem))
        seg = eng.segment_name("files")
        event = ctypes.c_int(0)
        reads = counters(double)["reads"]
        h = eng.submit([Request(READ, dev, 0, seg, 0, n, wait_event=ctypes.addressof(event))], deadline=30)
        res["ordering"] = h.ordering
        time.sleep(0.3)
        res["held"] = h.poll() == "pending" and counters(double)["reads"] == reads and not dev_mem.any()
        event.value = 1  # the producer finished
        res["done"] = bool(h.wait(30)) and bool(np.array_equal(dev_mem, data))
        res["ordered_chunks"] = gds.stats()["ordered_chunks"]
        never = ctypes.c_int(0)
        t0 = time.monotonic()
        h = eng.submit([Request(READ, dev, 0, seg, 0, 4096, wait_event=ctypes.addressof(never))], deadline=0.5)
        try:
            h.wait()
            res["deadline"] = "completed"
        except DeadlineExceededError:
            res["deadline"] = "deadline"
        except TentError as exc:
            res["deadline"] = type(exc).__name__
        res["deadline_s"] = time.monotonic() - t0
        end = time.monotonic() + 10
        while h._batch.remaining and time.monotonic() < end:
            time.sleep(0.01)
        res["finalized"] = h._batch.remaining == 0
    return res


def refused(lib_path: str, work: Path, double: ctypes.CDLL) -> dict[str, Any]:
    """cuFile refuses every file handle (as a real GPU machine did for files on its /tmp): GPU I/O on
    those files runs through the executor's host bounce buffer, byte-exact, without a failed slice."""
    os.environ["CUFILE_DOUBLE_REFUSE_HANDLES"] = "1"
    res: dict[str, Any] = {}
    n = (9 << 20) + 4101  # more than one bounce buffer, an odd tail
    data = np.random.default_rng(21).integers(0, 256, n, dtype=np.uint8)
    path = work / "w.bin"
    data.tofile(path)
    cfg = {"transports": {"gds": {"cufile": "on", "cufile_lib": lib_path, "cuda_lib": lib_path, "threads": 2, "chunk": 4 << 20}}}
    with Engine(cfg, transports=["gds"]) as eng:
        gds = eng.transports["gds"]
        res["active"] = gds.cufile_active
        eng.register_file(str(path), segment="files")
        dev_mem = np.zeros(n, np.uint8)
        dev = eng.register(DeviceArrayStandIn(dev_mem))
        seg = eng.segment_name("files")
        eng.read(dev, seg, n, timeout=60)
        res["read_ok"] = bool(np.array_equal(dev_mem, data))
        dev_mem[:] = np.random.default_rng(22).integers(0, 256, n, dtype=np.uint8)
        eng.write(dev, seg, n - 7, local_offset=7, remote_offset=3, timeout=60)
        on_disk = np.fromfile(path, np.uint8)
        res["write_ok"] = bool(np.array_equal(on_disk[3 : 3 + n - 7], dev_mem[7:]) and on_disk[0] == data[0])
        res["stats"] = gds.stats()
    copies = (ctypes.c_int64 * 2)()
    double.cufile_double_copies(copies)
    res["htod"], res["dtoh"] = int(copies[0]), int(copies[1])
    res["after_close"] = counters(double)
    return res


def no_device(lib_path: str, work: Path, double: ctypes.CDLL) -> dict[str, Any]:
    os.environ["CUFILE_DOUBLE_NO_DEVICE"] = "1"
    res: dict[str, Any] = {}
    path = work / "w.bin"
    np.ones(8192, np.uint8).tofile(path)
    cfg = {"transports": {"gds": {"cufile_lib": lib_path, "cuda_lib": lib_path}}}
    with Engine(cfg, transports=["gds"]) as eng:
        gds = eng.transports["gds"]
        res["active"] = gds.cufile_active
        res["reason"] = gds.cufile_reason
        eng.register_file(str(path), segment="files")
        dev = eng.register(DeviceArrayStandIn(np.zeros(8192, np.uint8)))
        try:
            eng.read(dev, eng.segment_name("files"), 8192, timeout=10)
            res["no_path"] = ""
        except NoPathError as exc:
            res["no_path"] = str(exc)
    res["after_close"] = counters(double)
    # cufile=on without a device: the transport does not start, and the engine says why
    with Engine({"transports": {"gds": {"cufile": "on", "cufile_lib": lib_path, "cuda_lib": lib_path}}}, transports=["gds"]) as eng:
        res["on_started"] = "gds" in eng.transports
        res["on_reason"] = eng.availability["gds"].reason
    return res


def main() -> None:
    lib_path, work, scenario = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    double = ctypes.CDLL(lib_path)
    fn = {"active": active, "no_device": no_device, "ordered": ordered, "refused": refused}[scenario]
    print(json.dumps(fn(lib_path, work, double)))


if __name__ == "__main__":
    main()
