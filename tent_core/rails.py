"""Rail identities and their telemetry slots.

A rail is one path of one transport to one peer. Each gets a slot in the native
telemetry array (8 int64 counters the executors' completions update without the GIL);
the scheduler reads them through a numpy view.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from . import _native
from .config import SchedulerConfig
from .telemetry import RailTelemetry
from .types import RailInfo

MAX_RAIL_SLOTS = 4096


@dataclass(eq=False)
class Rail:
    transport: str
    peer_id: str
    info: RailInfo
    slot: int
    telemetry: RailTelemetry


class RailTable:
    def __init__(self, slots: int = MAX_RAIL_SLOTS) -> None:
        self.stats = np.zeros((slots, _native.STAT_FIELDS), np.int64)
        _native.set_stats(self.stats)
        self._lock = threading.Lock()
        self._by_key: dict[tuple[str, str, int], Rail] = {}
        self._by_slot: list[Rail] = []

    def get(self, transport: str, peer_id: str, info: RailInfo, config: SchedulerConfig | None = None) -> Rail:
        key = (transport, peer_id, info.index)
        with self._lock:
            rail = self._by_key.get(key)
            if rail is None:
                slot = len(self._by_slot)
                if slot >= len(self.stats):
                    raise RuntimeError(f"more than {len(self.stats)} rails in one process")
                tel = RailTelemetry(slot, info.nominal_gbps * 1e9, info.penalty, config=config, name=info.name)
                rail = Rail(transport, peer_id, info, slot, tel)
                self._by_key[key] = rail
                self._by_slot.append(rail)
            return rail

    def by_slot(self, slot: int) -> Rail | None:
        return self._by_slot[slot] if 0 <= slot < len(self._by_slot) else None

    def row(self, slot: int) -> np.ndarray:
        return self.stats[slot]


RAILS = RailTable()
