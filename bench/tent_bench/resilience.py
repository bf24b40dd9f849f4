"""The resilience benchmark (issue 12): every fault scenario of docs/benchmarks.md in one run.

    python -m tent_bench.resilience [--rounds 3] [--json OUT] [--markdown OUT] [--scenarios a,b,...] [--quick]

needs root (network namespaces). One 4 x 1 Gbit/s fabric (`tent_bench.testbed.Fabric`, TBF-shaped
veth rails between two namespaces) and one target engine in node 1 serve every scenario but the
fresh-fabric one, which builds its own. Per scenario a new initiator process in node 0 (engine
defaults, multi-rail TCP) runs 4 threads of 16 MiB READs at rotating offsets, every byte compared
with a pattern that never repeats (`tent_core.testing.pattern`), each request with the scenario's
deadline, while the parent applies the fault to the fabric or to the target process.

Everything is measured from verified completions (each request's submit and end times and
outcome, reported by the worker), beside the wire bytes of node 0's rail interfaces:

* `steady_gbit`: verified goodput before the fault; `fault_gbit` / `fault_wire_gbit`: verified
  goodput and wire rate while the fault lasts;
* `around_max_ms` / `around_p99_ms`: latency of the requests in flight during the fault or issued
  up to 1 s after it ended, against `steady_p99_ms` before it;
* `first_ok_ms`: fault -> first verified completion; `max_gap_ms`: the longest stretch without any
  verified completion from 1 s before the fault to 3 s after it ended;
* `slice_errors`: failed slices counted by the engine's rails (`rail_stats()["errors"]`);
* per scenario: time to DEGRADED (`degraded_ms`), throughput against the three healthy rails, the
  typed error a dead, stopped or cut-off peer gives (`first_error`, `first_error_ms`), how fast
  later requests fail (`fail_fast_max_ms`) and how soon requests succeed after the peer returns or
  its links come back (`recovered_ms`).

Every scenario runs once per round (`--rounds`, default 3; the order rotating from round to
round) and the report gives each figure's median over the rounds with its min-max (`summarize`).

Every wait is bounded; the fabric and every process are torn down on any exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tent_core.testing import fresh_seed

from .fabric_bench import FaultInjector, Worker, parse_fault
from .fabric_worker import OFFSET_SLOTS, OFFSET_STEP
from .rounds import round_order, spread
from .testbed.fabric import Fabric

log = logging.getLogger(__name__)

MiB = 1 << 20
BLOCK = 16 * MiB
THREADS = 4
RAILS = 4
RATE = "1gbit"
CONTROL_PORT = 47000  # the target's control port: a restarted target keeps its engine id
WARMUP_S = 0.5
TCP_GOODPUT = 0.956  # TCP/IP payload share of a rail's shaped (layer 2) rate at MTU 1500
RAIL_LIMIT_GBIT = TCP_GOODPUT * 1.0  # what one healthy 1 Gbit/s rail can deliver


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    duration_s: float = 6.0
    deadline_s: float = 10.0
    fault: str = ""  # fabric faults (tent_bench.fabric_bench.parse_fault), times from the start
    peer: str = ""  # "kill" or "stop": done to the target process at peer_at
    peer_at: float = 0.0
    peer_back: float = 0.0  # the target is restarted (kill) or continued (stop) then
    fresh: bool = False  # the first transfer of a fresh fabric, rails 1-3 coming up 0.5 s after it starts
    errors_expected: bool = False  # typed application errors are the point of the scenario


def scenarios(quick: bool = False) -> list[Scenario]:
    """The scenarios of docs/benchmarks.md, in run order; `quick` shortens them for the tests.

    Every scenario runs once per round (three by default), so the full form keeps only what its
    figures need: 1.5 s of steady state before the fault and, after it ends, time for the
    recovery it measures (the restart of a killed target takes ~2.5-4 s here)."""
    q = 0.6 if quick else 1.0
    t = 1.5  # when the fault strikes
    cut, cut_deadline = (3, 1.5) if quick else (4, 2.0)  # links cut for longer than the requests' deadline
    tail = 4.0 if quick else 2.0  # after the fault, time for the recovery the row reports
    return [
        Scenario("no-fault", "no fault", duration_s=4.0),
        Scenario("all-down-1s", "all 4 rails down for 1 s (10 s deadline)", duration_s=t + 1 + (3 if quick else 2),
                 fault=";".join([f"down {i} at {t}s" for i in range(4)] + [f"up {i} at {t + 1}s" for i in range(4)])),
        Scenario("two-down", "rails 0 and 1 down for 2 s, then back", duration_s=t + 2 + (2.5 if quick else 1.5),
                 fault=f"down 0 at {t}s; down 1 at {t}s; up 0 at {t + 2}s; up 1 at {t + 2}s"),
        Scenario("rail-5pct", "rail 3 at 5% of its rate for 3 s", duration_s=t + 3 + 1.5,
                 fault=f"degrade 3:0.05 at {t}s; restore 3 at {t + 3}s"),
        Scenario("flap-50ms", f"rail 1 down/up every 50 ms for {3 * q:g} s", duration_s=t + 3 * q + (1.5 if quick else 1.0),
                 fault=f"flap 1 every 50ms from {t}s until {t + 3 * q}s"),
        Scenario("peer-kill", "target SIGKILLed, restarted 2 s later", duration_s=t + (8 if quick else 7), deadline_s=10.0,
                 peer="kill", peer_at=t, peer_back=t + 2, errors_expected=True),
        Scenario("peer-stop", f"target SIGSTOPped for {3 if quick else 4} s ({1.5 if quick else 2} s deadline), then SIGCONT",
                 duration_s=t + (5 if quick else 4 + tail), deadline_s=1.5 if quick else 2.0, peer="stop", peer_at=t,
                 peer_back=t + (3 if quick else 4), errors_expected=True),
        Scenario("link-cut", f"all 4 rails cut for {cut} s ({cut_deadline} s deadline), then back",
                 duration_s=t + cut + tail, deadline_s=cut_deadline, errors_expected=True,
                 fault=";".join([f"down {i} at {t}s" for i in range(4)] + [f"up {i} at {t + cut}s" for i in range(4)])),
        Scenario("fresh", "fresh fabric: first transfer while rails 1-3 still come up", fresh=True, deadline_s=60.0),
    ]


# ------------------------------------------------------------------ processes


class Target:
    """The target engine in node 1 (python -m tent_bench.target), on a fixed control port so a
    restarted one keeps its engine id; can be killed, stopped, continued and restarted."""

    def __init__(self, fab: Fabric, size: int) -> None:
        self.fab, self.size = fab, size
        self.seed = fresh_seed()  # its byte pattern's stream; a restarted target serves the same bytes
        self.proc: subprocess.Popen[str] | None = None
        self.segment = ""

    def start(self, timeout: float = 120.0) -> float:
        cfg = {"transports": {"tcp": {"rails": self.fab.addrs(1), "nominal_gbps": [r / 1e9 for r in self.fab.rates]}}}
        argv = [sys.executable, "-m", "tent_bench.target", "--size", str(self.size), "--host", self.fab.addrs(1)[0],
                "--port", str(CONTROL_PORT), "--config", json.dumps(cfg), "--pattern", "--seed", str(self.seed)]  # fmt: skip
        self.proc = self.fab.popen(1, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not out or not out[0]:
            self.kill()
            raise RuntimeError(f"target did not start within {timeout:.0f}s")
        self.segment = json.loads(out[0])["segment"]
        return time.monotonic()

    def kill(self) -> float:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        return time.monotonic()

    def stop(self) -> float:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        end = time.monotonic() + 10
        while time.monotonic() < end:  # delivery is asynchronous: wait until it really is stopped
            with open(f"/proc/{self.proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    break
            time.sleep(0.002)
        return time.monotonic()

    def cont(self) -> float:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        return time.monotonic()

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


def _initiator_config(fab: Fabric) -> dict[str, Any]:
    """What a user configures: the rails and their nominal rates; every other knob is a default."""
    return {"transports": {"tcp": {"rails": fab.addrs(0, peer=1), "nominal_gbps": [r / 1e9 for r in fab.rates]}}}


def _worker_spec(fab: Fabric, target: Target, mode: str, log_level: int) -> dict[str, Any]:
    return {
        "mode": mode,
        "remote": target.segment,
        "seed": target.seed,
        "host": fab.addrs(0, peer=1)[0],
        "config": _initiator_config(fab),
        "ifaces": [fab.link(i).if0 for i in range(fab.rails)],
        "sample_ms": 10,
        "log_level": log_level,
        "target_size": target.size,
    }


class PeerActions(threading.Thread):
    """Kills or stops the target at t0 + peer_at and restarts or continues it at t0 + peer_back."""

    def __init__(self, target: Target, sc: Scenario, t0: float) -> None:
        super().__init__(name="peer-actions", daemon=True)
        self.target, self.sc, self.t0 = target, sc, t0
        self.applied: list[dict[str, Any]] = []
        self.failed: list[str] = []
        self._stop_evt = threading.Event()

    def run(self) -> None:
        sc = self.sc
        down, up = (self.target.kill, self.target.start) if sc.peer == "kill" else (self.target.stop, self.target.cont)
        for at, fn, name in ((sc.peer_at, down, sc.peer), (sc.peer_back, up, "restart" if sc.peer == "kill" else "cont")):
            if self._stop_evt.wait(max(0.0, self.t0 + at - time.monotonic())):
                return
            try:
                t = fn()  # for a restart: when the new process serves
            except Exception as exc:
                self.failed.append(f"{name}: {exc}")
                return
            self.applied.append({"t": t, "action": name, "rail": -1})

    def stop(self) -> None:
        self._stop_evt.set()
        self.join(timeout=150)


# ------------------------------------------------------------------ analysis (pure)


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values), q)) if len(values) else None


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 1)


def analyze(res: dict[str, Any], applied: list[dict[str, Any]], sc: Scenario, nrails: int = RAILS) -> dict[str, Any]:
    """The scenario's numbers from the worker's result (`outcomes`, `samples`) and the fault events
    actually applied (monotonic times); times in the output are relative to the run's start."""
    t_start = res["t_start"]
    block = res["block"]
    outs = [(a - t_start, b - t_start, k) for a, b, k in res["outcomes"]]
    ok = sorted((o for o in outs if o[2] == "ok"), key=lambda o: o[1])
    errs = sorted((o for o in outs if o[2] not in ("ok", "corrupt")), key=lambda o: o[1])
    ev = sorted(((a["t"] - t_start, a["action"], a["rail"]) for a in applied), key=lambda e: e[0])
    samples = res["samples"]
    rows = [s for s in samples if len(s["errors"]) == nrails]
    out: dict[str, Any] = {
        "scenario": sc.key,
        "title": sc.title,
        "deadline_s": sc.deadline_s,
        "app_errors": res["app_errors"],
        "corrupt": res["corrupt"],
        "hung_threads": res["hung_threads"],
        "bytes_requested": res["bytes_requested"],
        "bytes_verified": res["bytes_verified"],
        "requests_ok": len(ok),
        "slice_errors": int(sum(rows[-1]["errors"]) - sum(rows[0]["errors"])) if len(rows) >= 2 else 0,
        "error_kinds": sorted(res.get("error_kinds", {})),
        "error_messages": dict(res.get("error_kinds", {})),  # kind -> the first message of that kind
        "events": [{"t": round(t, 3), "action": a, "rail": r} for t, a, r in ev],
        "errors_expected": sc.errors_expected,
    }
    # every byte the application got was checked; requests that failed moved no bytes it could use
    failed_bytes = block * len(errs)
    out["all_verified"] = (res["corrupt"] == 0 and res["hung_threads"] == 0
                           and res["bytes_verified"] + failed_bytes == res["bytes_requested"])  # fmt: skip
    t_f = ev[0][0] if ev else None
    t_e = ev[-1][0] if ev else None
    end = (res["t_end"] - t_start)
    pre_end = t_f if t_f is not None else end
    pre = [o for o in ok if o[0] >= WARMUP_S and o[1] < pre_end]
    if pre_end - WARMUP_S > 0.2:
        out["steady_gbit"] = round(len(pre) * block * 8 / (pre_end - WARMUP_S) / 1e9, 3)
    out["steady_p99_ms"] = _ms(_pct([o[1] - o[0] for o in pre], 99))
    out["steady_max_ms"] = _ms(max((o[1] - o[0] for o in pre), default=None))
    if t_f is None or t_e is None:
        return out
    win_end = max(t_e, t_f + 0.5)
    during = [o for o in ok if t_f <= o[1] < win_end]
    out["fault_gbit"] = round(len(during) * block * 8 / (win_end - t_f) / 1e9, 3)
    out["fault_wire_gbit"] = _wire_gbit(rows, t_start + t_f, t_start + win_end)
    around = [o[1] - o[0] for o in ok if o[1] > t_f and o[0] < t_e + 1.0]
    out["around_p99_ms"] = _ms(_pct(around, 99))
    out["around_max_ms"] = _ms(max(around, default=None))
    after = [o[1] for o in ok if o[1] > t_f]
    out["first_ok_ms"] = _ms(after[0] - t_f) if after else None
    marks = [t_f - 1.0] + [o[1] for o in ok if t_f - 1.0 < o[1] < t_e + 3.0] + [min(t_e + 3.0, end)]
    out["max_gap_ms"] = _ms(max(b - a for a, b in zip(marks, marks[1:], strict=False)))
    degrades = [e for e in ev if e[1] == "degrade"]
    if degrades:
        rail = degrades[0][2]
        restore = next((e[0] for e in ev if e[1] == "restore" and e[2] == rail), end)
        seen = [s["t"] - t_start for s in rows if s["t"] - t_start >= t_f and s["state"][rail] in ("D", "P")]
        out["degraded_ms"] = _ms(seen[0] - t_f) if seen else None
        back = [s["t"] - t_start for s in rows if s["t"] - t_start >= restore and s["state"][rail] == "H"]
        out["healthy_again_ms"] = _ms(back[0] - restore) if back else None
        settled = [o for o in ok if t_f + 1.0 <= o[1] < restore]
        if restore - t_f > 1.5:
            g = len(settled) * block * 8 / (restore - t_f - 1.0) / 1e9
            out["degraded_gbit"] = round(g, 3)
            # against what the three healthy rails alone can carry (their TCP goodput limit)
            out["x_three_rails"] = round(g / ((nrails - 1) * RAIL_LIMIT_GBIT), 3)
    if any(e[1] == "down" for e in ev) and sc.fault.startswith("flap"):
        out["x_three_rails"] = round(out["fault_gbit"] / ((nrails - 1) * RAIL_LIMIT_GBIT), 3)
    if sc.peer or sc.errors_expected:
        # the peer returns: restarted or continued, or (a fabric fault) its last link is back up
        back = next((e[0] for e in ev if e[1] in ("restart", "cont")), None) if sc.peer else t_e
        first = next((o for o in errs if o[1] >= t_f), None)
        if first is not None:
            out["first_error"] = first[2]
            out["first_error_ms"] = _ms(first[1] - t_f)
            out["first_error_wait_ms"] = _ms(first[1] - first[0])
            later = [o[1] - o[0] for o in errs if o[0] > first[1] and (back is None or o[1] < back)]
            out["fail_fast_count"] = len(later)
            out["fail_fast_max_ms"] = _ms(max(later, default=None))
            out["fail_fast_p50_ms"] = _ms(_pct(later, 50))
        out["late_error_ms"] = _ms(max((o[1] - max(o[0], t_f) for o in errs if o[1] >= t_f), default=None))
        if back is not None:
            out["back_at_s"] = round(back, 3)
            rec = [o[1] for o in ok if o[0] >= back]
            out["recovered_ms"] = _ms(rec[0] - back) if rec else None
            out["ok_after_back"] = len(rec)
    return out


