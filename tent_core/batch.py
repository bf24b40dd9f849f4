"""Batch handles: what the application holds after submit(), and the typed errors of statuses.

A `BatchHandle` is the native completion counter of one submit. For the engine it also records
how each part of the batch was routed (`note_route` / `decision_for`, or the plan-cache entries the
fast path used): recovery uses that to retry or substitute a failed slice with the Decision of the
request it belongs to (same memory kinds, same policy rule), never a guess.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from . import _native, errors
from .abi import Status

log = logging.getLogger(__name__)

# tent_status codes (executor_abi.h) -> typed errors
_STATUS_ERRORS: dict[int, tuple[type[errors.TentError], str]] = {
    Status.E_CONNECT: (errors.PeerUnreachableError, "could not connect to the peer on any path"),
    Status.E_IO: (errors.PeerUnreachableError, "connection to the peer broke on every path"),
    Status.E_TIMEOUT: (errors.PeerUnreachableError, "no progress on any path before the slice timeout"),
    Status.E_CONGESTED: (errors.PeerUnreachableError, "every path stayed congested"),
    Status.E_BOUNDS: (errors.OutOfBoundsError, "the peer refused: range outside its registered memory"),
    Status.E_PERMISSION: (errors.PermissionDeniedError, "the peer refused: buffer registered without that permission"),
    Status.E_PROTOCOL: (errors.TransferError, "protocol error"),
    Status.E_CANCELLED: (errors.CancelledError, "the batch was cancelled"),
    Status.E_INTERNAL: (errors.TransferError, "internal executor error"),
}
_CANCELLED = int(Status.E_CANCELLED)

# typed errors -> the status a unit of work finalized from Python reports (most specific first)
_ERROR_STATUS: tuple[tuple[type[Exception], Status], ...] = (
    (errors.CancelledError, Status.E_CANCELLED),
    (errors.OutOfBoundsError, Status.E_BOUNDS),
    (errors.NotRegisteredError, Status.E_BOUNDS),
    (errors.PermissionDeniedError, Status.E_PERMISSION),
    (errors.PeerUnreachableError, Status.E_IO),
    (errors.DeadlineExceededError, Status.E_TIMEOUT),
)

_AMBIGUOUS: Any = object()


# Metrics hook (tent_core.metrics): called once per batch as HOOK(handle, outcome) when its end is first
# observed by wait()/poll(); outcome is "done", "failed", "cancelled" or "timeout". None (the default) = off.
COMPLETION_HOOK: Callable[[BatchHandle, str], None] | None = None


def status_error(status: int, context: str = "") -> errors.TentError:
    cls, text = _STATUS_ERRORS.get(status, (errors.TransferError, f"transfer failed with status {status}"))
    return cls(f"{text}{' (' + context + ')' if context else ''} [status {status}]")


def status_of(exc: BaseException) -> int:
    """The status to finalize a unit of work with when Python code failed it with `exc`."""
    for cls, code in _ERROR_STATUS:
        if isinstance(exc, cls):
            return int(code)
    return int(Status.E_INTERNAL)


class BatchHandle(_native.Batch):
    """Poll, wait (with a deadline) or cancel a submitted batch.

    The handle is the native completion counter itself (`_native.Batch`), so the engine's fast
    path makes one without running Python; its fields (engine, deadline, num_requests,
    submitted_at, is_probe) live in the native object. `BatchHandle(engine, total, deadline, n)`
    makes one from Python (`total` may also be an existing `_native.Batch` to wrap)."""

    # two small slots, unset until written (the fast path makes handles without running Python)
    __slots__ = ("_ordering", "_reported")

    def __new__(cls, engine: Any, batch: Any, deadline: float, num_requests: int) -> BatchHandle:
        return super().__new__(cls, batch, engine=engine, deadline=deadline, num_requests=num_requests)

    @property
    def ordering(self) -> str:
        """Stream ordering: "native" (executors wait on the device), "host", "none" or ""."""
        return getattr(self, "_ordering", "")

    @ordering.setter
    def ordering(self, value: str) -> None:
        self._ordering = value

    # ---- routing record (engine side) ---------------------------------------------------------

    def note_route(self, route: Any, decision: Any, lo: int, hi: int) -> None:
        """Slices for local addresses [lo, hi) go through `route` under `decision`."""
        routes = self._routes
        if routes is None:
            routes = self._routes = {}
            self._pieces = []
        known = routes.get(route)
        if known is None:
            routes[route] = decision
        elif known is not decision:
            routes[route] = _AMBIGUOUS
        self._pieces.append((route, lo, hi, decision))

    def decision_for(self, route: Any, local_addr: int) -> Any:
        """The Decision of the request a slice through `route` at `local_addr` belongs to, or None."""
        fast = self._fast
        if fast is not None:  # planned from the plan cache: one entry per (local buffer, remote) class
            for e in fast if isinstance(fast, tuple) else (fast,):
                if e.route is route and e.local_lo <= local_addr < e.local_lo + e.llen:
                    return e.decision
        routes = self._routes
        if routes is None:
            return None
        d = routes.get(route)
        if d is not _AMBIGUOUS:
            return d
        for r, lo, hi, dec in self._pieces:
            if r is route and lo <= local_addr < hi:
                return dec
        return None

    # ---- application side --------------------------------------------------------------------

    def poll(self) -> str:
        """'pending', 'done', 'failed' or 'cancelled'. Never blocks."""
        if self.remaining == 0:
            if COMPLETION_HOOK is not None:
                self._report()
            err = self.error
            if err == 0:
                return "done"
            return "cancelled" if err == _CANCELLED and not self._deadline_hit else "failed"
        self.kick()  # nobody waits here: work left to a waiter goes to the executor's workers
        if time.monotonic() >= self.deadline:
            self._expire()
            if COMPLETION_HOOK is not None:
                self._report()
            return "failed"
        return "pending"

    def _report(self) -> None:
        if getattr(self, "_reported", False) or self.is_probe or COMPLETION_HOOK is None:
            return
        self._reported = True
        err = self._batch.error
        if self._deadline_hit:
            outcome = "timeout"
        elif err == 0 and self._batch.remaining == 0:
            outcome = "done"
        else:
            outcome = "cancelled" if err == _CANCELLED else "failed"
        try:
            COMPLETION_HOOK(self, outcome)
        except Exception:  # metrics must never break a transfer
            log.exception("batch completion hook failed")

    def _expire(self) -> None:
        self._deadline_hit = True
        _native.Batch.cancel(self)

    def _raise_if_failed(self) -> None:
        err = self.error
        if err == 0:
            return
        if self._deadline_hit:
            raise errors.DeadlineExceededError(self._deadline_text())
        raise status_error(err, f"batch of {self.num_requests} request(s)")

    def _deadline_text(self) -> str:
        took = self.deadline - self.submitted_at
        return f"batch of {self.num_requests} request(s) missed its {took:.3g}s deadline ({self.remaining} slice(s) unfinished)"

    # wait(timeout=None): a batch already finished without error answers True in C (small requests
    # often have by the time the application waits); anything else runs `_wait` below.
    wait = _native.Batch.wait_handle

    def _wait(self, timeout: float | None = None) -> bool:
        """Block until the batch finishes. Returns True when it completed; False if
        `timeout` elapsed first (the batch keeps running). Raises a typed error if it
        failed, was cancelled, or its deadline passed (the batch is then cancelled)."""
        now = time.monotonic()
        end = self.deadline if timeout is None else min(self.deadline, now + max(0.0, timeout))
        done = _native.Batch.wait(self, max(0.0, end - now))
        if done:
            if COMPLETION_HOOK is not None:
                self._report()
            self._raise_if_failed()
            return True
        if time.monotonic() >= self.deadline:
            self._expire()
            if COMPLETION_HOOK is not None:
                self._report()
            raise errors.DeadlineExceededError(self._deadline_text())
        return False

    def __repr__(self) -> str:
        return f"<BatchHandle {self.poll()} requests={self.num_requests} bytes={self.bytes_done}>"


_native.set_hook_namespace(globals())  # wait() of a finished batch skips Python only while no hook is set
