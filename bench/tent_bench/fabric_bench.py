"""`tent bench --fabric`: TENT over a real multi-rail fabric (network namespaces, veth, tc).

The parent (this module, in the CLI process) builds a fresh `Fabric` (node 0 <-> node 1 over N
shaped veth rails), starts the target engine inside node 1 (``python -m tent_bench.target``,
TCP rails = node 1's addresses) and, per scheduler policy, an initiator worker inside node 0
(``python -m tent_bench.fabric_worker``: an Engine with ``transports=["tcp"]``, TCP rails =
node 0's addresses). Both namespaces share one kernel, so the same-host shm transport would bypass
the fabric: the initiator offers TCP only.

Three experiments (the worker's modes):

* sweep (default): block x batch points under each policy; rows gain `policy`, `rails`,
  `rail_bytes` (bytes each rail carried during the point), the nominal and actual rail sums and the
  ratios to them; spray rows get `p99_vs_round_robin` when round robin ran in the same invocation;
* verify (`--duration` and/or `--fault`): continuous verified READs (every byte checked) while the
  parent applies a fault schedule to the fabric; summary row `kind="fault_summary"` with
  `app_errors`, `bytes_verified`, `dip_ms`, `readmit_ms`, ... (definitions in `analyze_faults`);
* mixed (`--mixed`): HIGH-priority 64 KiB mice while LOW-priority 64 MiB elephants saturate the
  rails, with QoS off and on when the engine config has a QoS switch (and "on, always": slots
  enforced even without higher-priority traffic, as the C++ rotation); each variant also measures
  one lone LOW and one lone MID elephant flow, the cost of QoS to a flow with the fabric to itself.

Everything is torn down on every exit path (worker killed, target stopped, namespaces deleted),
Ctrl-C included. Every wait is bounded.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tent_core.config import QosConfig

from .fabric_worker import OFFSET_SLOTS, OFFSET_STEP
from .rounds import POINT, per_round_ratios, round_order, spread, summarize
from .runner import target_process
from .testbed.fabric import Fabric, format_rate, parse_fabric_spec

log = logging.getLogger(__name__)

KiB, MiB = 1024, 1024 * 1024
BIN_S = 0.01  # timeline / dip resolution
DIP_FRACTION = 0.5  # a 10 ms bin below this fraction of the pre-fault steady state counts as dip
DIP_WINDOW_S = 1.0  # dip is counted within this long after the fault
WARMUP_S = 0.3  # the pre-fault steady state starts this long after the run started
READMIT_FRACTION = 0.5  # a returned rail is re-admitted once it carries this fraction of its old rate
FULL_RATE_FRACTION = 0.9  # a restored rail is back at full rate at this fraction of its old rate
SMOOTH_S = 0.1  # moving average for the re-admission / full-rate thresholds
TCP_GOODPUT = 0.956  # TCP/IP payload share of the shaped (layer 2) rate at MTU 1500


# ------------------------------------------------------------------ spec parsing


def parse_degrade(text: str | None) -> list[tuple[int, float]]:
    """"3:0.5,1:0.25" -> [(3, 0.5), (1, 0.25)]."""
    out: list[tuple[int, float]] = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^(\d+)\s*:\s*([0-9]*\.?[0-9]+)$", part)
        if not m:
            raise ValueError(f"bad --degrade item {part!r} (want RAIL:FACTOR, e.g. 3:0.5)")
        factor = float(m.group(2))
        if not 0 < factor <= 1:
            raise ValueError(f"degrade factor must be in (0, 1]: {part!r}")
        out.append((int(m.group(1)), factor))
    return out


def parse_time(text: str) -> float:
    """"1s", "1.5", "300ms" -> seconds."""
    m = re.match(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$", text)
    if not m:
        raise ValueError(f"bad time {text!r} (examples: 1s, 1.5, 300ms)")
    v = float(m.group(1))
    return v / 1e3 if m.group(2) == "ms" else v


@dataclass(frozen=True)
class FaultEvent:
    t: float  # seconds after the run started
    action: str  # down | up | degrade | restore
    rail: int
    factor: float = 1.0


@dataclass
class FaultPlan:
    events: list[FaultEvent] = field(default_factory=list)
    flap: tuple[int, float, float, float] | None = None  # rail, period, from, until

    @property
    def empty(self) -> bool:
        return not self.events


def parse_fault(text: str | None, duration: float) -> FaultPlan:
    """A fault scenario: items separated by ';'.

    * ``down I at T`` / ``up I at T``: take rail I down (silently: no carrier) / bring it back;
    * ``degrade I:FACTOR at T`` (also ``degrade I FACTOR at T``) / ``restore I at T``;
    * ``flap I every MS [from T] [until T]``: down/up alternately every MS (default from 1 s until
      `duration` - 1 s; the rail always ends up).
    """
    plan = FaultPlan()
    for raw in (text or "").split(";"):
        item = raw.strip().lower()
        if not item:
            continue
        m = re.match(r"^(down|up|restore)\s+(\d+)\s+at\s+(\S+)$", item)
        if m:
            plan.events.append(FaultEvent(parse_time(m.group(3)), m.group(1), int(m.group(2))))
            continue
        m = re.match(r"^degrade\s+(\d+)\s*[: ]\s*([0-9]*\.?[0-9]+)\s+at\s+(\S+)$", item)
        if m:
            factor = float(m.group(2))
            if not 0 < factor <= 1:
                raise ValueError(f"degrade factor must be in (0, 1]: {raw.strip()!r}")
            plan.events.append(FaultEvent(parse_time(m.group(3)), "degrade", int(m.group(1)), factor))
            continue
        m = re.match(r"^flap\s+(\d+)\s+every\s+(\S+)(?:\s+from\s+(\S+))?(?:\s+until\s+(\S+))?$", item)
        if m:
            rail, period = int(m.group(1)), parse_time(m.group(2))
            start = parse_time(m.group(3)) if m.group(3) else min(1.0, duration / 4)
            until = parse_time(m.group(4)) if m.group(4) else max(start + period, duration - 1.0)
            if period < 0.02:
                raise ValueError("flap period must be >= 20ms")
            plan.flap = (rail, period, start, until)
            t, down = start, True
            while t < until - 1e-9:
                plan.events.append(FaultEvent(t, "down" if down else "up", rail))
                t += period
                down = not down
            if not down:  # it is down: bring it back at the end
                plan.events.append(FaultEvent(min(t, until), "up", rail))
            continue
        raise ValueError(
            f"bad fault item {raw.strip()!r}; use 'down I at T', 'up I at T', 'degrade I:F at T', "
            "'restore I at T', 'flap I every MS'"
        )
    plan.events.sort(key=lambda e: e.t)
    if plan.events and plan.events[-1].t >= duration:
        raise ValueError(f"fault at {plan.events[-1].t}s is not before the end of the run ({duration}s)")
    return plan


# ------------------------------------------------------------------ configuration


@dataclass
class FabricBenchSpec:
    fabric: str = "4x1gbit"
    degrade: list[tuple[int, float]] = field(default_factory=list)
    policies: list[str] = field(default_factory=lambda: ["spray"])
    # sweep
    block_sizes: list[int] = field(default_factory=lambda: [1 * MiB, 64 * MiB])
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    ops: list[str] = field(default_factory=lambda: ["READ"])
    threads: int = 4
    iters: int = 400
    warmup: int = 1
    budget_s: float = 3.0
    # open loop: fixed offered loads (Gbit/s) instead of closed-loop submitters; each load runs
    # `seeds` arrival processes of `open_requests` timed requests under every policy
    offered_loads: list[float] = field(default_factory=list)
    seeds: int = 3
    open_requests: int = 40
    # closed-loop sweeps: every policy once per round, the order rotating (tent_bench.rounds)
    rounds: int = 1
    # verify / faults
    duration_s: float | None = None
    fault: str | None = None
    verify_block: int = 64 * MiB
    # mixed
    mixed: bool = False
    mouse_bytes: int = 64 * KiB
    mouse_interval_ms: float = 5.0
    mixed_duration_s: float = 4.0
    lone_s: float = 2.0  # each lone LOW / MID flow (measured before the mice, per variant and round)
    # engine knobs for fabric runs (progress timeout short: a downed veth gives no socket error)
    slice_timeout_ms: int = 100
    connect_timeout_ms: int = 100
    conns_per_rail: int = 2
    extra_config: dict[str, Any] = field(default_factory=dict)  # merged into the initiator config
    shaper: str = "tbf"
    sample_ms: int = 10
    timeline: str | None = None
    log_level: int = logging.WARNING


def check_available() -> None:
    """Raise RuntimeError("--fabric needs root and ip netns: <reason>") when fabrics cannot be built."""
    ok, why = Fabric.available()
    if not ok:
        raise RuntimeError(f"--fabric needs root and ip netns: {why}")


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def initiator_config(fab: Fabric, spec: FabricBenchSpec, policy: str) -> dict[str, Any]:
    rails = fab.addrs(0, peer=1)
    cfg: dict[str, Any] = {
        "transports": {
            "tcp": {
                "rails": rails,
                "nominal_gbps": [r / 1e9 for r in fab.rates],
                "slice_timeout_ms": spec.slice_timeout_ms,
                "connect_timeout_ms": spec.connect_timeout_ms,
                "conns_per_rail": spec.conns_per_rail,
                # one executor thread per connection slot: a slow rail must not starve the others
                "threads": max(4, spec.conns_per_rail * len(rails)),
            }
        },
        "scheduler": {"policy": policy},
    }
    return _merge(cfg, spec.extra_config)


def target_config(fab: Fabric, spec: FabricBenchSpec) -> dict[str, Any]:
    return {
        "transports": {
            "tcp": {
                "rails": fab.addrs(1),
                "nominal_gbps": [r / 1e9 for r in fab.rates],
                "slice_timeout_ms": max(spec.slice_timeout_ms, 1000),
            }
        }
    }


def qos_switch() -> str | None:
    """The name of the engine config's boolean QoS switch (`qos.<name>`), None if there is none yet."""
    for f in dataclasses.fields(QosConfig):
        if f.name in ("enabled", "enable") and isinstance(f.default, bool):
            return f.name
    return None