def _wire_gbit(rows: list[dict[str, Any]], a: float, b: float) -> float | None:
    ts = np.array([s["t"] for s in rows])
    if len(ts) < 2 or ts[0] > a or ts[-1] < b or b <= a:
        return None
    tot = np.array([sum(s["wire"]) for s in rows], dtype=np.float64)
    return round(float((np.interp(b, ts, tot) - np.interp(a, ts, tot)) * 8 / (b - a) / 1e9), 3)


# ------------------------------------------------------------------ runs


def run_scenario(fab: Fabric, target: Target, sc: Scenario, log_level: int = logging.WARNING) -> dict[str, Any]:
    ws = _worker_spec(fab, target, "verify", log_level)
    ws["verify"] = {"threads": THREADS, "block": BLOCK, "duration_s": sc.duration_s, "deadline_s": sc.deadline_s}
    plan = parse_fault(sc.fault, sc.duration_s) if sc.fault else None
    w = Worker(fab, 0, ws)
    injector: FaultInjector | PeerActions | None = None
    try:
        ready = w.expect("ready", 120)
        if plan is not None:
            injector = FaultInjector(fab, plan, ready["t"])
        elif sc.peer:
            injector = PeerActions(target, sc, ready["t"])
        if injector is not None:
            injector.start()
        res = w.expect("result", sc.duration_s + sc.deadline_s + 150)
    finally:
        if injector is not None:
            injector.stop()
        w.stop()
    if injector is not None and injector.failed:
        raise RuntimeError(f"{sc.key}: fault injection failed: {injector.failed}")
    return analyze(res, injector.applied if injector is not None else [], sc)


