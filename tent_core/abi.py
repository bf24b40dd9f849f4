"""Python mirror of ``include/tent/executor_abi.h``: slice records, status codes, telemetry rows.

The header is the one definition. `Status` and `StatField` spell its lists out for readers and type
checkers, and are checked at import against what the compiled ``_native`` module exports from the
header (``STATUS_CODES``, ``STATUS_RETRYABLE``, ``STAT_FIELD_NAMES``), so they cannot drift apart.
Everything in the core and the plugins that needs a status number or a row index takes it from here
(Python) or from the header (C).
"""

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


class Status(enum.IntEnum):
    """`enum tent_status`: what an executor reports per slice (negative = failure)."""

    OK = 0
    E_CONNECT = -1
    E_IO = -2
    E_TIMEOUT = -3
    E_CONGESTED = -4
    E_REROUTED = -5
    E_BOUNDS = -10
    E_PERMISSION = -11
    E_PROTOCOL = -12
    E_CANCELLED = -13
    E_INTERNAL = -14
    E_NOT_READY = -15

    @property
    def retryable(self) -> bool:
        """Another rail or transport may succeed (the path failed, not the request)."""
        return is_retryable(self.value)


FIRST_FINAL_STATUS = -10  # statuses in (FIRST_FINAL_STATUS, 0) are retryable


def is_retryable(status: int) -> bool:
    return FIRST_FINAL_STATUS < status < 0


class StatField(enum.IntEnum):
    """`enum tent_stat_field`: the columns of a rail's native telemetry row."""

    INFLIGHT_BYTES = 0
    INFLIGHT_SLICES = 1
    BYTES_DONE = 2
    SLICES_DONE = 3
    ERRORS = 4
    LATENCY_NS_SUM = 5
    LAST_LATENCY_NS = 6
    LAST_COMPLETE_NS = 7
    SERVING = 8
    PROGRESS_NS = 9
    BYTES_MOVED = 10
    CONGESTION = 11
    GENERATION = 12  # the core's: which holder of the slot a slice's stat_index names (rails.py)


STAT_FIELDS = len(StatField)
# tent_slice_t.stat_index: the telemetry slot in the low bits, the generation of the rail holding it
# above (a slice of a rail that let the slot go counts nowhere); all ones: no slot
STAT_SLOT_BITS = 12
STAT_NONE = 0xFFFFFFFF

# tent_slice_t.attempt: retry count in bits 0-15, TENT_HINT_* flags in bits 16-23, the core's own
# round counter (recovery: times a slice waited for a path) in bits 24-31
ATTEMPT_MASK = 0xFFFF
HINT_MASK = 0x00FF0000
ROUND_SHIFT = 24
MAX_ROUNDS = 0xFF
HINT_SMALL = 1 << 16  # the slice belongs to a small, latency-sensitive request


class Note(enum.IntEnum):
    """`enum tent_note`: service telemetry an executor reports through `host->note`."""

    START = 0
    PROGRESS = 1
    STOP = 2
    CONGESTED = 3


def _check_against_header() -> None:
    """The compiled header and this module must agree; a mismatch is a build error, not a bug to find later."""
    problems = []
    codes = dict(_native.STATUS_CODES)
    if codes != {s.name: s.value for s in Status}:
        problems.append(f"status codes: header {codes}")
    retry = dict(_native.STATUS_RETRYABLE)
    if retry != {s.name: s.retryable for s in Status}:
        problems.append(f"retryable statuses: header {retry}")
    if _native.FIRST_FINAL_STATUS != FIRST_FINAL_STATUS:
        problems.append(f"first final status: header {_native.FIRST_FINAL_STATUS}")
    if list(_native.STAT_FIELD_NAMES) != [f.name for f in StatField] or _native.STAT_FIELDS != STAT_FIELDS:
        problems.append(f"stat fields: header {list(_native.STAT_FIELD_NAMES)}")
    if dict(_native.NOTE_EVENTS) != {n.name: n.value for n in Note}:
        problems.append(f"note events: header {dict(_native.NOTE_EVENTS)}")
    if SLICE_DTYPE.itemsize != _native.SLICE_SIZE or FAILURE_DTYPE.itemsize != _native.FAILURE_SIZE:
        problems.append("slice record size")
    if _native.STAT_SLOT_BITS != STAT_SLOT_BITS:
        problems.append(f"stat_index slot bits: header {_native.STAT_SLOT_BITS}")
    if (_native.ATTEMPT_MASK, _native.HINT_SMALL) != (ATTEMPT_MASK, HINT_SMALL):
        problems.append("slice hints")
    if problems:
        raise ImportError("tent_core.abi disagrees with executor_abi.h (rebuild tent_core): " + "; ".join(problems))


_check_against_header()

__all__ = [
    "ATTEMPT_MASK", "FAILURE_DTYPE", "FIRST_FINAL_STATUS", "HINT_MASK", "HINT_SMALL", "MAX_ROUNDS", "Note", "ROUND_SHIFT", "SLICE_DTYPE", "STAT_FIELDS", "STAT_NONE", "STAT_SLOT_BITS", "StatField",
    "Status", "WAIT_DTYPE", "is_retryable",
]


# tent_wait_t: the condition of a waiting READ (Engine.submit_when), packed for _native.wait_arm
WAIT_DTYPE = np.dtype(
    [
        ("local_start", "<u8"),
        ("local_end", "<u8"),
        ("word_addr", "<u8"),
        ("floor", "<u8"),
        ("lo", "<u8"),
        ("hi", "<u8"),
        ("wait_ms", "<u4"),
        ("reserved", "<u4"),
    ]
)
if WAIT_DTYPE.itemsize != _native.WAIT_SIZE:
    raise ImportError(f"tent_wait_t is {_native.WAIT_SIZE} bytes in the native module, {WAIT_DTYPE.itemsize} here")
