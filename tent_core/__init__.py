"""TENT: a declarative transfer engine.

Applications say what to move; the engine decides how::

    from tent_core import Engine, Request, READ

    eng = Engine()
    buf = eng.register(array)                     # or eng.allocate(nbytes)
    h = eng.submit([Request(READ, buf, 0, "host:port/segment", 0, nbytes)])
    h.wait()
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

# The public names are imported on first use (PEP 562), so `import tent_core.build` in a
# plugin's setup.py needs neither numpy nor pyzmq nor the compiled core.
_LAZY = {
    "BatchHandle": ".batch",
    "Digest": "._native",
    "DIGESTS_PER_SUBMIT": "._native",
    "Engine": ".engine",
    "LocalBuffer": ".request",
    "Request": ".request",
    "WaitWord": ".request",
    **dict.fromkeys(
        (
            "CancelledError",
            "DeadlineExceededError",
            "InvalidRequestError",
            "NoPathError",
            "NotReadyError",
            "NotRegisteredError",
            "OutOfBoundsError",
            "PeerSilentError",
            "PeerUnreachableError",
            "PermissionDeniedError",
            "PolicyRejectedError",
            "TentError",
            "TransferError",
            "UnknownSegmentError",
        ),
        ".errors",
    ),
    **dict.fromkeys(("READ", "READ_ONLY", "READ_WRITE", "WRITE", "MemoryKind", "OpCode", "Permission", "Priority"), ".types"),
}

if TYPE_CHECKING:
    from ._native import DIGESTS_PER_SUBMIT, Digest
    from .batch import BatchHandle
    from .engine import Engine
    from .errors import (
        CancelledError,
        DeadlineExceededError,
        InvalidRequestError,
        NoPathError,
        NotReadyError,
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
    from .request import LocalBuffer, Request, WaitWord
    from .types import READ, READ_ONLY, READ_WRITE, WRITE, MemoryKind, OpCode, Permission, Priority


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tent_core' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BatchHandle",
    "CancelledError",
    "DeadlineExceededError",
    "DIGESTS_PER_SUBMIT",
    "Digest",
    "Engine",
    "InvalidRequestError",
    "LocalBuffer",
    "MemoryKind",
    "NoPathError",
    "NotReadyError",
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
    "WaitWord",
    "WRITE",
]