# ------------------------------------------------------------------ processes


class Worker:
    """A fabric_worker process in a namespace: JSON lines in a queue, stderr tail kept."""

    def __init__(self, fab: Fabric, node: int, spec: dict[str, Any]) -> None:
        argv = [sys.executable, "-m", "tent_bench.fabric_worker", "--spec", json.dumps(spec)]
        self.proc = fab.popen(node, argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: collections.deque[str] = collections.deque(maxlen=40)
        threading.Thread(target=self._pump_out, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                try:
                    self.lines.put(json.loads(line))
                except json.JSONDecodeError:
                    log.warning("worker printed bad JSON: %.200s", line)
        self.lines.put({"event": "eof"})

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line.rstrip())
            if log.isEnabledFor(logging.DEBUG):
                log.debug("worker: %s", line.rstrip())
            log.debug("worker: %s", line.rstrip())

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"fabric worker: no {event!r} within {timeout:.0f}s; stderr:\n" + "\n".join(self.stderr))
            try:
                msg = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if msg.get("event") == event:
                return msg
            if msg.get("event") == "eof":
                try:
                    rc = self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    rc = None
                raise RuntimeError(f"fabric worker exited (rc={rc}) before {event!r}; stderr:\n" + "\n".join(self.stderr))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@contextmanager
