"""Rail health: HEALTHY / DEGRADED / PAUSED, with back-off, heartbeat probes and gradual re-admission.

Paper section 4.3. Per rail (one local/remote NIC pair of one transport):

* HEALTHY: full weight.
* DEGRADED: weight x `degraded_weight` (0.5). Entered on an error below the pause threshold, on a
  congestion event, or when telemetry shows the rail far slower than its siblings (`check_outliers`).
  Back to HEALTHY after `quiet_period_s` without errors or degradation events.
* PAUSED: weight 0, excluded. Entered when errors within `error_window_s` reach the threshold: a hard
  error counts 1, a congestion error counts 1/`congestion_multiplier` (so congestion needs twice the
  threshold, and mixes count proportionally). The cooldown starts at `cooldown_base_s` and doubles
  on each repeated pause up to `cooldown_cap_s`; `cooldown_reset_s` of good health resets it.
  When the cooldown has expired, `due_probe` says "send one small heartbeat slice now". Its
  success re-admits the rail *gradually*: `readmit_weights` steps, then DEGRADED, then HEALTHY
  after the quiet period. Its failure, or no answer within `probe_timeout_s` (a dead veth answers
  nothing), pauses the rail again with a doubled cooldown.

Differences from the C++ `RailMonitor`, on purpose: a success does not wipe the error count (errors
age out of the window instead, so a flapping rail that still completes some slices is caught: the
"reset, not decay" gap its own docs flag); the cooldown expiring does not re-admit a rail blindly,
a heartbeat must succeed first; re-admission is gradual.

Pure: every call takes `now` (seconds, any monotonic clock), nothing sleeps. The engine's submit
threads read weights while its progress thread feeds events, so every public method holds the
monitor's own (reentrant) lock: a transition is never seen half made.
Rails are identified by any hashable key (the engine uses the rail index).
"""

from __future__ import annotations

import enum
import functools
import logging
import random
import statistics
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .config import RailHealthConfig

_F = TypeVar("_F", bound=Callable[..., Any])


def _locked(fn: _F) -> _F:
    @functools.wraps(fn)
    def wrapper(self: RailMonitor, *args: Any, **kw: Any) -> Any:
        with self._lock:
            return fn(self, *args, **kw)

    return wrapper  # type: ignore[return-value]

log = logging.getLogger(__name__)


class RailState(enum.IntEnum):
    HEALTHY = 0
    DEGRADED = 1
    PAUSED = 2


HEALTHY = RailState.HEALTHY
DEGRADED = RailState.DEGRADED
PAUSED = RailState.PAUSED


@dataclass
class _Rail:
    state: RailState = RailState.HEALTHY
    errors: deque[tuple[float, float]] = field(default_factory=deque)  # (time, units)
    last_event: float = float("-inf")  # last error / degradation event (quiet-period clock)
    pause_count: int = 0  # consecutive pauses: cooldown = base * 2**(pause_count-1)
    resume_at: float = 0.0  # PAUSED: probes allowed from then
    probe_sent: float | None = None  # PAUSED: outstanding heartbeat
    readmit_step: int = -1  # >= 0: gradual re-admission step index (state DEGRADED)
    step_since: float = 0.0
    healthy_since: float = 0.0


