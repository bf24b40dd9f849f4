"""Rail identities and their telemetry slots.

A rail is one path of one transport to one peer. Each gets a slot in the native telemetry array
(a row of `tent_core.abi.StatField` int64 counters that the executors' completions update without
the GIL); the scheduler reads them through a numpy view.

Slots are process-wide and reference counted: engines `acquire` a rail when a route connects and
`release` it when the route goes (peer forgotten or replaced, engine closed). A slot whose last
holder released it is reused only once no slice counted on it is in flight any more (its row is
zeroed then), so peer churn never exhausts the table and a late completion never lands in another
rail's row.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from . import _native
from .abi import STAT_FIELDS, StatField
from .config import SchedulerConfig
from .telemetry import RailTelemetry
from .types import RailInfo

MAX_RAIL_SLOTS = 4096
_INFLIGHT = int(StatField.INFLIGHT_SLICES)


@dataclass(eq=False)
class Rail:
    transport: str
    peer_id: str
    info: RailInfo
    slot: int
    telemetry: RailTelemetry
    holders: int = field(default=0, repr=False)  # RailTable bookkeeping


class RailTable:
    """The process's rail slots. `install` points the native completion path at this table's
    counters (the process-wide RAILS does; a private table in a unit test does not)."""

    def __init__(self, slots: int = MAX_RAIL_SLOTS, *, install: bool = True) -> None:
        self.stats = np.zeros((slots, STAT_FIELDS), np.int64)
        if install:
            _native.set_stats(self.stats)
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str, int], Rail] = {}
        self._by_slot: list[Rail | None] = []
        self._free: list[int] = []  # released slots, reusable once their row shows nothing in flight

    def acquire(self, transport: str, peer_id: str, info: RailInfo, config: SchedulerConfig | None = None) -> Rail:
        """The rail for (transport, peer, rail index), shared by every engine of the process that
        holds it; each acquire needs one release."""
        key = (transport, peer_id, info.index)
        with self._lock:
            rail = self._by_key.get(key)
            if rail is None:
                slot = self._take_slot()
                tel = RailTelemetry(slot, info.nominal_gbps * 1e9, info.penalty, config=config, name=info.name)
                rail = Rail(transport, peer_id, info, slot, tel)
                self._by_key[key] = rail
                self._by_slot[slot] = rail
            rail.holders += 1
            return rail

    get = acquire  # the name callers used before slots were released

    def release(self, rail: Rail) -> bool:
        """Drop one hold; True when that was the last and the slot went back to the table."""
        with self._lock:
            if rail.holders <= 0 or self._by_slot[rail.slot] is not rail:
                return False
            rail.holders -= 1
            if rail.holders:
                return False
            del self._by_key[(rail.transport, rail.peer_id, rail.info.index)]
            self._by_slot[rail.slot] = None
            self._free.append(rail.slot)
            return True

    def _take_slot(self) -> int:
        for i, slot in enumerate(self._free):
            if self.stats[slot, _INFLIGHT] <= 0:  # late completions of the old rail have all landed
                del self._free[i]
                self.stats[slot] = 0
                return slot
        slot = len(self._by_slot)
        if slot >= len(self.stats):
            raise RuntimeError(
                f"all {len(self.stats)} rail slots are in use ({len(self._free)} released ones still have slices in flight)"
            )
        self._by_slot.append(None)
        return slot

    def by_slot(self, slot: int) -> Rail | None:
        return self._by_slot[slot] if 0 <= slot < len(self._by_slot) else None

    def row(self, slot: int) -> np.ndarray:
        return self.stats[slot]

    def in_use(self) -> int:
        """Rails currently held by some engine."""
        with self._lock:
            return len(self._by_key)

    @property
    def high_water(self) -> int:
        """Slots ever handed out (the table never shrinks; reuse keeps this at the peak in use)."""
        return len(self._by_slot)


RAILS = RailTable()
