"""Stream ordering: transfers that start after device work and signal device events when done.

A request may name ``wait_stream`` (the transfer starts after everything queued on that stream
when submit was called), ``wait_event`` (after the event's most recent record as of submit) and
``signal_event`` (an event that fires once the transfer is final). The unit is the batch: a batch
starts when every wait of its requests is passed, and its signals fire when all of it is final.

How a wait is honoured:

* on the device, when every slice of the batch goes to transports whose executors order copies
  against device events themselves (``Transport.order_batch``: nvlink makes its CUDA streams wait
  for the event, gds's workers wait before their I/O, simdev's streams wait): the batch is
  submitted at once and no host thread blocks;
* otherwise on the host (staged paths, TCP, a full order table): the batch is held back and
  dispatched by this module's thread once the event is passed, or failed at its deadline.

A signal is armed at submit (`DeviceRuntime.arm_signal`: the event is recorded behind a gate on
an internal stream), so a consumer may make its stream wait for the event right after submit;
the gate opens when the batch is final - done, failed, cancelled or past its deadline (check the
handle to know which). Everything here keeps a deadline: a held batch fails at its own, a gate
that nobody opens lets its stream go a few seconds after the batch's deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import _native, devices, errors
from .abi import Status
from .batch import BatchHandle
from .request import Request

log = logging.getLogger(__name__)


@dataclass
class OrderSpec:
    """The ordering a batch asks for: one wait (the join of its requests' waits) and signals."""

    runtime: devices.DeviceRuntime
    wait: devices.EventMark | None
    signals: list[Any] = field(default_factory=list)


def collect(requests: Sequence[Request]) -> OrderSpec | None:
    """The batch's ordering, or None when no request names a stream or an event. Marks are taken
    now (submit time): later records of the same event do not move the point the batch waits for."""
    streams: list[Any] = []
    events: list[Any] = []
    signals: list[Any] = []
    kinds = []
    for r in requests:
        ws, we, se = r.wait_stream, r.wait_event, r.signal_event
        if ws is None and we is None and se is None:
            continue
        kinds.append(r.local.kind)
        if ws is not None:
            streams.append(ws)
        if we is not None:
            events.append(we)
        if se is not None:
            signals.append(se)
    if not (streams or events or signals):
        return None
    rt = devices.for_request([*streams, *events, *signals], kinds)
    marks = [rt.mark_stream(s) for s in streams] + [rt.mark_event(e) for e in events]
    wait = marks[0] if len(marks) == 1 else (rt.join(marks) if marks else None)
    return OrderSpec(rt, wait, signals)


@dataclass
class _Held:
    handle: BatchHandle
    units: int
    start: Callable[[], None]
    spec: OrderSpec


@dataclass
class _Watched:
    handle: BatchHandle
    gates: list[devices.Gate]
    native: list[Any]
    spec: OrderSpec


class Orderer:
    """One engine's ordered batches: those held until their event passes, and those whose signals
    fire (and whose order-table entries go) when they are final. One thread, started on first use."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._held: list[_Held] = []
        self._watched: list[_Watched] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self.stats = {"native": 0, "host": 0, "signals": 0}

    def launch(self, handle: BatchHandle, units: int, transports: Sequence[Any], staged: bool,
               start: Callable[[], None], spec: OrderSpec) -> str:
        """Start the batch under `spec`: returns "native", "host" or "none" (how the wait is honoured).
        `start` dispatches the batch; `transports` are those its direct slices go to."""
        gates = [spec.runtime.arm_signal(ev, handle.deadline) for ev in spec.signals]
        self.stats["signals"] += len(gates)
        how = "none"
        native: list[Any] = []
        if spec.wait is not None:
            if not staged and transports and all(hasattr(t, "order_batch") for t in transports):
                token = handle._batch.token
                for t in transports:
                    if t.order_batch(token, spec.wait, handle.deadline):
                        native.append(t)
                    else:  # the executor's table is full, or it cannot wait on this runtime's events
                        for u in native:
                            u.order_done(token)
                        native = []
                        break
            how = "native" if native else "host"
            self.stats[how] += 1
        if spec.wait is None or native:
            start()
            if gates or native:
                self._add(watched=_Watched(handle, gates, native, spec))
            return how
        self._add(held=_Held(handle, units, start, spec), watched=_Watched(handle, gates, [], spec))
        return how

    def _add(self, held: _Held | None = None, watched: _Watched | None = None) -> None:
        with self._cv:
            if self._closed:
                raise errors.TentError("engine is closed")
            if held is not None:
                self._held.append(held)
            if watched is not None:
                self._watched.append(watched)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tent-ordering", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        idle = 20e-6
        while True:
            with self._cv:
                while not self._held and not self._watched and not self._closed:
                    self._cv.wait()
                if self._closed and not self._held and not self._watched:
                    return
                held, watched = list(self._held), list(self._watched)
            moved = self._step(held, watched)
            if moved:
                idle = 20e-6
                continue
            # nothing moved: sleep in the likeliest wait (the oldest held mark, else the oldest batch)
            try:
                if held:
                    held[0].spec.wait.wait(min(idle, 1e-3))  # type: ignore[union-attr]
                elif watched:
                    _native.Batch.wait(watched[0].handle._batch, min(idle * 4, 5e-3))  # the counter's wait: never raises
            except Exception:
                log.exception("ordering: waiting failed")
                time.sleep(1e-3)
            idle = min(idle * 2, 1e-3)

    def _step(self, held: list[_Held], watched: list[_Watched]) -> bool:
        moved = False
        now = time.monotonic()
        for h in held:
            batch = h.handle._batch
            status = 0
            if batch.cancelled:
                status = int(Status.E_CANCELLED)
            elif now >= h.handle.deadline:
                status = int(Status.E_TIMEOUT)
            elif not h.spec.wait.query():  # type: ignore[union-attr]
                continue
            with self._cv:
                self._held.remove(h)
            moved = True
            if status:
                if status == Status.E_TIMEOUT:
                    h.handle._expire()  # the deadline, not a path, ended it: wait() raises DeadlineExceededError
                log.debug("ordering: batch held for its event %s", "was cancelled" if status == Status.E_CANCELLED
                          else "missed its deadline")
                for _ in range(h.units):
                    batch.fail_slice(status)
                continue
            try:
                h.start()
            except Exception:  # finalize what the dispatch did not take
                log.exception("ordering: dispatching a held batch failed")
                for _ in range(batch.remaining):
                    batch.fail_slice(int(Status.E_INTERNAL))
        for w in watched:
            if w.handle._batch.remaining:  # every unit finalizes, at the latest at the batch's deadline
                continue
            with self._cv:
                if w in self._watched:
                    self._watched.remove(w)
                else:
                    continue
            moved = True
            self._finish(w)
        return moved

    @staticmethod
    def _finish(w: _Watched) -> None:
        token = w.handle._batch.token
        for t in w.native:
            try:
                t.order_done(token)
            except Exception:
                log.exception("ordering: order_done failed")
        for g in w.gates:
            try:
                g.open()
            except Exception:
                log.exception("ordering: opening a signal gate failed")
        if w.spec.wait is not None:
            w.spec.wait.release()

    def close(self) -> None:
        """Fail held batches (cancelled) and wait until every watched batch is final."""
        with self._cv:
            self._closed = True
            for h in self._held:
                h.handle._batch.cancel()
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=60)


__all__ = ["OrderSpec", "Orderer", "collect"]
