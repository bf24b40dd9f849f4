"""TENT: a declarative transfer engine.

Applications say what to move; the engine decides how::

    from tent_core import Engine, Request, READ

    eng = Engine()
    buf = eng.register(array)                     # or eng.allocate(nbytes)
    h = eng.submit([Request(READ, buf, 0, "host:port/segment", 0, nbytes)])
    h.wait()
"""

from __future__ import annotations

import logging

from .batch import BatchHandle
from .engine import Engine, LocalBuffer, Request
from .errors import (
    CancelledError,
    DeadlineExceededError,
    InvalidRequestError,
    NoPathError,
    NotRegisteredError,
    OutOfBoundsError,
    PeerSilentError,
    PeerUnreachableError,
    PermissionDeniedError,
    PolicyRejectedError,
    TentError,
    TransferError,
    UnknownSegmentError,
)
from .types import READ, READ_ONLY, READ_WRITE, WRITE, MemoryKind, OpCode, Permission, Priority

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "BatchHandle",
    "CancelledError",
    "DeadlineExceededError",
    "Engine",
    "InvalidRequestError",
    "LocalBuffer",
    "MemoryKind",
    "NoPathError",
    "NotRegisteredError",
    "OpCode",
    "OutOfBoundsError",
    "PeerSilentError",
    "PeerUnreachableError",
    "Permission",
    "PermissionDeniedError",
    "PolicyRejectedError",
    "Priority",
    "READ",
    "READ_ONLY",
    "READ_WRITE",
    "Request",
    "TentError",
    "TransferError",
    "UnknownSegmentError",
    "WRITE",
]
