"""Logs a peer cannot flood: a token bucket per kind of message.

Servers log what bad peers send them (malformed frames, failed authentication). Without a limit,
a peer that sends a million bad frames writes a million log lines. ``RateLimitedLog`` lets each
*key* (a kind of event, not the peer, so a peer cannot make new keys) through at `rate_per_s`
with bursts of `burst`; the next line that passes says how many were suppressed meanwhile.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLog:
    def __init__(
        self,
        logger: logging.Logger,
        *,
        rate_per_s: float = 1.0,
        burst: int = 10,
        max_keys: int = 256,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.rate = rate_per_s
        self.burst = float(burst)
        self.max_keys = max_keys
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, list[float]] = {}  # key -> [tokens, last refill, suppressed]
        self.suppressed_total = 0

    def allow(self, key: str) -> tuple[bool, int]:
        """(may log now, how many lines of this key were suppressed since the last one)."""
        now = self._clock()
        with self._lock:
            b = self._buckets.get(key)
            if b is None:
                if len(self._buckets) >= self.max_keys:
                    key = "(other)"
                    b = self._buckets.get(key)
                if b is None:
                    b = self._buckets[key] = [self.burst, now, 0.0]
            b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate)
            b[1] = now
            if b[0] >= 1.0:
                b[0] -= 1.0
                n = int(b[2])
                b[2] = 0.0
                return True, n
            b[2] += 1
            self.suppressed_total += 1
            return False, 0

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        if not self.logger.isEnabledFor(level):
            return False
        ok, suppressed = self.allow(key)
        if ok:
            if suppressed:
                msg += f" ({suppressed} similar message(s) suppressed)"
            self.logger.log(level, msg, *args)
        return ok

    def warning(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, msg, *args)

    def info(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.INFO, key, msg, *args)

    def error(self, key: str, msg: str, *args: object) -> bool:
        return self.log(logging.ERROR, key, msg, *args)
