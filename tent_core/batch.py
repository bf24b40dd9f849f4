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
    Status.E_REROUTED: (errors.PeerUnreachableError, "the path was taken away before the slice ran"),
    Status.E_BOUNDS: (errors.OutOfBoundsError, "the peer refused: range outside its registered memory"),
    Status.E_PERMISSION: (errors.PermissionDeniedError, "the peer refused: buffer registered without that permission"),
    Status.E_PROTOCOL: (errors.TransferError, "protocol error"),
    Status.E_CANCELLED: (errors.CancelledError, "the batch was cancelled"),
    Status.E_INTERNAL: (errors.TransferError, "internal executor error"),
    Status.E_NOT_READY: (errors.NotReadyError, "a waiting READ's condition did not hold in time (or can no longer)"),
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


def time_left(handle: BatchHandle, what: str) -> float:
    """Seconds left before `handle`'s deadline, for a leg a composite transfer (staged, mapped)
    submits on its behalf; DeadlineExceededError naming `what` once none is."""
    left = handle.deadline - time.monotonic()
    if left <= 0:
        raise errors.DeadlineExceededError(f"{what} missed its deadline")
    return left


def drain_quietly(h: Any, timeout: float = 5.0) -> None:
    """Wait out a cancelled leg so its buffers can be reused; its own error is already moot."""
    try:
        h.wait(timeout)
    except errors.TentError:
        pass


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

    # small slots, unset until written (the fast path makes handles without running Python). They hold
    # plain data (a str, a bool, a liveness.Outage, a tuple of peers.Peer) that never refers back
    # to a handle, so handles are kept out of cycle collection (_native.untrack_handles below).
    __slots__ = ("_ordering", "_reported", "_outage", "_failure_detail", "_peers")

    def __new__(cls, engine: Any, batch: Any, deadline: float, num_requests: int) -> BatchHandle:
        return super().__new__(cls, batch, engine=engine, deadline=deadline, num_requests=num_requests)

    @property
    def ordering(self) -> str:
        """Stream ordering: "native" (executors wait on the device), "host", "none" or ""."""
        return getattr(self, "_ordering", "")

    @ordering.setter
    def ordering(self, value: str) -> None:
        self._ordering = value

    # Set by recovery: the outage (liveness.Outage) some of this batch's slices waited on, and why
    # slices were finalized early (a gone peer), for the error the application gets.
    @property
    def outage(self) -> Any:
        return getattr(self, "_outage", None)

    @outage.setter
    def outage(self, value: Any) -> None:
        self._outage = value

    @property
    def failure_detail(self) -> str | None:
        return getattr(self, "_failure_detail", None)

    @failure_detail.setter
    def failure_detail(self, value: str | None) -> None:
        self._failure_detail = value

    @property
    def peers(self) -> tuple[Any, ...]:
        """The peers (peers.Peer) its requests go to: a deadline missed while one of them is in an
        outage blames it. Found from its routes when first asked (never on the submit path)."""
        peers = getattr(self, "_peers", None)
        if peers is None:
            directory = getattr(self.engine, "peers", None)
            found = {directory.lookup(r.rails[0].peer_id) for r in self.routes() if r.rails} if directory else set()
            peers = self._peers = tuple(found - {None})
        return peers

    @peers.setter
    def peers(self, value: tuple[Any, ...]) -> None:
        self._peers = value

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

    def routes(self) -> list[Any]:
        """The routes its slices were sent through (first choices, plan-cache entries and retries)."""
        out = list(self._routes or ())
        fast = self._fast
        if fast is not None:
            for e in fast if isinstance(fast, tuple) else (fast,):
                if e.route not in out:
                    out.append(e.route)
        return out

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
        if self._deadline_hit:
            return
        self._deadline_hit = True
        _native.Batch.cancel(self)
        outage = self._current_outage()
        if outage is not None:
            # a request reached its deadline waiting for this peer: its liveness hears of it
            now = time.monotonic()
            for peer in self.peers:
                if peer.liveness.outage is outage:
                    with peer.lock:
                        peer.liveness.on_deadline(now)

    def silent_for(self, now: float | None = None) -> float:
        """Seconds this unfinished batch has been waiting on a peer every path to which has failed
        (an ongoing outage: the peer stopped, or its links are cut); 0.0 while its paths work.

        The batch itself keeps waiting until its deadline, since a peer that comes back in time
        loses nothing; an application that has another source for the same bytes can ask this
        while it waits, cancel the batch and go elsewhere much sooner (refhub does)."""
        if self.remaining == 0:
            return 0.0
        outage = self._current_outage()
        if outage is None:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - outage.since)

    def _current_outage(self) -> Any:
        """The ongoing outage of a peer this batch waited on (its own record first), or None."""
        own = self.outage
        if own is not None and own.ongoing:
            return own
        for peer in self.peers:
            outage = peer.liveness.outage
            if outage is not None and outage.ongoing:
                return outage
        return None

    def _raise_if_failed(self) -> None:
        err = self.error
        if err == 0:
            return
        if self._deadline_hit:
            raise self._deadline_error()
        raise status_error(err, f"batch of {self.num_requests} request(s)", self.failure_detail)

    def _deadline_error(self) -> errors.TentError:
        took = self.deadline - self.submitted_at
        text = f"batch of {self.num_requests} request(s) missed its {took:.3g}s deadline ({self.remaining} slice(s) unfinished)"
        outage = self._current_outage()
        if outage is not None:
            return errors.PeerSilentError(f"{text}: {outage.describe(time.monotonic())}")
        return errors.DeadlineExceededError(text)

    # wait(timeout=None): a batch already finished without error answers True in C (small requests
    # often have by the time the application waits); anything else runs `_wait` below.
    wait = _native.Batch.wait_handle

    def _wait(self, timeout: float | None = None, spin: bool = True) -> bool:
        """Block until the batch finishes. Returns True when it completed; False if
        `timeout` elapsed first (the batch keeps running). Raises a typed error if it
        failed, was cancelled, or its deadline passed (the batch is then cancelled)."""
        now = time.monotonic()
        end = self.deadline if timeout is None else min(self.deadline, now + max(0.0, timeout))
        done = _native.Batch.wait(self, max(0.0, end - now), spin)
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

    def wait_sleeping(self, timeout: float | None = None) -> bool:
        """wait() that sleeps at once instead of polling the counter first (`wait_spin_us`): for a
        waiter that knows the batch takes far longer than that poll (a staged path's MiB-sized
        legs), whose poll would only hold a core the batch's own threads need."""
        return self._wait(timeout, spin=False)

    def __repr__(self) -> str:
        return f"<BatchHandle {self.poll()} requests={self.num_requests} bytes={self.bytes_done}>"


_native.set_hook_namespace(globals())  # wait() of a finished batch skips Python only while no hook is set
_native.untrack_handles(BatchHandle)  # see its __slots__
