"""The fault executor keeps the executor ABI's all-or-nothing submit: once it has reported or
handed on some slices of a submit, it never returns an error for that submit (the caller would
finalize those slices a second time). Driven through the core's native submit, over a wrapped
executor written here with ctypes whose submit refuses on demand."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

import tent_core.rails  # noqa: F401  (telemetry slots)
from tent_core import _native
from tent_core.abi import SLICE_DTYPE, Status
from tent_core.executor import find_extension, load_executor_library

_SUBMIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32)
_VOIDP_FN = ctypes.CFUNCTYPE(ctypes.c_void_p)
_COMPLETE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)


class _Ops(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("create", ctypes.c_void_p),
        ("destroy", ctypes.c_void_p),
        ("submit", _SUBMIT),
    ]


class _Host(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("ctx", ctypes.c_void_p),
        ("complete", _COMPLETE),
        ("is_cancelled", ctypes.c_void_p),
    ]


class Refusing:
    """An inner executor: accepts (and completes at once, OK) its first `accept` submit calls,
    refuses every later one with TENT_E_INTERNAL."""

    def __init__(self, accept: int) -> None:
        self.accept = accept
        self.calls: list[int] = []
        self.host = _Host.from_address(_native.host_api_address())
        self._submit = _SUBMIT(self._on_submit)
        self.ops = _Ops(_native.EXECUTOR_ABI_VERSION, ctypes.sizeof(_Ops), b"refusing", None, None, self._submit)

    def _on_submit(self, _self: int, slices: int, n: int) -> int:
        self.calls.append(n)
        if len(self.calls) > self.accept:
            return int(Status.E_INTERNAL)
        for i in range(n):
            self.host.complete(self.host.ctx, slices + i * SLICE_DTYPE.itemsize, 0)
        return 0


def _fault_executor(inner: Refusing):
    lib = load_executor_library(find_extension(Path(_native.__file__).parent, "_fault_executor"))
    ex = lib.create({"inner_ops": ctypes.addressof(inner.ops), "inner_handle": 1})
    lib.cdll.tent_fault_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32]
    return ex, lib


def _slices(n: int) -> np.ndarray:
    arr = np.zeros(n, SLICE_DTYPE)
    arr["length"] = 4096
    arr["rail"] = np.arange(n) % 2
    arr["stat_index"] = 0xFFFFFFFF  # no telemetry slot
    return arr


def _check_all_or_nothing(rc: int, batch, n: int) -> None:
    if rc != 0:
        assert batch.remaining == n, f"submit failed ({rc}) after reporting {n - batch.remaining} of its {n} slices"
    else:
        assert batch.wait(5) and batch.remaining == 0


def test_faults_then_a_refused_pass_through_report_each_slice_once():
    inner = Refusing(accept=0)
    ex, lib = _fault_executor(inner)
    try:
        lib.cdll.tent_fault_set(ex.handle, 1, int(Status.E_BOUNDS), 1 << 1, 0, 1000)  # rail 1 fails (final)
        n = 10
        batch = _native.Batch(n)
        rc = _native.submit(ex.ops, ex.handle, batch, _slices(n))
        _check_all_or_nothing(rc, batch, n)
        assert rc == 0 and batch.error in (Status.E_BOUNDS, Status.E_INTERNAL)
    finally:
        ex.close()


def test_a_refusal_after_an_accepted_chunk_is_reported_not_returned():
    inner = Refusing(accept=1)  # the first 256-slice chunk goes through, the rest is refused
    ex, _ = _fault_executor(inner)
    try:
        n = 300
        batch = _native.Batch(n)
        rc = _native.submit(ex.ops, ex.handle, batch, _slices(n))
        _check_all_or_nothing(rc, batch, n)
        assert inner.calls == [256, 44]
        assert rc == 0 and batch.bytes_done == 256 * 4096 and batch.error == Status.E_INTERNAL
    finally:
        ex.close()


def test_a_refusal_before_anything_was_reported_is_returned():
    inner = Refusing(accept=0)
    ex, _ = _fault_executor(inner)
    try:
        batch = _native.Batch(3)
        rc = _native.submit(ex.ops, ex.handle, batch, _slices(3))
        assert rc == Status.E_INTERNAL and batch.remaining == 3  # the caller finalizes all three
        for _ in range(3):
            batch.fail_slice(rc)
        assert batch.remaining == 0
    finally:
        ex.close()
