"""Rail identities and their telemetry slots.

A rail is one path of one transport to one peer. Each gets a slot in the native telemetry array
(a row of `tent_core.abi.StatField` int64 counters that the executors' completions update without
the GIL); the scheduler reads them through a numpy view.

Slots are process-wide and reference counted: engines `acquire` a rail when a route connects and
`release` it when the route goes (peer forgotten or replaced, engine closed), so peer churn never
exhausts the table. A slot outlives its rail in two ways, and neither may reach the next holder's row:

* slices counted on it are still in flight: the slot is reused only once none is (the completion
  path takes a slice out of flight after its last count), its counters zeroed then;
* something still holds the old `Rail` (a plan being dispatched, a retry, a heartbeat, a failure
  waiting for recovery) and submits or looks it up later: slices carry `Rail.stat_index`, the slot
  and the generation of its holder, and the slot's generation moves on when the rail is released,
  so such a slice counts nowhere and `by_index` no longer finds the rail.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _native
from .abi import STAT_FIELDS, STAT_SLOT_BITS, StatField
from .config import SchedulerConfig
from .telemetry import RailTelemetry
from .types import RailInfo

MAX_RAIL_SLOTS = 1 << STAT_SLOT_BITS
_SLOT_MASK = MAX_RAIL_SLOTS - 1
_INFLIGHT = int(StatField.INFLIGHT_SLICES)
_INFLIGHT_BYTES = int(StatField.INFLIGHT_BYTES)
_GEN = int(StatField.GENERATION)
_MAX_GEN = (1 << (32 - STAT_SLOT_BITS)) - 2  # as native stat_retire: never all ones (STAT_NONE)


@dataclass(eq=False)
class Rail:
    transport: str
    peer_id: str
    info: RailInfo
    slot: int  # the row of the telemetry table (and the rail monitor's key)
    telemetry: RailTelemetry
    stat_index: int = 0  # what its slices carry: the slot and this holder's generation of it
    holders: int = field(default=0, repr=False)  # RailTable bookkeeping
    load_key: str = field(default="", repr=False)  # its key in the host-wide load table (recovery), once made


class RailTable:
    """The process's rail slots. `install` points the native completion path at this table's
    counters (the process-wide RAILS does; a private table in a unit test does not)."""

    def __init__(self, slots: int = MAX_RAIL_SLOTS, *, install: bool = True) -> None:
        if slots > MAX_RAIL_SLOTS:
            raise ValueError(
                f"at most {MAX_RAIL_SLOTS} rail slots (a slice's stat_index has {STAT_SLOT_BITS} bits for it)"
            )
        self.stats = np.zeros((slots, STAT_FIELDS), np.int64)
        self._installed = install
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
                slot, gen = self._take_slot()
                tel = RailTelemetry(slot, info.nominal_gbps * 1e9, info.penalty, config=config, name=info.name)
                rail = Rail(transport, peer_id, info, slot, tel, slot | gen << STAT_SLOT_BITS)
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
            self._retire(rail.slot)
            self._free.append(rail.slot)
            return True

    def _take_slot(self) -> tuple[int, int]:
        """A slot for a new rail and its generation there (counters zeroed)."""
        for i, slot in enumerate(self._free):
            gen = self._claim(slot)
            if gen:  # the old rail's counted slices have all landed
                del self._free[i]
                return slot, gen
        while len(self._by_slot) < len(self.stats):
            slot = len(self._by_slot)
            self._by_slot.append(None)
            gen = self._claim(slot)
            if gen:
                return slot, gen
            self._free.append(slot)  # a raw submit passing through its counters: later
        raise RuntimeError(
            f"all {len(self.stats)} rail slots are in use ({len(self._free)} released ones still have slices in flight)"
        )

    def _claim(self, slot: int) -> int:
        if self._installed:  # against the completion path, with its atomics
            return int(_native.stat_claim(slot))
        row = self.stats[slot]
        if row[_INFLIGHT] > 0:
            return 0
        keep = row[[_INFLIGHT_BYTES, _INFLIGHT, _GEN]].copy()
        row[:] = 0
        row[[_INFLIGHT_BYTES, _INFLIGHT, _GEN]] = keep
        row[_GEN] = row[_GEN] or 1
        return int(row[_GEN])

    def _retire(self, slot: int) -> None:
        if self._installed:
            _native.stat_retire(slot)
        else:
            self.stats[slot, _GEN] = self.stats[slot, _GEN] % _MAX_GEN + 1

    def by_slot(self, slot: int) -> Rail | None:
        """The rail holding telemetry slot `slot` now."""
        return self._by_slot[slot] if 0 <= slot < len(self._by_slot) else None

    def by_index(self, stat_index: int) -> Rail | None:
        """The rail a slice's stat_index names, if it still holds its slot (None once released)."""
        rail = self.by_slot(stat_index & _SLOT_MASK)
        return rail if rail is not None and rail.stat_index == stat_index else None

    def row(self, slot: int) -> np.ndarray:
        """The telemetry row of a slot (a stat_index names the same row)."""
        return self.stats[slot & _SLOT_MASK]

    def snapshot(self, slot: int) -> tuple[int, ...]:
        """The counters of a slot's row now, as plain ints (what `RailTelemetry.observe` folds): read
        in C for the installed table, so the health tick touches no numpy code on its common path."""
        if self._installed:
            return _native.stat_row(slot & _SLOT_MASK)  # type: ignore[no-any-return]
        return tuple(self.stats[slot & _SLOT_MASK].tolist())

    def in_use(self) -> int:
        """Rails currently held by some engine."""
        with self._lock:
            return len(self._by_key)

    @property
    def high_water(self) -> int:
        """Slots ever handed out (the table never shrinks; reuse keeps this at the peak in use)."""
        return len(self._by_slot)


def publish(fast: Any, rail: Rail, weight: float, taken: int = 0) -> None:
    """Hand a rail's telemetry and health weight to the native fast path's mouse choice
    (`_native.FastPath.rail_publish`); `taken`: the fast path's own assignments (`rail_added`)
    folded into the telemetry's pending bytes since the last publish."""
    tel = rail.telemetry
    fast.rail_publish(rail.stat_index, tel.inflight_bytes + tel.external_bytes, tel.pending_bytes, tel.pending_ns,
                      tel.confirmed_ns, tel.busy, tel.bandwidth_Bps, tel.penalty, weight, taken)


def fold_fast(fast: Any, rail: Rail) -> int:
    """Fold what the fast path gave `rail` since its last publish into the telemetry's pending bytes
    (as the planner's add_pending would have); returns it, for the next `publish` to take off."""
    added, added_ns = fast.rail_added(rail.stat_index)
    if added:
        tel = rail.telemetry
        tel.add_pending(added, max(added_ns, tel.pending_ns))
        # negative: mice folded last tick whose batch then went to the planner after all; their
        # bytes may have expired from pending meanwhile (pending_ttl_s), and pending never goes below 0
        tel.pending_bytes = max(0, tel.pending_bytes)
    return int(added)


RAILS = RailTable()