class RailMonitor:
    """Health state machine for a set of rails; see the module docstring."""

    def __init__(self, config: RailHealthConfig | None = None) -> None:
        self.config = config or RailHealthConfig()
        self._rails: dict[Hashable, _Rail] = {}
        self._units_to_pause = float(self.config.error_threshold)
        self._rng = random.Random(self.config.jitter_seed)
        self._lock = threading.RLock()
        # True: every rail was HEALTHY when last looked at and none left it since (cleared by every
        # transition out of HEALTHY, set again by `settled`). A HEALTHY rail waits for no heartbeat,
        # re-admission step or quiet period, so while this holds the health tick asks nothing of
        # the monitor per rail (a plain read: a rail paused from another thread right after it is
        # acted on at the next tick)
        self.calm = True

    def _get(self, rail: Hashable) -> _Rail:
        r = self._rails.get(rail)
        if r is None:
            r = self._rails[rail] = _Rail()
        return r

    # ---- transitions ---------------------------------------------------------------------------

    def _advance(self, rail: Hashable, r: _Rail, now: float) -> None:
        """Apply the time-driven transitions (quiet period, re-admission steps, probe timeout)."""
        cfg = self.config
        if r.state is RailState.PAUSED:
            if r.probe_sent is not None and now - r.probe_sent >= cfg.probe_timeout_s:
                log.info("rail %s: heartbeat unanswered for %.3fs, stays paused", rail, now - r.probe_sent)
                self._rearm(r, r.probe_sent + cfg.probe_timeout_s)
            return
        if r.state is RailState.DEGRADED:
            if r.readmit_step >= 0:
                while r.readmit_step >= 0 and now - r.step_since >= cfg.readmit_step_s:
                    r.step_since += cfg.readmit_step_s
                    r.readmit_step += 1
                    if r.readmit_step >= len(cfg.readmit_weights):
                        r.readmit_step = -1
                        r.last_event = r.step_since  # the quiet period starts after the last step
                if r.readmit_step >= 0:
                    return
            if now - r.last_event >= cfg.quiet_period_s:
                r.state = RailState.HEALTHY
                r.healthy_since = now
                log.info("rail %s: HEALTHY again", rail)
        if r.state is RailState.HEALTHY and r.pause_count and now - r.healthy_since >= cfg.cooldown_reset_s:
            r.pause_count = 0

    def _pause(self, rail: Hashable, r: _Rail, now: float) -> None:
        cfg = self.config
        r.pause_count += 1
        cooldown = self._jitter(min(cfg.cooldown_cap_s, cfg.cooldown_base_s * (2 ** (r.pause_count - 1))))
        r.state = RailState.PAUSED
        self.calm = False
        r.resume_at = now + cooldown
        r.probe_sent = None
        r.readmit_step = -1
        r.errors.clear()
        r.last_event = now
        log.warning("rail %s: PAUSED for %.3fs (pause #%d)", rail, cooldown, r.pause_count)

    def _rearm(self, r: _Rail, now: float) -> None:
        """A paused rail failed its heartbeat: keep probing at the same cadence. Only a rail that
        fails again after re-admission (a flapping rail) earns a longer cooldown, so a rail that
        was down for seconds is back within one cooldown of its return."""
        cfg = self.config
        r.resume_at = now + self._jitter(min(cfg.cooldown_cap_s, cfg.cooldown_base_s * (2 ** max(0, r.pause_count - 1))))
        r.probe_sent = None
        r.last_event = now

    def _jitter(self, cooldown: float) -> float:
        # Heartbeats at a fixed period can phase-lock with a periodic fault (a rail flapping at the
        # probe period is always probed while down); a random spread breaks the lock.
        j = self.config.cooldown_jitter
        return cooldown * (1.0 + j * (2.0 * self._rng.random() - 1.0)) if j > 0 else cooldown

    @_locked
    def on_success(self, rail: Hashable, now: float) -> None:
        """A slice (or heartbeat) completed on `rail`."""
        r = self._get(rail)
        self._advance(rail, r, now)
        if r.state is RailState.PAUSED and now >= r.resume_at:
            # The heartbeat (or a late slice, equally good evidence) made it: re-admit gradually.
            r.probe_sent = None
            r.errors.clear()
            r.last_event = now
            r.state = RailState.DEGRADED  # then HEALTHY after the steps and a quiet period
            r.readmit_step = 0 if self.config.readmit_weights else -1
            r.step_since = now
            log.info("rail %s: heartbeat ok, re-admitting", rail)

    @_locked
    def on_error(self, rail: Hashable, now: float, congestion: bool = False) -> RailState:
        """A slice failed or timed out on `rail`; returns the rail's new state."""
        cfg = self.config
        r = self._get(rail)
        self._advance(rail, r, now)
        if r.state is RailState.PAUSED:
            if r.probe_sent is not None or now >= r.resume_at:
                self._rearm(r, now)  # the heartbeat failed: probe again after the same cooldown
            return r.state
        units = 1.0 / cfg.congestion_multiplier if congestion else 1.0
        errs = r.errors
        errs.append((now, units))
        while errs and now - errs[0][0] > cfg.error_window_s:
            errs.popleft()
        total = sum(u for _, u in errs)
        if total >= self._units_to_pause - 1e-9 or r.readmit_step >= 0:
            # A rail on probation goes straight back to PAUSED on its first error.
            self._pause(rail, r, now)
        else:
            if r.state is RailState.HEALTHY:
                log.info("rail %s: DEGRADED after %s error", rail, "congestion" if congestion else "hard")
            r.state = RailState.DEGRADED
            self.calm = False
            r.last_event = now
        return r.state

    @_locked
    def mark_degraded(self, rail: Hashable, now: float) -> None:
        """Telemetry says `rail` is far slower than its peers: halve its weight for a quiet period."""
        r = self._get(rail)
        self._advance(rail, r, now)
        if r.state is RailState.PAUSED:
            return
        if r.state is RailState.HEALTHY:
            log.info("rail %s: DEGRADED (cost outlier)", rail)
        r.state = RailState.DEGRADED
        self.calm = False
        r.last_event = now

    @_locked
    def check_outliers(self, slowness: Mapping[Hashable, float] | Sequence[float], now: float) -> list[Hashable]:
        """Mark DEGRADED every usable rail whose slowness exceeds `outlier_ratio` x the median.

        `slowness` maps rail -> how slow it is relative to what it should do (the engine passes the
        inverse of its recent service rate as a fraction of nominal; a predicted cost works too), or
        is a sequence indexed by rail. Paused rails and NaNs are ignored; fewer than two rails means
        no siblings to compare with. A marked rail stays DEGRADED while it keeps being marked and
        for `quiet_period_s` after. Returns the rails marked.
        """
        items = slowness.items() if isinstance(slowness, Mapping) else enumerate(slowness)
        usable = [(k, c) for k, c in items if c == c and self.state(k, now) is not RailState.PAUSED]
        if len(usable) < 2:
            return []
        med = statistics.median(c for _, c in usable)
        limit = med * self.config.outlier_ratio
        marked = [k for k, c in usable if c > limit]
        for k in marked:
            self.mark_degraded(k, now)
        return marked

    def outlier_possible(self, slowness: Iterable[float]) -> bool:
        """False when `check_outliers` of these values (any subset of them, paused rails left out)
        cannot mark a rail: none exceeds `outlier_ratio` x the smallest, and the median is never
        below the smallest. Lets the health tick skip the median on the common tick."""
        vals = list(slowness)
        return len(vals) >= 2 and max(vals) > min(vals) * self.config.outlier_ratio

    @_locked
    def pause(self, rail: Hashable, now: float) -> None:
        """Pause `rail` at once (e.g. telemetry shows it stalled: traffic stopped without an error)."""
        r = self._get(rail)
        self._advance(rail, r, now)
        if r.state is not RailState.PAUSED:
            self._pause(rail, r, now)

    @_locked
    def forget(self, rail: Hashable) -> None:
        """Drop what is known about `rail` (its key, e.g. a telemetry slot, may name another rail later)."""
        self._rails.pop(rail, None)

    # ---- queries --------------------------------------------------------------------------------

    @_locked
    def state(self, rail: Hashable, now: float) -> RailState:
        r = self._get(rail)
        self._advance(rail, r, now)
        return r.state

    @_locked
    def weight(self, rail: Hashable, now: float) -> float:
        """Spray weight: 1.0 HEALTHY, `degraded_weight` DEGRADED (less while re-admitting), 0.0 PAUSED."""
        r = self._get(rail)
        self._advance(rail, r, now)
        if r.state is RailState.HEALTHY:
            return 1.0
        if r.state is RailState.PAUSED:
            return 0.0
        if r.readmit_step >= 0:
            return self.config.readmit_weights[r.readmit_step]
        return self.config.degraded_weight

    @_locked
    def weights(self, rails: Iterable[Hashable], now: float) -> list[float]:
        return [self.weight(k, now) for k in rails]

    @_locked
    def states(self, rails: Iterable[Hashable], now: float) -> list[RailState]:
        return [self.state(k, now) for k in rails]

    @_locked
    def settled(self, now: float) -> bool:
        """True when every rail is HEALTHY: no transition waits for the clock or a heartbeat (the
        progress thread may then sleep long; what stays lazy, errors ageing out of the window and
        the cooldown reset, needs no tick)."""
        for key, r in self._rails.items():
            if r.state is not RailState.HEALTHY:
                self._advance(key, r, now)
                if r.state is not RailState.HEALTHY:
                    return False
        self.calm = True
        return True

    @_locked
    def due_probe(self, rail: Hashable, now: float) -> bool:
        """True when `rail` is PAUSED, its cooldown is over and no heartbeat is outstanding.

        Returning True records the heartbeat as sent (at `now`): the caller must send one small
        slice and report it with on_success / on_error. An unanswered heartbeat expires after
        `probe_timeout_s` and counts as a failure.
        """
        r = self._get(rail)
        self._advance(rail, r, now)
        if r.state is not RailState.PAUSED or now < r.resume_at or r.probe_sent is not None:
            return False
        r.probe_sent = now
        return True

    @_locked
    def resume_at(self, rail: Hashable) -> float | None:
        """When a PAUSED rail may be probed (None if not paused)."""
        r = self._get(rail)
        return r.resume_at if r.state is RailState.PAUSED else None

    @_locked
    def cooldown_s(self, rail: Hashable) -> float:
        """Cooldown of the current (or, if not paused, the next) pause of `rail`."""
        cfg = self.config
        r = self._get(rail)
        n = r.pause_count if r.state is RailState.PAUSED else r.pause_count + 1
        return min(cfg.cooldown_cap_s, cfg.cooldown_base_s * (2 ** max(n - 1, 0)))


__all__ = ["DEGRADED", "HEALTHY", "PAUSED", "RailMonitor", "RailState"]