def run_fresh(sc: Scenario, log_level: int = logging.WARNING) -> dict[str, Any]:
    """A new fabric whose rails 1-3 are still down when the first transfer starts (they come up 0.5 s
    later): that transfer must complete, every byte right, however many connects failed."""
    with ExitStack() as stack:
        fab = Fabric(nodes=2, rails=RAILS, rate=RATE)
        stack.callback(fab.close)
        fab.up_all()
        for i in range(1, RAILS):
            fab.down(i)
        target = Target(fab, BLOCK)
        stack.callback(target.close)
        target.start()
        ws = _worker_spec(fab, target, "first", log_level)
        ws["first"] = {"block": BLOCK, "deadline_s": sc.deadline_s}
        w = Worker(fab, 0, ws)
        stack.callback(w.stop)
        ready = w.expect("ready", 120)
        delay = max(0.0, ready["t"] + 0.5 - time.monotonic())
        time.sleep(delay)
        for i in range(1, RAILS):
            fab.up(i)
        res = w.expect("result", sc.deadline_s + 60)
    rows = [s for s in res["samples"] if len(s["errors"]) == RAILS]
    return {
        "scenario": sc.key,
        "title": sc.title,
        "deadline_s": sc.deadline_s,
        "app_errors": 0 if res["error"] is None else 1,
        "error": res["error"],
        "all_verified": bool(res["verified"]),
        "bytes_requested": BLOCK,
        "bytes_verified": BLOCK if res["verified"] else 0,
        "first_transfer_ms": _ms(res["latency_s"]),
        "retries": res["retries"],
        "slice_errors": int(sum(rows[-1]["errors"])) if rows else 0,
        "errors_expected": False,
    }