def _worker(fab: Fabric, spec: dict[str, Any]) -> Iterator[Worker]:
    w = Worker(fab, 0, spec)
    try:
        yield w
    finally:
        w.stop()


class FaultInjector(threading.Thread):
    """Applies a FaultPlan to the fabric at t0 + event.t; records when each event really happened."""

    def __init__(self, fab: Fabric, plan: FaultPlan, t0: float) -> None:
        super().__init__(name="fabric-faults", daemon=True)
        self.fab, self.plan, self.t0 = fab, plan, t0
        self.applied: list[dict[str, Any]] = []
        self.failed: list[str] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        for ev in self.plan.events:
            if self._stop_evt.wait(max(0.0, self.t0 + ev.t - time.monotonic())):
                return
            t_req = time.monotonic()
            try:
                if ev.action == "down":
                    self.fab.down(ev.rail)
                elif ev.action == "up":
                    self.fab.up(ev.rail)
                elif ev.action == "degrade":
                    self.fab.degrade(ev.rail, ev.factor)
                elif ev.action == "restore":
                    self.fab.restore(ev.rail)
            except Exception as exc:
                self.failed.append(f"{ev.action} {ev.rail}: {exc}")
                log.error("fault %s %d failed: %s", ev.action, ev.rail, exc)
                continue
            # the change takes effect when the ip/tc command returns
            self.applied.append({"t": time.monotonic(), "t_req": t_req, "action": ev.action, "rail": ev.rail,
                                 "factor": ev.factor})  # fmt: skip

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=15)


def _reset_rails(fab: Fabric, degrade: list[tuple[int, float]]) -> None:
    """Every rail up at its nominal rate, then the static --degrade list applied."""
    for i in range(fab.rails):
        fab.up(i)
        fab.restore(i)
    for i, f in degrade:
        fab.degrade(i, f)


# ------------------------------------------------------------------ analysis


@dataclass
class Timeline:
    t: np.ndarray  # bin starts, seconds since the run started
    wire: np.ndarray  # (bins, rails) bits/s at the rail interfaces (rx + tx frames)
    goodput: np.ndarray  # (bins, rails) bits/s of completed slices (engine telemetry)
    state_t: np.ndarray  # sample times (s since start)
    state: list[str]  # per sample, one letter per rail: H / D / P


def build_timeline(samples: list[dict[str, Any]], t0: float, t1: float, nrails: int, bin_s: float = BIN_S) -> Timeline:
    """Cumulative counters sampled every ~10 ms -> per-rail rates in exact `bin_s` bins (interpolated)."""
    good = [s for s in samples if len(s["bytes"]) == nrails and len(s["wire"]) == nrails]
    if len(good) < 2:
        z = np.zeros((0, nrails))
        return Timeline(np.zeros(0), z, z, np.zeros(0), [])
    ts = np.array([s["t"] for s in good])
    b = np.array([s["bytes"] for s in good], dtype=np.float64)
    w = np.array([s["wire"] for s in good], dtype=np.float64)
    lo, hi = max(t0, ts[0]), min(t1, ts[-1])
    nb = max(0, int((hi - lo) / bin_s))
    edges = lo + bin_s * np.arange(nb + 1)

    def rates(cum: np.ndarray) -> np.ndarray:
        if nb == 0:
            return np.zeros((0, nrails))
        c = np.stack([np.interp(edges, ts, cum[:, r]) for r in range(nrails)], axis=1)
        return np.diff(c, axis=0) * 8 / bin_s

    return Timeline(edges[:-1] - t0, rates(w), rates(b), ts - t0, ["".join(s["state"]) for s in good])


def _mean(x: np.ndarray) -> float:
    return float(np.mean(x)) if len(x) else 0.0


def _smooth(x: np.ndarray, bins: int) -> np.ndarray:
    if bins <= 1 or len(x) == 0:
        return x
    k = np.ones(bins) / bins
    return np.convolve(x, k, mode="full")[: len(x)]  # trailing moving average (causal)


