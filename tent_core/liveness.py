"""Peer liveness: is a remote engine there, silent, or gone? (pure policy, no sockets)

A request fails only at its deadline or when no path can ever serve it. When every path to a peer
fails, the engine therefore keeps the request's slices and retries them with back-off (see
`recovery`), and asks this state machine what the peer itself is doing, from three kinds of
evidence fed in by the I/O shells:

* progress (`on_progress`): bytes or slices completed from the peer: it is ALIVE, any outage ends;
* a slice out of paths (`on_no_path`): the data paths fail; ALIVE -> SILENT until a check says more;
* a check of its control endpoint (`on_check`), run off the data path by the engine's peer watch:
  ANSWERED (the process is there; only its data paths fail), REFUSED (the host answered but nothing
  listens: the process is gone) or NO_ANSWER (silent: stopped, or its links are cut).

States:

* ALIVE: requests go ahead.
* SILENT: every path failed and no check has answered yet. Requests still go ahead and wait (their
  slices are parked and retried) until their deadlines: a link that comes back in time loses nothing.
* DEAD: the process is gone (REFUSED), or a request reached its deadline waiting for a silent peer
  (`on_deadline`). Remembered: new requests fail at once with the reason (`fail_fast`) instead of
  each waiting for a timeout, until a check is answered again (a restarted process included).
  Requests already waiting end at once only when the process is gone (`ends_waiting`); a peer
  judged dead from silence may still return within their deadlines (a short deadline must not
  fail a long one), so they keep waiting for their own.

Checks are due (`check_due`) while SILENT or DEAD, with exponential back-off between them, so a
peer that comes back is noticed within one back-off step (`check_backoff_cap_s` at most).

`Outage` records what was tried while the paths to a peer failed (per path and status, retry
rounds, check results) for the error a request finally gets; a batch handle keeps a reference to
the outage it waited on, and `ongoing` says whether it is still going on.

Every method takes `now` (seconds, any monotonic clock); nothing sleeps. Not thread-safe: the
caller serializes calls (the engine holds the peer's lock).
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from .abi import Status
from .config import PeerConfig


class PeerState(enum.Enum):
    ALIVE = "alive"
    SILENT = "silent"
    DEAD = "dead"


class CheckResult(enum.Enum):
    ANSWERED = "answered"  # the control endpoint replied: the process is alive
    REFUSED = "refused"  # connection refused: the host is up, the process is gone
    NO_ANSWER = "no answer"  # timed out or unreachable: stopped, or the links are cut


def _status_name(status: int) -> str:
    try:
        return Status(status).name
    except ValueError:
        return str(status)


@dataclass(eq=False)
class Outage:
    """What was tried while every path to one peer failed."""

    peer: str
    since: float
    ended: float | None = None
    tried: dict[str, Counter[str]] = field(default_factory=dict)  # path -> status name -> count
    rounds: int = 0  # retry rounds of parked slices (back-off steps and re-admissions)
    backoff_s: float = 0.0  # the longest back-off used so far
    check: str = ""  # the last check's result, in words

    @property
    def ongoing(self) -> bool:
        return self.ended is None

    def note(self, path: str, status: int) -> None:
        self.tried.setdefault(path, Counter())[_status_name(status)] += 1

    def describe(self, now: float) -> str:
        until = self.ended if self.ended is not None else now
        paths = "; ".join(
            f"{p}: " + ", ".join(f"{name} x{n}" for name, n in sorted(c.items())) for p, c in sorted(self.tried.items())
        )
        parts = [f"no path to engine {self.peer} for {until - self.since:.2f}s"]
        if paths:
            parts.append(f"tried {paths}")
        if self.rounds:
            parts.append(f"{self.rounds} retry round(s), back-off up to {self.backoff_s:.2f}s")
        if self.check:
            parts.append(f"control endpoint: {self.check}")
        return "; ".join(parts)


class PeerLiveness:
    """The liveness state machine of one peer; see the module docstring."""

    def __init__(self, engine_id: str, config: PeerConfig | None = None) -> None:
        self.engine_id = engine_id
        self.config = config or PeerConfig()
        self.state = PeerState.ALIVE
        self.since = 0.0  # when the current state began
        self.reason = ""
        self.outage: Outage | None = None
        self._next_check = 0.0
        self._check_backoff = self.config.check_backoff_base_s
        self._checking = False
        self._answered = False  # a check answered during the current outage
        self.gone = False  # DEAD because the process is gone (refused), not only silent

    # ---- evidence ------------------------------------------------------------------------------

    def on_progress(self, now: float) -> None:
        """Something completed from the peer: it is alive and its paths work."""
        if self.outage is not None:
            self.outage.ended = now
            self.outage = None
        self._answered = False
        self._check_backoff = self.config.check_backoff_base_s
        if self.state is not PeerState.ALIVE:
            self._set(PeerState.ALIVE, now, "")

    def on_no_path(self, now: float, path: str, status: int) -> Outage:
        """A slice failed on `path` with `status` and no other path was left: the outage it waits on.
        The first one of an outage asks for a check at once; later ones wait for the back-off."""
        if self.outage is None:
            self.outage = Outage(self.engine_id, now)
            self._next_check = now
        self.outage.note(path, status)
        if self.state is PeerState.ALIVE:
            self._set(PeerState.SILENT, now, "every path failed")
        return self.outage

    def on_retry_round(self, backoff_s: float) -> None:
        if self.outage is not None:
            self.outage.rounds += 1
            self.outage.backoff_s = max(self.outage.backoff_s, backoff_s)

    def on_check(self, now: float, result: CheckResult, detail: str = "") -> None:
        """The result of a check of the peer's control endpoint (started after `check_due`)."""
        self._checking = False
        text = result.value + (f" ({detail})" if detail else "")
        if self.outage is not None:
            self.outage.check = text
        self._answered = result is CheckResult.ANSWERED
        if result is CheckResult.ANSWERED:
            if self.state is not PeerState.ALIVE:
                self._set(PeerState.ALIVE, now, "")
        elif result is CheckResult.REFUSED:
            self._set(PeerState.DEAD, now, f"its control endpoint refused the connection: the process is gone ({detail})"
                      if detail else "its control endpoint refused the connection: the process is gone", gone=True)  # fmt: skip
        self._next_check = now + self._check_backoff
        self._check_backoff = min(self._check_backoff * 2, self.config.check_backoff_cap_s)

    def on_deadline(self, now: float) -> None:
        """A request reached its deadline waiting on this peer. Unless the last check found the
        process alive (only its data paths fail), remember it as dead: new requests fail at once."""
        if self.state is not PeerState.DEAD and self.outage is not None and not self._answered:
            silent = now - self.outage.since
            self._set(PeerState.DEAD, now, f"silent for {silent:.2f}s: a request reached its deadline waiting for it")

    # ---- queries --------------------------------------------------------------------------------

    def check_due(self, now: float) -> bool:
        """True when a check of the control endpoint should start now (records it as started: the
        caller runs it and reports `on_check`)."""
        if self.state is PeerState.ALIVE or self._checking or now < self._next_check:
            return False
        self._checking = True
        return True

    def check_lost(self, now: float) -> None:
        """A started check could not be run (the watcher is gone): allow another one later."""
        self._checking = False
        self._next_check = now + self._check_backoff

    @property
    def dead(self) -> bool:
        return self.state is PeerState.DEAD

    def ends_waiting(self, now: float) -> str | None:
        """The reason requests already waiting on the peer end now: only when its process is gone
        (None: they wait until their own deadlines, or until the peer answers again)."""
        return self.fail_fast(now) if self.gone else None

    def fail_fast(self, now: float) -> str | None:
        """The reason new requests to the peer fail at once (None: they may go ahead)."""
        if self.state is not PeerState.DEAD:
            return None
        text = f"engine {self.engine_id} is unreachable: {self.reason}, {now - self.since:.2f}s ago"
        if self.outage is not None:
            text += f" ({self.outage.describe(now)})"
        return text + "; requests fail at once until it answers again"

    def _set(self, state: PeerState, now: float, reason: str, gone: bool = False) -> None:
        self.state = state
        self.gone = gone
        self.since = now
        self.reason = reason


__all__ = ["CheckResult", "Outage", "PeerLiveness", "PeerState"]
