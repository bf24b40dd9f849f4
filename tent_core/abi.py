"""Python mirror of ``include/tent/executor_abi.h``: slice records and status codes."""

from __future__ import annotations

import enum

import numpy as np

from . import _native

SLICE_DTYPE = np.dtype(
    [
        ("local_addr", "<u8"),
        ("remote_addr", "<u8"),
        ("length", "<u8"),
        ("peer", "<u8"),
        ("token", "<u8"),
        ("submit_ns", "<u8"),
        ("opcode", "<u4"),
        ("rail", "<u4"),
        ("stat_index", "<u4"),
        ("attempt", "<u4"),
    ]
)
# a retryable failure as queued by the native completion path (tent_slice_t + status + pad)
FAILURE_DTYPE = np.dtype([("slice", SLICE_DTYPE), ("status", "<i4"), ("pad", "<i4")])
assert SLICE_DTYPE.itemsize == _native.SLICE_SIZE and FAILURE_DTYPE.itemsize == _native.FAILURE_SIZE


class Status(enum.IntEnum):
    OK = 0
    E_CONNECT = -1
    E_IO = -2
    E_TIMEOUT = -3
    E_CONGESTED = -4
    E_BOUNDS = -10
    E_PERMISSION = -11
    E_PROTOCOL = -12
    E_CANCELLED = -13
    E_INTERNAL = -14

    @property
    def retryable(self) -> bool:
        return -10 < self.value < 0