def analyze_faults(tl: Timeline, applied: list[dict[str, Any]], t_start: float, flap: tuple[int, float, float, float] | None) -> dict[str, Any]:
    """The numbers of a fault run, from the 10 ms timeline (wire rates at node 0's rail interfaces).

    * `steady_gbit`: mean aggregate rate from WARMUP_S after the start to the first fault;
    * `dip_ms` (per down/degrade fault): total time, within DIP_WINDOW_S after the fault, during which
      the 10 ms-binned aggregate rate is below DIP_FRACTION x the pre-fault steady state;
      `dip_ms_noise` is the same count over the pre-fault window (the metric's own noise floor,
      scaled to DIP_WINDOW_S);
    * `detect_ms`: fault -> first telemetry sample where the engine shows the rail PAUSED;
    * `readmit_ms` (per up): rail back -> its SMOOTH_S moving-average rate first reaches
      READMIT_FRACTION of its own pre-fault rate; `readmit_state_ms`: -> engine no longer shows it PAUSED;
    * degrade: `degraded_gbit` (mean aggregate from 0.5 s after the degrade to the restore),
      `full_rate_ms` (restore -> the rail's SMOOTH_S moving average reaches FULL_RATE_FRACTION of its
      pre-fault rate);
    * flap: mean aggregate over the flapping period vs the stable rails' pre-fault sum.
    """
    out: dict[str, Any] = {"bin_ms": BIN_S * 1e3, "dip_threshold": DIP_FRACTION}
    if len(tl.t) == 0:
        return out
    agg = tl.wire.sum(axis=1)
    sm = int(round(SMOOTH_S / BIN_S))
    first = min((a["t"] - t_start for a in applied), default=float(tl.t[-1]))
    pre = (tl.t >= WARMUP_S) & (tl.t + BIN_S <= first)
    steady = _mean(agg[pre])
    per_rail = [float(np.mean(tl.wire[pre, r])) if pre.any() else 0.0 for r in range(tl.wire.shape[1])]
    out["steady_gbit"] = round(steady / 1e9, 4)
    out["steady_rail_gbit"] = [round(x / 1e9, 4) for x in per_rail]
    out["steady_goodput_gbit"] = round(_mean(tl.goodput[pre].sum(axis=1)) / 1e9, 4) if pre.any() else 0.0
    if pre.any() and steady > 0:
        noise_bins = int(np.sum(agg[pre] < DIP_FRACTION * steady))
        out["dip_ms_noise"] = round(noise_bins * BIN_S * 1e3 * DIP_WINDOW_S / (pre.sum() * BIN_S), 1)
    events: list[dict[str, Any]] = []
    for a in applied:
        tf = a["t"] - t_start
        rail = a["rail"]
        ev: dict[str, Any] = {"action": a["action"], "rail": rail, "at_s": round(tf, 3)}
        if a["action"] == "degrade":
            ev["factor"] = a["factor"]
        if a["action"] in ("down", "degrade") and steady > 0:
            win = (tl.t >= tf) & (tl.t < tf + DIP_WINDOW_S)
            ev["dip_ms"] = round(float(np.sum(agg[win] < DIP_FRACTION * steady)) * BIN_S * 1e3, 1)
            ev["min_10ms_pct"] = round(float(agg[win].min() / steady * 100), 1) if win.any() else None
        if a["action"] == "down":
            idx = np.flatnonzero((tl.state_t >= tf) & np.array([s[rail] == "P" for s in tl.state], dtype=bool))
            ev["detect_ms"] = round((tl.state_t[idx[0]] - tf) * 1e3, 1) if len(idx) else None
        if a["action"] in ("up", "restore") and per_rail[rail] > 0:
            rs = _smooth(tl.wire[:, rail], sm)
            frac = READMIT_FRACTION if a["action"] == "up" else FULL_RATE_FRACTION
            idx = np.flatnonzero((tl.t >= tf) & (rs >= frac * per_rail[rail]))
            key = "readmit_ms" if a["action"] == "up" else "full_rate_ms"
            ev[key] = round((tl.t[idx[0]] + BIN_S - tf) * 1e3, 1) if len(idx) else None
            if a["action"] == "up":
                sidx = np.flatnonzero((tl.state_t >= tf) & np.array([s[rail] != "P" for s in tl.state], dtype=bool))
                ev["readmit_state_ms"] = round((tl.state_t[sidx[0]] - tf) * 1e3, 1) if len(sidx) else None
        events.append(ev)
    # degrade -> restore: the new steady state
    for i, a in enumerate(applied):
        if a["action"] != "degrade":
            continue
        td = a["t"] - t_start
        tr = next((b["t"] - t_start for b in applied[i + 1 :] if b["action"] == "restore" and b["rail"] == a["rail"]),
                  float(tl.t[-1]))  # fmt: skip
        win = (tl.t >= td + 0.5) & (tl.t + BIN_S <= tr)
        events[i]["degraded_gbit"] = round(_mean(agg[win]) / 1e9, 4)
        events[i]["degraded_rail_gbit"] = [round(_mean(tl.wire[win, r]) / 1e9, 4) for r in range(tl.wire.shape[1])]
        after = (tl.t >= tr + 0.5)
        if after.any():
            events[i]["after_restore_gbit"] = round(_mean(agg[after]) / 1e9, 4)
    if applied:
        last = applied[-1]["t"] - t_start
        after_last = tl.t >= last
        out["after_last_event_rail_gbit"] = [round(_mean(tl.wire[after_last, r]) / 1e9, 4) for r in range(tl.wire.shape[1])]
    out["events"] = events if not flap else [e for e in events if e["action"] == "down"][:1]
    downs = [e for e in events if "dip_ms" in e]
    ups = [e for e in events if e.get("readmit_ms") is not None]
    if downs:
        out["dip_ms"] = downs[0]["dip_ms"]
        out["detect_ms"] = downs[0].get("detect_ms")
    if ups:
        out["readmit_ms"] = ups[0]["readmit_ms"]
        out["readmit_state_ms"] = ups[0].get("readmit_state_ms")
    if flap:
        rail, period, f0, f1 = flap
        win = (tl.t >= f0) & (tl.t + BIN_S <= f1)
        stable = sum(x for r, x in enumerate(per_rail) if r != rail)
        out["flap"] = {
            "rail": rail,
            "period_ms": round(period * 1e3, 1),
            "from_s": f0,
            "until_s": f1,
            "flap_gbit": round(_mean(agg[win]) / 1e9, 4),
            "flap_goodput_gbit": round(_mean(tl.goodput[win].sum(axis=1)) / 1e9, 4),
            "stable_rails_gbit": round(stable / 1e9, 4),
            "flapping_rail_gbit": round(_mean(tl.wire[win, rail]) / 1e9, 4),
            "pauses": sum(1 for i in range(1, len(tl.state)) if tl.state[i][rail] == "P" != tl.state[i - 1][rail]),
        }
        out["flap"]["x_stable"] = round(out["flap"]["flap_gbit"] / max(out["flap"]["stable_rails_gbit"], 1e-9), 3)
    return out


