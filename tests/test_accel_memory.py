"""Registering accelerator memory without an accelerator: `__cuda_array_interface__` objects (and
real CuPy arrays where CuPy imports), DLPack capsules, `__tent_memory__`; CUDA through cuda-python's
bindings or ctypes; the CUDA device runtime's ordering and checksum logic over a recording API.
None of this proves CUDA works (scripts/gpu_check.sh does, on a GPU machine)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from test_memory_dlpack import DLPackOnly

from tent_core import READ_ONLY, Engine, InvalidRequestError, devices
from tent_core import cuda as tc
from tent_core.memory import describe
from tent_core.types import MemoryKind


class CAI:
    """A stand-in producer speaking __cuda_array_interface__ over host memory (never dereferenced)."""

    def __init__(self, arr: np.ndarray, version: int = 3, readonly: bool = False, strides: Any = None,
                 mask: Any = None, device: Any = None, shape: Any = None, typestr: str | None = None) -> None:
        self.arr = arr
        self.device = device
        self.__cuda_array_interface__ = {
            "shape": shape if shape is not None else arr.shape, "typestr": typestr or arr.dtype.str,
            "data": (arr.ctypes.data, readonly), "version": version, "strides": strides, "mask": mask,
            **({"stream": 1} if version >= 3 else {}),
        }


class Dev:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def test_cuda_array_interface_regions() -> None:
    a = np.zeros((4, 8), np.float32)
    r = describe(CAI(a, device=Dev(id=3)))  # CuPy: device.id
    assert (r.kind, r.addr, r.length, r.device, r.readonly) == (MemoryKind.CUDA, a.ctypes.data, 128, 3, False)
    assert describe(CAI(a, device=Dev(index=1))).device == 1  # torch: device.index
    assert describe(CAI(a)).device == -1  # unknown: the transport asks the runtime
    assert describe(CAI(a, strides=(32, 4))).length == 128  # explicit C strides are contiguous
    assert describe(CAI(a, version=2)).length == 128
    with pytest.raises(InvalidRequestError, match="contiguous"):
        describe(CAI(a, strides=(4, 16)))  # a transposed view
    with pytest.raises(InvalidRequestError, match="masked"):
        describe(CAI(a, mask=object()))
    assert describe(CAI(a, shape=(0, 8))).length == 0
    assert describe(CAI(a, readonly=True)).readonly
    with pytest.raises(InvalidRequestError, match="lacks"):
        describe(type("Bad", (), {"__cuda_array_interface__": {"shape": (1,)}})())


def test_engine_registers_cuda_kinds_without_a_gpu() -> None:
    """Registration needs no GPU when no started transport moves CUDA memory (tcp only here)."""
    a = np.zeros(1 << 16, np.uint8)
    with Engine(transports=["tcp"]) as eng:
        b = eng.register(CAI(a, device=Dev(id=0)), segment="gpu")
        assert b.kind is MemoryKind.CUDA and b.length == a.nbytes and b.array is None
        d = eng.register(DLPackOnly(np.zeros(1000, np.float64), device=(2, 1)), segment="dl")
        assert d.kind is MemoryKind.CUDA and d.device == 1 and d.length == 8000
        table = eng.describe()["segments"]
        assert table["gpu"][0]["kind"] == "cuda" and table["dl"][0]["kind"] == "cuda"
        # a producer's read-only array cannot be offered for remote WRITEs
        with pytest.raises(InvalidRequestError, match="read-only"):
            eng.register(CAI(a, readonly=True), segment="ro")
        assert eng.register(CAI(a, readonly=True), segment="ro", perm=READ_ONLY).perm == READ_ONLY


def test_tent_memory_protocol() -> None:
    obj = type("T", (), {"__tent_memory__": {"addr": 1 << 60, "length": 64, "kind": "npu", "device": 2}})()
    r = describe(obj)
    assert (r.kind, r.addr, r.length, r.device) == (MemoryKind.NPU, 1 << 60, 64, 2)
    for bad in ({"addr": 1, "length": 1, "kind": "host"}, {"addr": 1, "kind": "cuda"}, {"addr": 0, "length": 1, "kind": "sim"}):
        with pytest.raises(InvalidRequestError):
            describe(type("B", (), {"__tent_memory__": bad})())


CUPY_PROBE = r"""
import json, os, sys
out = {}
try:
    import cupy
