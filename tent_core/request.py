"""The application-facing request types: `Request` (one intent), `LocalBuffer` (a registered local
buffer) and the "host:port/segment" naming of remote segments.

Plain data with no engine behind it, so every module (the submit path, staged paths, benchmarks,
refhub) can use them without importing the engine. Re-exported by `tent_core` and, for existing
callers, by `tent_core.engine`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import errors
from .memory import MemfdBuffer
from .types import BufferInfo, MemoryKind, OpCode, Permission, Priority


@dataclass
class LocalBuffer:
    """A registered local buffer. `offset` is its place inside `segment`."""

    segment: str
    offset: int
    addr: int
    length: int
    kind: MemoryKind
    perm: Permission
    device: int = -1
    array: np.ndarray | None = None
    info: BufferInfo | None = None
    _keepalive: Any = None
    _owned: MemfdBuffer | None = None
    _engine_id: str = ""
    registered: bool = True


@dataclass(slots=True)
class Request:
    """One intent. `local` is a buffer returned by Engine.register/allocate.

    Slotted: the engine's native submit path reads the fields at their slot offsets."""

    op: OpCode
    local: LocalBuffer
    local_offset: int
    remote: str  # "host:port/segment"
    remote_offset: int
    length: int
    priority: Priority = Priority.MID
    tag: str | None = None  # a class name administrators' policy rules can match
    # Stream ordering (tent_core.ordering), per batch. A device stream (torch / CuPy / cuda-python
    # stream, a simulated one, or a raw handle): the transfer starts after the work queued on it so far.
    wait_stream: Any = None
    # A device event: the transfer starts after its most recent record (as of submit).
    wait_event: Any = None
    # A device event that fires once the batch is final (done, failed or cancelled: see the handle).
    signal_event: Any = None


def parse_segment_name(name: str) -> tuple[str, str]:
    """'host:port/segment' -> ('host:port', 'segment')."""
    if not isinstance(name, str) or "/" not in name:
        raise errors.InvalidRequestError(f"remote segment must look like 'host:port/segment', got {name!r}")
    engine_id, _, seg = name.partition("/")
    host, _, port = engine_id.rpartition(":")
    if not host or not port.isdigit() or not seg:
        raise errors.InvalidRequestError(f"remote segment must look like 'host:port/segment', got {name!r}")
    return engine_id, seg


__all__ = ["LocalBuffer", "Request", "parse_segment_name"]


@dataclass(frozen=True, slots=True)
class WaitWord:
    """The condition of a waiting READ (``Engine.submit_when``, tent_wait_t in executor_abi.h): the
    target answers it once the aligned u64 at `offset` of the READ's remote segment satisfies
    ``lo <= word <= hi``; while ``floor <= word < lo`` it waits, at most `timeout_s` (the executor
    caps it); otherwise, or then, the READ fails with NotReadyError, without its bytes."""

    offset: int
    floor: int
    lo: int
    hi: int
    timeout_s: float = 0.2
