"""Batch handles: what the application holds after submit()."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import errors

if TYPE_CHECKING:
    from .engine import Engine

# tent_status codes (executor_abi.h) -> typed errors
_STATUS_ERRORS: dict[int, tuple[type[errors.TentError], str]] = {
    -1: (errors.PeerUnreachableError, "could not connect to the peer on any path"),
    -2: (errors.PeerUnreachableError, "connection to the peer broke on every path"),
    -3: (errors.PeerUnreachableError, "no progress on any path before the slice timeout"),
    -4: (errors.PeerUnreachableError, "every path stayed congested"),
    -10: (errors.OutOfBoundsError, "the peer refused: range outside its registered memory"),
    -11: (errors.PermissionDeniedError, "the peer refused: buffer registered without that permission"),
    -12: (errors.TransferError, "protocol error"),
    -13: (errors.CancelledError, "the batch was cancelled"),
    -14: (errors.TransferError, "internal executor error"),
}


# Metrics hook (tent_core.metrics): called once per batch as HOOK(handle, outcome) when its end is first
# observed by wait()/poll(); outcome is "done", "failed", "cancelled" or "timeout". None (the default) = off.
COMPLETION_HOOK: Callable[[BatchHandle, str], None] | None = None


def status_error(status: int, context: str = "") -> errors.TentError:
    cls, text = _STATUS_ERRORS.get(status, (errors.TransferError, f"transfer failed with status {status}"))
    return cls(f"{text}{' (' + context + ')' if context else ''} [status {status}]")


class BatchHandle:
    """Poll, wait (with a deadline) or cancel a submitted batch."""

    def __init__(self, engine: Engine, batch: Any, deadline: float, num_requests: int) -> None:
        self.engine = engine
        self._batch = batch
        self.deadline = deadline  # time.monotonic() seconds
        self.num_requests = num_requests
        self.submitted_at = time.monotonic()
        self._deadline_hit = False
        self.is_probe = False  # heartbeat slices of the rail monitor
        self.rule_rails: dict[str, frozenset[int]] = {}  # policy-pinned rails per transport (retries obey)
        self._reported = False  # COMPLETION_HOOK already called

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
            return "cancelled" if err == -13 and not self._deadline_hit else "failed"
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
            outcome = "cancelled" if err == -13 else "failed"
        try:
            COMPLETION_HOOK(self, outcome)
        except Exception:  # metrics must never break a transfer
            import logging

            logging.getLogger(__name__).exception("batch completion hook failed")

    def _expire(self) -> None:
        self._deadline_hit = True
        self._batch.cancel()

    def _raise_if_failed(self) -> None:
        err = self._batch.error
        if err == 0:
            return
        if self._deadline_hit:
            raise errors.DeadlineExceededError(self._deadline_text())
        raise status_error(err, f"batch of {self.num_requests} request(s)")

    def _deadline_text(self) -> str:
        took = self.deadline - self.submitted_at
        return f"batch of {self.num_requests} request(s) missed its {took:.3g}s deadline ({self._batch.remaining} slice(s) unfinished)"

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
            raise errors.DeadlineExceededError(self._deadline_text())
        return False

    def cancel(self) -> None:
        """Stop the batch: slices not yet started never run. wait() then raises CancelledError."""
        self._batch.cancel()

    def __repr__(self) -> str:
        return f"<BatchHandle {self.poll()} requests={self.num_requests} bytes={self.bytes_done}>"