# ------------------------------------------------------------------ plotting


_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def plot_timelines(path: str, panels: list[dict[str, Any]], title: str) -> None:
    """One panel per run: per-rail wire throughput (10 ms bins, 30 ms moving average) and the sum,
    fault events as vertical lines, PAUSED periods shaded per rail."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    fig, axes = plt.subplots(n, 1, figsize=(10, 2.9 * n + 0.6), sharex=True, squeeze=False)
    for ax, p in zip(axes[:, 0], panels, strict=True):
        tl: Timeline = p["timeline"]
        if len(tl.t) == 0:
            ax.set_title(p["label"] + " (no samples)")
            continue
        x = tl.t + BIN_S
        for r in range(tl.wire.shape[1]):
            c = _COLORS[r % len(_COLORS)]
            ax.plot(x, _smooth(tl.wire[:, r], 3) / 1e9, lw=1.1, color=c, label=f"rail {r}")
            paused = np.array([s[r] == "P" for s in tl.state], dtype=bool)
            if paused.any():
                ax.fill_between(tl.state_t, 0, 0.06 + 0.05 * r, where=paused, step="post", color=c, alpha=0.35, lw=0)
        ax.plot(x, _smooth(tl.wire.sum(axis=1), 3) / 1e9, lw=1.6, color="black", label="sum")
        for a in p.get("events", []):
            ax.axvline(a["t"], color="grey", ls="--", lw=0.8)
            if not p.get("quiet_events"):
                ax.text(a["t"], ax.get_ylim()[1] * 0.98 if ax.get_ylim()[1] > 0 else 1, f" {a['label']}",
                        fontsize=7, va="top", rotation=90, color="dimgrey")  # fmt: skip
        for a, b, lab in p.get("spans", []):
            ax.axvspan(a, b, color="0.92", lw=0)
            ax.text((a + b) / 2, 0.02, lab, fontsize=7, ha="center", va="bottom", transform=ax.get_xaxis_transform())
        ax.set_ylabel("Gbit/s")
        ax.set_ylim(bottom=0)
        ax.set_title(p["label"], fontsize=9, loc="left")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(loc="upper right", fontsize=7, ncol=6)
    axes[-1, 0].set_xlabel("time (s); wire rate at node 0's rail interfaces, 10 ms bins, 30 ms moving average;"
                           " shaded strips: rail PAUSED by the engine")  # fmt: skip
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log.info("timeline written to %s", path)


# ------------------------------------------------------------------ runs


def _base_spec(fab: Fabric, spec: FabricBenchSpec, remote: str, policy: str, seed: int) -> dict[str, Any]:
    return {
        "remote": remote,
        "seed": seed,  # the target's pattern (tent_core.testing.pattern)
        "host": fab.addrs(0, peer=1)[0],
        "config": initiator_config(fab, spec, policy),
        "ifaces": [fab.link(i).if0 for i in range(fab.rails)],
        "sample_ms": spec.sample_ms,
        "log_level": spec.log_level,
    }


def _dump(label: str, res: dict[str, Any]) -> None:
    """TENT_FABRIC_DUMP=DIR keeps every worker's raw result (samples included) as DIR/<label>.json."""
    d = os.environ.get("TENT_FABRIC_DUMP")
    if not d:
        return
    path = os.path.join(d, re.sub(r"[^A-Za-z0-9_.=-]+", "_", label) + ".json")
    os.makedirs(d, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(res, fh)
    log.info("raw worker result in %s", path)


def _rail_info(fab: Fabric) -> dict[str, Any]:
    nominal = [r / 1e9 for r in fab.rates]
    actual = [fab.rate(i) / 1e9 for i in range(fab.rails)]
    return {"rails": fab.rails, "rail_gbit_nominal": nominal, "rail_gbit_actual": actual,
            "nominal_sum_gbit": round(sum(nominal), 4), "actual_sum_gbit": round(sum(actual), 4)}  # fmt: skip


def run_fabric_bench(spec: FabricBenchSpec, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Build the fabric, run the experiment under every policy, tear everything down; return rows."""
    check_available()
    say = progress or (lambda _msg: None)
    rates = parse_fabric_spec(spec.fabric)
    duration = spec.duration_s if spec.duration_s is not None else (5.0 if spec.fault else None)
    plan = parse_fault(spec.fault, duration) if spec.fault and duration else FaultPlan()
    mode = "mixed" if spec.mixed else ("verify" if duration else "sweep")
    for i, _f in spec.degrade:
        if not 0 <= i < len(rates):
            raise ValueError(f"--degrade rail {i} not in 0..{len(rates) - 1}")
    for ev in plan.events:
        if not 0 <= ev.rail < len(rates):
            raise ValueError(f"fault rail {ev.rail} not in 0..{len(rates) - 1}")
    if mode == "sweep":
        tsize = max(spec.block_sizes) * max(spec.batch_sizes) * spec.threads
    else:
        tsize = spec.verify_block + OFFSET_STEP * OFFSET_SLOTS
    rows: list[dict[str, Any]] = []
    panels: list[dict[str, Any]] = []
    with ExitStack() as stack:
        fab = Fabric(nodes=2, rails=len(rates), rate=rates, shaper=spec.shaper)
        stack.callback(fab.close)
        say(f"building fabric {spec.fabric} ({fab.prefix})")
        fab.up_all()
        _reset_rails(fab, spec.degrade)
        target = stack.enter_context(
            target_process(tsize, fab.addrs(1)[0], target_config(fab, spec), True, fab.exec_argv(1, []))
        )
        remote, seed = target["segment"], target["seed"]
        fabric_row = {"kind": "fabric", "spec": spec.fabric, "prefix": fab.prefix, "shaper": spec.shaper,
                      "degrade": spec.degrade, "mode": mode, **_rail_info(fab)}  # fmt: skip
        rows.append(fabric_row)
        sweep_rows: list[dict[str, Any]] = []
        mixed_rows: list[dict[str, Any]] = []
        # (policy, label, config overlay, sweep overlay): sweeps repeat per round / per arrival seed,
        # the policies' order rotating, so each ratio compares runs taken side by side
        variants: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [(p, p, {}, {}) for p in spec.policies]
        if mode == "sweep" and spec.offered_loads:
            variants = [(p, f"{p} {load} Gbit/s seed {k}", {}, {"round": k, "offered_gbit": load, "arrival_seed": 1000 + k,
                                                                 "requests": spec.open_requests})
                        for load in spec.offered_loads for k in range(spec.seeds)
                        for p in round_order(spec.policies, k)]  # fmt: skip
        elif mode == "sweep":
            variants = [(p, f"{p} round {r}", {}, {"round": r}) for r in range(spec.rounds)
                        for p in round_order(spec.policies, r)]  # fmt: skip
        if mode == "mixed":
            sw = qos_switch()
            fabric_row["qos_switch"] = f"qos.{sw}" if sw else None
            base: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []
            for p in spec.policies:
                if sw:
                    base += [(p, f"{p} qos=off", {"qos": {sw: False}}, {}), (p, f"{p} qos=on", {"qos": {sw: True}}, {})]
                    if any(f.name == "active_window_us" for f in dataclasses.fields(QosConfig)):
                        # the C++ rotation: slots enforced whether or not a higher priority is active
                        base.append((p, f"{p} qos=on, always", {"qos": {sw: True, "active_window_us": 0}}, {}))
                else:
                    base.append((p, f"{p} (no qos switch in the engine config)", {}, {}))
            # every variant once per round, the order rotating, so QoS on and off run side by side
            by_label = {v[1]: v for v in base}
            variants = [(*by_label[lab][:3], {"round": r}) for r in range(spec.rounds)
                        for lab in round_order(list(by_label), r)]  # fmt: skip
        for policy, label, extra, sweep_extra in variants:
            _reset_rails(fab, spec.degrade)
            ws = _base_spec(fab, spec, remote, policy, seed)
            ws["config"] = _merge(ws["config"], extra)
            info = _rail_info(fab)
            say(f"{mode} {label}")
            if mode == "sweep":
                ws["mode"] = "sweep"
                ws["sweep"] = {"block_sizes": spec.block_sizes, "batch_sizes": spec.batch_sizes, "ops": spec.ops,
                               "threads": spec.threads, "iters": spec.iters, "warmup": spec.warmup,
                               "budget_s": spec.budget_s, **sweep_extra}  # fmt: skip
                npoints = len(spec.block_sizes) * len(spec.batch_sizes) * len(spec.ops)
                limit = 120 + npoints * (spec.budget_s * 4 + 30)
                with _worker(fab, ws) as w:
                    ready = w.expect("ready", 90)
                    res = w.expect("result", limit)
                _dump(f"sweep-{label}", res)
                t0 = ready["t"]
                t1 = max((r["t1"] for r in res["rows"]), default=t0)
                tl = build_timeline(res["samples"], t0, t1, fab.rails)
                for r in res["rows"]:
                    total = max(sum(r["rail_bytes"]), 1)
                    r.update(policy=policy, **info)
                    r["rail_share"] = [round(b / total, 4) for b in r["rail_bytes"]]
                    r["x_nominal"] = round(r["gbit"] / info["nominal_sum_gbit"], 4)
                    r["x_actual"] = round(r["gbit"] / info["actual_sum_gbit"], 4)
                    r["t0"], r["t1"] = round(r["t0"] - t0, 3), round(r["t1"] - t0, 3)
                    r["round"] = sweep_extra.get("round", 0)
                    sweep_rows.append(r)
                spans = [(r["t0"], r["t1"], _human(r["block_size"])) for r in res["rows"]]
                if sweep_extra.get("round", 0) == 0:  # one timeline panel per policy
                    panels.append({"label": f"{policy}: {spec.fabric} {_degrade_text(spec.degrade)}", "timeline": tl,
                                   "spans": spans})  # fmt: skip
            elif mode == "verify":
                assert duration is not None
                ws["mode"] = "verify"
                ws["target_size"] = tsize
                ws["verify"] = {"threads": spec.threads, "block": spec.verify_block, "duration_s": duration}
                with _worker(fab, ws) as w:
                    ready = w.expect("ready", 90)
                    inj = FaultInjector(fab, plan, ready["t"])
                    inj.start()
                    try:
                        res = w.expect("result", duration + 120)
                    finally:
                        inj.stop()
                _dump(f"verify-{label}", {**res, "applied": inj.applied})
                t_start = res["t_start"]
                tl = build_timeline(res["samples"], t_start, res["t_end"], fab.rails)
                summary = analyze_faults(tl, inj.applied, t_start, plan.flap)
                secs = max(res["t_end"] - t_start, 1e-9)
                rails_total = [0] * fab.rails
                good = [s for s in res["samples"] if len(s["bytes"]) == fab.rails]
                if len(good) >= 2:
                    rails_total = [b - a for a, b in zip(good[0]["bytes"], good[-1]["bytes"], strict=True)]
                tot = max(sum(rails_total), 1)
                rows.append({
                    "engine": "tent", "transport": "tcp", "op": "READ", "block_size": spec.verify_block,
                    "batch_size": 1, "threads": spec.threads, "policy": policy, **info,
                    "gbit": round(res["bytes_verified"] * 8 / secs / 1e9, 4),
                    "p50_us": res["p50_us"], "p99_us": res["p99_us"], "max_us": res["max_us"],
                    "rail_bytes": rails_total, "rail_share": [round(b / tot, 4) for b in rails_total],
                })  # fmt: skip
                rows.append({
                    "kind": "fault_summary", "policy": policy, "fault": spec.fault or "", "duration_s": duration,
                    "app_errors": res["app_errors"], "corrupt": res["corrupt"], "hung_threads": res["hung_threads"],
                    "bytes_requested": res["bytes_requested"], "bytes_verified": res["bytes_verified"],
                    "all_verified": res["app_errors"] == 0 and res["corrupt"] == 0
                    and res["bytes_verified"] == res["bytes_requested"],
                    "transfers": res["transfers"], "verified_gbit": round(res["bytes_verified"] * 8 / secs / 1e9, 4),
                    "fault_errors": inj.failed, "errors": res["errors"], **summary,
                })  # fmt: skip
                evs = [{"t": a["t"] - t_start, "label": _event_label(a)} for a in inj.applied]
                panels.append({"label": f"{policy}: {spec.fabric} {_degrade_text(spec.degrade)} | {spec.fault or 'no fault'}",
                               "timeline": tl, "events": evs, "quiet_events": plan.flap is not None})  # fmt: skip
            else:
                ws["mode"] = "mixed"
                ws["mixed"] = {"block": spec.verify_block, "elephants": spec.threads, "mouse_bytes": spec.mouse_bytes,
                               "mouse_interval_ms": spec.mouse_interval_ms, "duration_s": spec.mixed_duration_s,
                               "lone_s": spec.lone_s}  # fmt: skip
                with _worker(fab, ws) as w:
                    ready = w.expect("ready", 90)
                    res = w.expect("result", spec.mixed_duration_s + 120)
                _dump(f"mixed-{label}", res)
                tl = build_timeline(res["samples"], ready["t"], ready["t"] + spec.mixed_duration_s + 1.0, fab.rails)
                mixed_rows.append({
                    "kind": "mixed_round", "policy": policy, "label": label, "qos": extra.get("qos"), **info,
                    "round": sweep_extra["round"], "mouse_bytes": spec.mouse_bytes, "elephant_bytes": spec.verify_block,
                    "elephants": spec.threads, "mixed_duration_s": spec.mixed_duration_s, "lone_s": spec.lone_s,
                    **{k: res[k] for k in ("mice_idle_p50_us", "mice_idle_p99_us", "mice_p50_us", "mice_p99_us",
                                           "mice_count", "elephant_gbit", "elephant_errors", "lone_low_gbit",
                                           "lone_mid_gbit") if k in res},
                })  # fmt: skip
                if sweep_extra["round"] == 0:  # one timeline panel per variant
                    panels.append({"label": f"mixed, {label}: {spec.fabric} {_degrade_text(spec.degrade)}", "timeline": tl})
        rows += mixed_rows + summarize_mixed(mixed_rows)
        rows += summarize_policies(sweep_rows)
        _add_policy_ratios(rows)
        if spec.timeline:
            say(f"plotting {spec.timeline}")
            title = f"tent bench --fabric {spec.fabric}" + (f" --degrade {_degrade_arg(spec.degrade)}" if spec.degrade else "")
            if spec.fault:
                title += f' --fault "{spec.fault}"'
            plot_timelines(spec.timeline, panels, title)
    return rows


MIXED_METRICS = ("mice_count", "mice_p50_us", "mice_p99_us", "mice_idle_p50_us", "mice_idle_p99_us", "elephant_gbit",
                 "lone_low_gbit", "lone_mid_gbit")  # fmt: skip
# per-round ratios of every QoS variant to "qos=off" of the same policy and round
MIXED_RATIOS = ("mice_p50_us", "mice_p99_us", "elephant_gbit", "lone_low_gbit", "lone_mid_gbit")


def summarize_mixed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One `kind="mixed"` row per variant (label), in first-run order: every figure the median over
    the rounds with `<figure>_min`, `<figure>_max` and `<figure>_rounds`; for every variant but
    "qos=off", `<figure>_vs_off` is the median (with min-max) of its per-round ratio to qos=off of
    the same policy in the same round (runs taken side by side, not minutes apart)."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_label.setdefault(r["label"], []).append(r)
    off = {(r["policy"], r["round"]): r for r in rows if r["label"].endswith("qos=off")}
    out = []
    for label, members in by_label.items():
        agg = {k: v for k, v in members[0].items() if k not in MIXED_METRICS and k not in ("round", "elephant_errors")}
        agg.update(kind="mixed", rounds=len(members), elephant_errors=[e for m in members for e in m.get("elephant_errors", [])][:5])
        for m in MIXED_METRICS:
            vals = [float(r[m]) for r in members if r.get(m) is not None]
            if not vals:
                continue
            med, lo, hi = spread(vals)
            agg[m], agg[f"{m}_min"], agg[f"{m}_max"] = round(med, 4), round(lo, 4), round(hi, 4)
            agg[f"{m}_rounds"] = [r.get(m) for r in members]
        if not label.endswith("qos=off"):
            for m in MIXED_RATIOS:
                ratios = [float(r[m]) / float(b[m]) for r in members
                          if (b := off.get((r["policy"], r["round"]))) is not None and r.get(m) is not None and b.get(m)]  # fmt: skip
                if ratios:
                    med, lo, hi = spread(ratios)
                    agg[f"{m}_vs_off"], agg[f"{m}_vs_off_min"], agg[f"{m}_vs_off_max"] = round(med, 4), round(lo, 4), round(hi, 4)
        out.append(agg)
    return out


def _med(r: dict[str, Any], key: str, scale: float = 1.0) -> str:
    """`median (min-max)` of a summarized figure; just the median when every round agreed or one ran."""
    v = r.get(key)
    if v is None:
        return "-"
    lo, hi = r.get(f"{key}_min"), r.get(f"{key}_max")
    f = lambda x: f"{x * scale:.3g}"  # noqa: E731
    return f(v) if lo is None or hi is None or lo == hi else f"{f(v)} ({f(lo)}-{f(hi)})"


def qos_markdown(rows: list[dict[str, Any]]) -> str:
    """The QoS table of docs/benchmarks.md from the `kind="mixed"` summary rows: medians over the
    rounds with their min-max, and each QoS variant's per-round ratio to qos=off."""
    summ = [r for r in rows if r.get("kind") == "mixed"]
    if not summ:
        return ""
    rounds = max(r.get("rounds", 1) for r in summ)
    lines = [f"Median (min-max) of {rounds} rounds, the variants interleaved in every round (order rotating); "
             "`x off`: the per-round ratio to qos=off, median (min-max).", "",
             "| QoS | mice completed | mice P50 ms | mice P99 ms | mice P99 x off | idle mice P50 ms | elephants Gbit/s "
             "| elephants x off | lone LOW flow Gbit/s | lone MID flow Gbit/s |",
             "|" + "---|" * 10]  # fmt: skip
    for r in summ:
        lines.append(f"| {r['label']} | {_med(r, 'mice_count')} | {_med(r, 'mice_p50_us', 1e-3)} | {_med(r, 'mice_p99_us', 1e-3)} "
                     f"| {_med(r, 'mice_p99_us_vs_off')} | {_med(r, 'mice_idle_p50_us', 1e-3)} | {_med(r, 'elephant_gbit')} "
                     f"| {_med(r, 'elephant_gbit_vs_off')} | {_med(r, 'lone_low_gbit')} | {_med(r, 'lone_mid_gbit')} |")  # fmt: skip
    return "\n".join(lines) + "\n"


SWEEP_METRICS = ("gbit", "gbps", "p50_us", "p99_us", "realized_gbit", "x_nominal", "x_actual")


def summarize_policies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (policy, offered load, point): medians over the rounds (or arrival seeds) with min-max;
    every policy's ratios to round robin's computed within each round, then their median."""
    if not rows:
        return []
    as_engine = [{**r, "engine": r["policy"]} for r in rows]
    group = ("engine", "offered_gbit", "op", "block_size", "batch_size")
    out = summarize(as_engine, ours="", group=group, metrics=SWEEP_METRICS)  # ratios: below, per policy
    ratio_src = as_engine
    for agg in out:
        agg["engine"] = "tent"
        if agg["policy"] == "round_robin":
            continue
        mine = [r for r in ratio_src if r["engine"] == agg["policy"]]
        base = [r for r in ratio_src if r["engine"] == "round_robin"]
        for metric, prefix in (("gbit", "x_"), ("p99_us", "p99_vs_")):
            ratios = per_round_ratios(mine + base, agg["policy"], "round_robin", metric, ("offered_gbit", *POINT))
            vals = ratios.get((agg.get("transport"), agg.get("offered_gbit"), agg["op"], agg["block_size"], agg["batch_size"]))
            if vals:
                med, lo, hi = spread(vals)
                agg[f"{prefix}round_robin"] = round(med, 3)
                agg[f"{prefix}round_robin_min"], agg[f"{prefix}round_robin_max"] = round(lo, 3), round(hi, 3)
    return out


def _add_policy_ratios(rows: list[dict[str, Any]]) -> None:
    """Spray rows get their throughput and P99 relative to round robin's at the same point (rows
    of summarized sweeps already carry the per-round ratios)."""
    rr = {(r["op"], r["block_size"], r["batch_size"]): r for r in rows
          if r.get("engine") == "tent" and r.get("policy") == "round_robin"}  # fmt: skip
    for r in rows:
        if r.get("engine") != "tent" or r.get("policy") == "round_robin":
            continue
        b = rr.get((r["op"], r["block_size"], r["batch_size"]))
        if b is None or "x_round_robin" in r:
            continue
        if b["gbit"] > 0:
            r["x_round_robin"] = round(r["gbit"] / b["gbit"], 3)
        if b.get("p99_us"):
            r["p99_vs_round_robin"] = round(r["p99_us"] / b["p99_us"], 3)


def _human(n: int) -> str:
    for unit, m in (("G", 1 << 30), ("M", MiB), ("K", KiB)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return str(n)


def _degrade_arg(d: list[tuple[int, float]]) -> str:
    return ",".join(f"{i}:{f:g}" for i, f in d)


def _degrade_text(d: list[tuple[int, float]]) -> str:
    return ("(" + ", ".join(f"rail {i} at {f:g}x" for i, f in d) + ")") if d else ""


def _event_label(a: dict[str, Any]) -> str:
    if a["action"] == "degrade":
        return f"degrade {a['rail']} to {a['factor']:g}x"
    return f"{a['action']} {a['rail']}"


def describe_rates(rates: list[int]) -> str:
    return "+".join(format_rate(r) for r in rates)


__all__ = [
    "FabricBenchSpec",
    "FaultEvent",
    "FaultPlan",
    "analyze_faults",
    "build_timeline",
    "check_available",
    "parse_degrade",
    "parse_fault",
    "plot_timelines",
    "qos_markdown",
    "run_fabric_bench",
    "summarize_mixed",
]
