"""Batch handles: what the application holds after submit(), and the typed errors of statuses.

A `BatchHandle` wraps the native completion counter of one submit. For the engine it also records
how each part of the batch was routed (`note_route` / `decision_for`): recovery uses that to
retry or substitute a failed slice with the Decision of the request it belongs to (same memory
kinds, same policy rule), never a guess.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from . import errors
from .abi import Status

log = logging.getLogger(__name__)

# tent_status codes (executor_abi.h) -> typed errors
_STATUS_ERRORS: dict[int, tuple[type[errors.TentError], str]] = {
    Status.E_CONNECT: (errors.PeerUnreachableError, "could not connect to the peer on any path"),
    Status.E_IO: (errors.PeerUnreachableError, "connection to the peer broke on every path"),
    Status.E_TIMEOUT: (errors.PeerUnreachableError, "no progress on any path before the slice timeout"),
    Status.E_CONGESTED: (errors.PeerUnreachableError, "every path stayed congested"),
    Status.E_REROUTED: (errors.PeerUnreachableError, "the path was taken away before the slice ran"),
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


def status_error(status: int, context: str = "", detail: str | None = None) -> errors.TentError:
    """The typed error for a failed status; `detail` (why the engine gave up) replaces the status's
    generic text."""
    cls, text = _STATUS_ERRORS.get(status, (errors.TransferError, f"transfer failed with status {status}"))
    if detail:
        return cls(f"{context + ': ' if context else ''}{detail} [status {status}]")
    return cls(f"{text}{' (' + context + ')' if context else ''} [status {status}]")


def status_of(exc: BaseException) -> int:
    """The status to finalize a unit of work with when Python code failed it with `exc`."""
    for cls, code in _ERROR_STATUS:
        if isinstance(exc, cls):
            return int(code)
    return int(Status.E_INTERNAL)


class BatchHandle:
    """Poll, wait (with a deadline) or cancel a submitted batch."""

    def __init__(self, engine: Any, batch: Any, deadline: float, num_requests: int) -> None:
        self.engine = engine  # the owner the progress thread hands this batch's failures to
        self._batch = batch
        self.deadline = deadline  # time.monotonic() seconds
        self.num_requests = num_requests
        self.submitted_at = time.monotonic()
        self._deadline_hit = False
        self.is_probe = False  # heartbeat slices of the rail monitor
        # Set by recovery: the outage (liveness.Outage) some of this batch's slices waited on, and
        # why slices were finalized early (a gone peer), for the error the application gets.
        self.outage: Any = None
        self.failure_detail: str | None = None
        self.peers: tuple[Any, ...] = ()  # peers.Peer objects its requests go to
        self.ordering = ""  # stream ordering: "native" (executors wait on the device), "host", "none" or ""
        # route -> the Decision its slices follow (or _AMBIGUOUS: look in _pieces by local address)
        self._routes: dict[Any, Any] = {}
        self._pieces: list[tuple[Any, int, int, Any]] = []  # (route, local lo, local hi, decision)
        self._reported = False  # COMPLETION_HOOK already called

    # ---- routing record (engine side) ---------------------------------------------------------

    def note_route(self, route: Any, decision: Any, lo: int, hi: int) -> None:
        """Slices for local addresses [lo, hi) go through `route` under `decision`."""
        known = self._routes.get(route)
        if known is None:
            self._routes[route] = decision
        elif known is not decision:
            self._routes[route] = _AMBIGUOUS
        self._pieces.append((route, lo, hi, decision))

    def routes(self) -> list[Any]:
        """The routes its slices were sent through (first choices and retries)."""
        return list(self._routes)

    def decision_for(self, route: Any, local_addr: int) -> Any:
        """The Decision of the request a slice through `route` at `local_addr` belongs to, or None."""
        d = self._routes.get(route)
        if d is not _AMBIGUOUS:
            return d
        for r, lo, hi, dec in self._pieces:
            if r is route and lo <= local_addr < hi:
                return dec
        return None

    # ---- application side --------------------------------------------------------------------

    @property
    def bytes_done(self) -> int:
        return self._batch.bytes_done

    @property
    def retries(self) -> int:
        return self._batch.retries

    def poll(self) -> str:
        """'pending', 'done', 'failed' or 'cancelled'. Never blocks."""
        b = self._batch
        if b.remaining == 0:
            if COMPLETION_HOOK is not None:
                self._report()
            err = b.error
            if err == 0:
                return "done"
            return "cancelled" if err == _CANCELLED and not self._deadline_hit else "failed"
        if time.monotonic() >= self.deadline:
            self._expire()
            if COMPLETION_HOOK is not None:
                self._report()
            return "failed"
        return "pending"

    def _report(self) -> None:
        if self._reported or self.is_probe or COMPLETION_HOOK is None:
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
        if not self._deadline_hit:
            self._deadline_hit = True
            self._batch.cancel()
            outage = self._current_outage()
            if outage is not None:
                # a request reached its deadline waiting for this peer: its liveness hears of it
                now = time.monotonic()
                for peer in self.peers:
                    if peer.liveness.outage is outage:
                        with peer.lock:
                            peer.liveness.on_deadline(now)

    def _current_outage(self) -> Any:
        """The ongoing outage of a peer this batch waited on (its own record first), or None."""
        if self.outage is not None and self.outage.ongoing:
            return self.outage
        for peer in self.peers:
            outage = peer.liveness.outage
            if outage is not None and outage.ongoing:
                return outage
        return None

    def _raise_if_failed(self) -> None:
        err = self._batch.error
        if err == 0:
            return
        if self._deadline_hit:
            raise self._deadline_error()
        raise status_error(err, f"batch of {self.num_requests} request(s)", self.failure_detail)

    def _deadline_error(self) -> errors.TentError:
        took = self.deadline - self.submitted_at
        text = f"batch of {self.num_requests} request(s) missed its {took:.3g}s deadline ({self._batch.remaining} slice(s) unfinished)"
        outage = self._current_outage()
        if outage is not None:
            return errors.PeerSilentError(f"{text}: {outage.describe(time.monotonic())}")
        return errors.DeadlineExceededError(text)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the batch finishes. Returns True when it completed; False if
        `timeout` elapsed first (the batch keeps running). Raises a typed error if it
        failed, was cancelled, or its deadline passed (the batch is then cancelled)."""
        now = time.monotonic()
        end = self.deadline if timeout is None else min(self.deadline, now + max(0.0, timeout))
        done = self._batch.wait(max(0.0, end - now))
        if done:
            if COMPLETION_HOOK is not None:
                self._report()
            self._raise_if_failed()
            return True
        if time.monotonic() >= self.deadline:
            self._expire()
            if COMPLETION_HOOK is not None:
                self._report()
            raise self._deadline_error()
        return False

    def cancel(self) -> None:
        """Stop the batch: slices not yet started never run. wait() then raises CancelledError."""
        self._batch.cancel()

    def __repr__(self) -> str:
        return f"<BatchHandle {self.poll()} requests={self.num_requests} bytes={self.bytes_done}>"