except Exception as exc:
    print(json.dumps({"import": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
import numpy as np
from tent_core import Engine
from tent_core.memory import describe
out["import"] = "ok " + cupy.__version__
try:
    cupy.zeros(4)
    out["alloc"] = "ok"
except Exception as exc:  # no driver here: CuPy imports but cannot allocate
    out["alloc"] = f"{type(exc).__name__}: {exc}"
host = np.zeros(1 << 20, np.uint8)
mem = cupy.cuda.UnownedMemory(host.ctypes.data, host.nbytes, host, device_id=0)
arr = cupy.ndarray((1 << 18,), cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))
r = describe(arr)
v = describe(arr[1024:2048])
out["region"] = [r.kind.value, r.addr == host.ctypes.data, r.length, r.device]
out["view"] = [v.addr - r.addr, v.length]
try:
    describe(arr[::2])
    out["strided"] = "accepted"
except Exception as exc:
    out["strided"] = type(exc).__name__
with Engine(transports=["tcp"]) as eng:
    b = eng.register(arr, segment="cupy")
    out["registered"] = [b.kind.value, b.length]
print(json.dumps(out))
"""


def test_cupy_arrays_register_where_cupy_imports() -> None:
    """Real CuPy arrays (over memory CuPy does not own: it cannot allocate without a driver) are
    described through their __cuda_array_interface__; version 2 export, since version 3 asks the
    driver for the current stream."""
    env = dict(os.environ, CUPY_CUDA_ARRAY_INTERFACE_EXPORT_VERSION="2")
    out = subprocess.run([sys.executable, "-c", CUPY_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["import"].startswith("ok"):
        pytest.skip(f"CuPy does not import here: {res['import']}")
    assert res["region"] == ["cuda", True, 1 << 20, 0]
    assert res["view"] == [4096, 4096]
    assert res["strided"] == "InvalidRequestError"
    assert res["registered"] == ["cuda", 1 << 20]


# ---------------------------------------------------------------- CUDA API selection


def test_cuda_backend_selection_and_reasons(monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        import cuda.bindings.runtime  # noqa: F401
        have_bindings = True
    except ImportError:
        have_bindings = False
    monkeypatch.delenv("TENT_CUDA_BACKEND", raising=False)
    tc.reset_for_tests()
    try:
        n, why = tc.device_status()
        if have_bindings:
            assert tc.backend() == "bindings"
        if n == 0:
            assert why  # the runtime's own words ("CUDA driver version is insufficient...", "cannot load libcudart")
        monkeypatch.setenv("TENT_CUDA_BACKEND", "ctypes")
        tc.reset_for_tests()
        n2, why2 = tc.device_status()
        assert tc.backend() in ("ctypes", "")
        if n2 == 0:
            assert why2
        monkeypatch.setenv("TENT_CUDA_BACKEND", "nonsense")
        tc.reset_for_tests()
        n3, why3 = tc.device_status()
        assert n3 == 0 and "TENT_CUDA_BACKEND" in why3
    finally:
        monkeypatch.delenv("TENT_CUDA_BACKEND", raising=False)
        tc.reset_for_tests()


def test_stream_and_event_handles_of_user_objects() -> None:
    class TorchStream:
        cuda_stream = 0x1234
    TorchStream.__module__ = "torch.cuda.streams"

    class CupyEvent:
        ptr = 0x77
    CupyEvent.__module__ = "cupy.cuda.stream"
    CupyEvent.__name__ = "Event"

    class NumbaStream:
        handle = ctypes.c_void_p(0x99)

    assert tc.stream_handle(TorchStream()) == 0x1234
    assert tc.event_handle(CupyEvent()) == 0x77
    assert tc.stream_handle(NumbaStream()) == 0x99
    assert tc.stream_handle(0) == 0 and tc.event_handle(5) == 5
    for bad in ("s", object(), True, 1.5):
        with pytest.raises(InvalidRequestError):
            tc.stream_handle(bad)
    rt = tc.CudaRuntime(FakeApi())
    assert rt.owns(TorchStream()) and rt.owns(CupyEvent()) and not rt.owns(NumbaStream())
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return
    s = cudart.cudaStream_t(0x4321)
    assert tc.stream_handle(s) == 0x4321 and rt.owns(s)


# ---------------------------------------------------------------- CudaRuntime over a recording API


class FakeApi(tc.CudaApi):
    """Records calls; 'device' memory is host memory; events are done when a test says so."""

    backend = "fake"

    def __init__(self, memops: bool = True) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.memops = memops
        self.done: set[int] = set()
        self._next = 100
        self.host_fns: list[Any] = []
        self.keep: list[Any] = []

    def _h(self) -> int:
        self._next += 1
        return self._next

    def device_count(self) -> int: return 0
    def set_device(self, dev: int) -> None: pass
    def pointer_device(self, ptr: int) -> int: return 0
    def malloc(self, n: int) -> int: raise NotImplementedError
    def free(self, p: int) -> None: pass

    def malloc_host(self, n: int, mapped: bool = False) -> int:
        buf = ctypes.create_string_buffer(n)
        self.keep.append(buf)
        return ctypes.addressof(buf)

    def free_host(self, p: int) -> None: pass
    def host_device_pointer(self, p: int) -> int: return p + (1 << 50)
    def host_register(self, p: int, n: int) -> None: self.calls.append(("pin", p, n))
    def host_unregister(self, p: int) -> None: self.calls.append(("unpin", p))
    def memcpy(self, dst: int, src: int, n: int) -> None: ctypes.memmove(dst, src, n)
    def memcpy_async(self, dst: int, src: int, n: int, stream: int) -> None: ctypes.memmove(dst, src, n)
    def memset(self, p: int, value: int, n: int) -> None: ctypes.memset(p, value, n)
    def synchronize(self) -> None: pass
    def ipc_get(self, base_ptr: int) -> bytes: return bytes(64)
    def ipc_open(self, handle: bytes, device: int) -> int: return 0
    def ipc_close(self, ptr: int) -> None: pass

    def stream_create(self) -> int:
        s = self._h()
        self.calls.append(("stream_create", s))
        return s

    def stream_destroy(self, s: int) -> None: self.calls.append(("stream_destroy", s))
    def stream_synchronize(self, s: int) -> None: pass
    def stream_wait_event(self, s: int, ev: int) -> None: self.calls.append(("wait_event", s, ev))

    def event_create(self) -> int:
        e = self._h()
        self.calls.append(("event_create", e))
        return e

    def event_destroy(self, ev: int) -> None: self.calls.append(("event_destroy", ev))
    def event_record(self, ev: int, s: int) -> None: self.calls.append(("record", ev, s))
    def event_query(self, ev: int) -> bool: return ev in self.done
    def address_range(self, ptr: int) -> tuple[int, int]: return ptr, 0

    def stream_wait_value32(self, s: int, dev_addr: int, value: int) -> None:
        if not self.memops:
            raise tc.CudaError("cuStreamWaitValue32: CUDA_ERROR_NOT_SUPPORTED")
        self.calls.append(("wait_value", s, dev_addr, value))

    def launch_host_func(self, s: int, fn: Any) -> None:
        self.calls.append(("host_func", s))
        self.host_fns.append(fn)


def test_cuda_marks_record_on_the_users_stream_and_are_released() -> None:
    api = FakeApi()
    rt = tc.CudaRuntime(api)
    m = rt.mark_stream(0xABC)
    ev = m.native[0]
    assert ("record", ev, 0xABC) in api.calls and not m.query()
    api.done.add(ev)
    assert m.query() and m.wait(0.1)
    m.release()
    assert ("event_destroy", ev) in api.calls
    user = rt.mark_event(0x555)
    user.release()  # the user's own event is never destroyed by us
    assert ("event_destroy", 0x555) not in api.calls
    j = rt.join([rt.mark_stream(1), rt.mark_stream(2)])
    waits = [c for c in api.calls if c[0] == "wait_event"]
    assert len(waits) == 2 and ("record", j.native[0], waits[0][1]) in api.calls


def test_cuda_signal_gates_use_stream_memops_and_fall_back_to_host_functions() -> None:
    api = FakeApi()
    rt = tc.CudaRuntime(api)
    g = rt.arm_signal(0x900, deadline=0.0)
    wv = next(c for c in api.calls if c[0] == "wait_value")
    s = wv[1]
    assert api.calls.index(wv) < api.calls.index(("record", 0x900, s)) < api.calls.index(("stream_destroy", s))
    slot_host = rt._flags + (wv[2] - rt._flags_dev)
    assert ctypes.c_uint32.from_address(slot_host).value < wv[3]  # held
    g.open()
    assert ctypes.c_uint32.from_address(slot_host).value >= wv[3]  # released
    g2 = rt.arm_signal(0x901, deadline=0.0)  # next slot, its own generation
    wv2 = [c for c in api.calls if c[0] == "wait_value"][-1]
    assert wv2[2] != wv[2]
    g2.open()
    # a device without stream memory operations: a host function holds the stream instead
    api2 = FakeApi(memops=False)
    rt2 = tc.CudaRuntime(api2)
    g3 = rt2.arm_signal(0x902, deadline=0.0)
    assert any(c[0] == "host_func" for c in api2.calls) and api2.host_fns
    import threading

    t = threading.Thread(target=api2.host_fns[0])
    t.start()
    t.join(0.2)
    assert t.is_alive()  # the stream is held until the gate opens
    g3.open()
    t.join(5)
    assert not t.is_alive()


def test_cuda_checksum_readback_matches_the_host_reference() -> None:
    rt = tc.CudaRuntime(FakeApi())
    data = np.random.default_rng(3).integers(0, 256, (9 << 20) + 13, dtype=np.uint8)
    got = rt._wsum_readback(data.ctypes.data, data.size, 0)
    assert got == devices.wsum64_host(data)
    assert rt.pin(data.ctypes.data, 4096) and ("pin", data.ctypes.data, 4096) in rt._api.calls  # type: ignore[union-attr]


def test_wsum64_properties() -> None:
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, 100_003, dtype=np.uint8)
    whole = devices.wsum64_host(a)
    # partial sums of word-aligned pieces add up, in any order
    parts = [devices.wsum64_host(a[o:o + 8192], o // 8) for o in range(0, a.size, 8192)]
    assert sum(parts) % (1 << 64) == whole
    # any one byte changed, or two words swapped, changes it
    b = a.copy()
    b[77_777] ^= 1
    assert devices.wsum64_host(b) != whole
    c = a.copy()
    c[0:8], c[8:16] = a[8:16], a[0:8]
    assert devices.wsum64_host(c) != whole
    # the length is part of the final value (trailing zeros matter)
    assert devices.wsum64_finish(devices.wsum64_host(np.zeros(8, np.uint8)), 8) != devices.wsum64_finish(0, 16)