def run(selected: Sequence[Scenario], say: Callable[[str], None] = lambda _m: None,
        log_level: int = logging.WARNING, rounds: int = 1) -> list[dict[str, Any]]:  # fmt: skip
    """Run `selected` once per round (rows tagged with "round"), the scenarios' order rotating from
    round to round; one shared fabric and target for all but the fresh-fabric one, which builds
    its own every round."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    ok, why = Fabric.available()
    if not ok:
        raise RuntimeError(f"the resilience benchmark needs root and ip netns: {why}")
    rows: list[dict[str, Any]] = []
    shared = [s for s in selected if not s.fresh]
    with ExitStack() as stack:
        fab: Fabric | None = None
        target: Target | None = None
        if shared:
            fab = Fabric(nodes=2, rails=RAILS, rate=RATE)
            stack.callback(fab.close)
            say(f"building fabric {RAILS}x{RATE} ({fab.prefix})")
            fab.up_all()
            target = Target(fab, BLOCK + OFFSET_STEP * OFFSET_SLOTS)
            stack.callback(target.close)
            target.start()
        by_key = {s.key: s for s in shared}
        for r in range(rounds):
            for key in round_order(list(by_key), r):
                sc = by_key[key]
                assert fab is not None and target is not None
                say(f"round {r + 1}/{rounds} {sc.key}: {sc.title}")
                for i in range(fab.rails):  # every scenario starts from a clean fabric
                    fab.up(i)
                    fab.restore(i)
                if target.proc is None or target.proc.poll() is not None:
                    target.start()
                rows.append({**run_scenario(fab, target, sc, log_level), "round": r})
            for sc in selected:
                if sc.fresh:
                    say(f"round {r + 1}/{rounds} {sc.key}: {sc.title}")
                    rows.append({**run_fresh(sc, log_level), "round": r})
    return rows


# figures a row may carry, each summarized over the rounds as median and min-max
FIGURES = ("app_errors", "slice_errors", "bytes_verified", "requests_ok", "steady_gbit", "steady_p99_ms",
           "steady_max_ms", "fault_gbit", "fault_wire_gbit", "around_p99_ms", "around_max_ms", "first_ok_ms",
           "max_gap_ms", "degraded_ms", "healthy_again_ms", "degraded_gbit", "x_three_rails", "first_error_ms",
           "first_error_wait_ms", "fail_fast_count", "fail_fast_p50_ms", "fail_fast_max_ms", "late_error_ms",
           "recovered_ms", "ok_after_back", "first_transfer_ms", "retries")  # fmt: skip


def summarize(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per scenario (first-run order) from the per-round rows: every figure of FIGURES the
    median over the rounds that have it, with `<figure>_min`, `<figure>_max` and `<figure>_rounds`
    (per round, None where that round had none); `all_verified` only if every round's bytes were,
    `corrupt` / `hung_threads` / bytes summed over the rounds, error kinds of every round."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["scenario"], []).append(r)
    out = []
    for members in by.values():
        first = members[0]
        agg: dict[str, Any] = {k: first.get(k) for k in ("scenario", "title", "deadline_s", "errors_expected")}
        agg["rounds"] = len(members)
        for f in FIGURES:
            per = [m.get(f) for m in members]
            vals = [float(v) for v in per if v is not None]
            if not vals:
                continue
            med, lo, hi = spread(vals)
            agg[f], agg[f"{f}_min"], agg[f"{f}_max"] = round(med, 3), round(lo, 3), round(hi, 3)
            agg[f"{f}_rounds"] = per
        agg["all_verified"] = all(bool(m.get("all_verified")) for m in members)
        for f in ("corrupt", "hung_threads", "bytes_requested", "bytes_verified"):
            agg[f"{f}_total"] = sum(int(m.get(f) or 0) for m in members)
        kinds: list[str] = []
        for m in members:
            kinds += [k for k in m.get("error_kinds", []) if k not in kinds]
        agg["error_kinds"] = sorted(kinds)
        firsts = [m["first_error"] for m in members if m.get("first_error")]
        if firsts:
            agg["first_error"] = max(set(firsts), key=firsts.count)
            agg["first_errors"] = firsts
        errs = [m["error"] for m in members if m.get("error")]
        if errs:
            agg["error"] = errs[0]
        out.append(agg)
    return out


# ------------------------------------------------------------------ report


def _f(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        x = f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"
    return f"{x}{unit}"


def _m(r: dict[str, Any], key: str, unit: str = "") -> str:
    """A figure as `median (min-max)` over the rounds (just the value for one round, or when
    every round agreed)."""
    v = r.get(key)
    if v is None:
        return "-"
    lo, hi = r.get(f"{key}_min"), r.get(f"{key}_max")
    if isinstance(v, float) and v.is_integer() and key in ("app_errors", "slice_errors", "fail_fast_count", "retries"):
        v, lo, hi = int(v), None if lo is None else int(lo), None if hi is None else int(hi)
    per = r.get(f"{key}_rounds")
    # a figure some rounds did not have (e.g. no completion before the run ended) says in how many it was
    some = f" [{sum(x is not None for x in per)} of {len(per)} rounds]" if per and None in per else ""
    if lo is None or hi is None or lo == hi:
        return _f(v, unit) + some
    return f"{_f(v)} ({_f(lo)}-{_f(hi)}){unit}{some}"


def markdown(rows: list[dict[str, Any]]) -> str:
    """One table, one row per scenario (docs/benchmarks.md): for summarized rows (`summarize`)
    every figure is the median over the rounds with its min-max."""
    rounds = max((int(r.get("rounds", 1)) for r in rows), default=1)
    head = ("| scenario | app errors | bytes verified | slice errors | steady Gbit/s | during fault: verified / wire "
            "Gbit/s | latency around fault: P99 / max ms (steady P99) | first verified completion after fault | "
            "longest gap without a completion | notes |")  # fmt: skip
    lines = ([f"Median (min-max) of {rounds} rounds, every scenario once per round (order rotating).", ""]
             if rounds > 1 else []) + [head, "|" + "---|" * 10]  # fmt: skip
    for r in rows:
        notes = []
        if r.get("degraded_ms") is not None:
            notes.append(f"DEGRADED {_m(r, 'degraded_ms', ' ms')} after the fault, HEALTHY {_m(r, 'healthy_again_ms', ' ms')} "
                         "after the restore")  # fmt: skip
        if r.get("x_three_rails") is not None:
            notes.append(f"{_m(r, 'x_three_rails')}x what the 3 healthy rails can carry ({3 * RAIL_LIMIT_GBIT:.2f} Gbit/s)")
        if r.get("errors_expected") and r.get("error_kinds"):
            notes.append("errors: " + ", ".join(f"`{k}`" for k in r["error_kinds"]))
        if r.get("first_error"):
            notes.append(f"first error `{r['first_error']}` {_m(r, 'first_error_ms', ' ms')} after the fault "
                         f"(deadline {_f(r['deadline_s'])} s); the {_m(r, 'fail_fast_count')} requests after it fail in "
                         f"{_m(r, 'fail_fast_p50_ms', ' ms')} (median; max {_m(r, 'fail_fast_max_ms', ' ms')}); "
                         f"verified completions again {_m(r, 'recovered_ms', ' ms')} after the fault ended")  # fmt: skip
        if r.get("first_transfer_ms") is not None:
            notes.append(f"first transfer {_m(r, 'first_transfer_ms', ' ms')} ({_m(r, 'retries')} retried slices)"
                         + (f"; error: {r['error']}" if r.get("error") else ""))  # fmt: skip
        verified = "all" if r.get("all_verified") else "NO"
        total = r.get("bytes_verified_total", r.get("bytes_verified"))
        if total is not None:
            verified = f"{total / MiB:,.0f} MiB" + (f" in {r['rounds']} rounds" if r.get("rounds", 1) > 1 else "") + f", {verified}"
        app = _m(r, "app_errors") + (" (typed, expected)" if r.get("errors_expected") and r.get("app_errors_max", r["app_errors"]) else "")
        fault = (f"{_m(r, 'fault_gbit')} / {_m(r, 'fault_wire_gbit')}" if "fault_gbit" in r else "-")
        lat = (f"{_m(r, 'around_p99_ms')} / {_m(r, 'around_max_ms')} ({_m(r, 'steady_p99_ms')})"
               if "around_max_ms" in r else f"- ({_m(r, 'steady_p99_ms')})")  # fmt: skip
        lines.append(
            f"| {r['title']} | {app} | {verified} | {_m(r, 'slice_errors') if 'slice_errors' in r else 0} | "
            f"{_m(r, 'steady_gbit')} | {fault} | {lat} | {_m(r, 'first_ok_ms', ' ms')} | {_m(r, 'max_gap_ms', ' ms')} | "
            f"{'; '.join(notes) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.resilience", description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", default="", help="comma-separated keys (default: all): "
                    + ", ".join(s.key for s in scenarios()))  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="shorter scenarios (the tests use these)")
    ap.add_argument("--rounds", type=int, default=3, help="every scenario once per round (default 3)")
    ap.add_argument("--json", default=None, help="write the rows as JSON here")
    ap.add_argument("--markdown", default=None, help="write the table here ('-': stdout)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    every = scenarios(args.quick)
    keys = [k.strip() for k in args.scenarios.split(",") if k.strip()]
    unknown = set(keys) - {s.key for s in every}
    if unknown:
        ap.error(f"unknown scenario(s) {sorted(unknown)}; known: {[s.key for s in every]}")
    selected = [s for s in every if not keys or s.key in keys]
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    per_round = run(selected, say=lambda m: print(f"== {m}", file=sys.stderr, flush=True),
                    log_level=logging.INFO if args.verbose else logging.WARNING, rounds=args.rounds)  # fmt: skip
    rows = summarize(per_round)
    meta = {"fabric": f"{RAILS}x{RATE}", "block": BLOCK, "threads": THREADS, "rounds": args.rounds,
            "scenarios": [asdict(s) for s in selected]}  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows, "per_round": per_round}, fh, indent=1)
    table = markdown(rows)
    if args.markdown == "-" or not (args.json or args.markdown):
        sys.stdout.write(table)
    elif args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
