"""The initiator side of `tent bench --fabric`: runs inside a fabric namespace, prints JSON lines.

Started by `tent_bench.fabric_bench` as ``python -m tent_bench.fabric_worker --spec JSON``
inside node 0 of a `Fabric`. It builds an Engine restricted to the TCP transport (both namespaces
share one kernel, so the same-host shm transport would bypass the fabric), connects to the target
engine in node 1 and runs one of four modes:

* ``sweep``: TEBench-style points (block size x batch size, `threads` concurrent submitters so the
  pipe stays full), each row with the bytes every rail carried during the point;
* ``verify``: `threads` submitters each READ `block` bytes at a rotating offset of the target's
  pattern-filled buffer (a pattern that never repeats) and check every byte, for `duration_s`,
  each request with `deadline_s`. Any exception from wait() is an application error (the thread
  backs off `error_backoff_s`, then goes on). Every request's submit and end times and outcome are
  reported, for latency around a fault and fail-fast times. The fault schedule is applied by the
  parent while this runs;
* ``mixed``: elephants (`elephants` threads of LOW-priority `block` READs) saturate the rails while
  one thread issues HIGH-priority `mouse_bytes` READs every `mouse_interval_ms`; reports the mice's
  latency percentiles, unloaded and loaded, and the throughput of one lone LOW and MID flow;
* ``first``: the very first transfer of a fresh engine (the parent may still be bringing links up).

All modes sample `engine.rail_stats()` and the node's per-rail interface counters (wire bytes, from
/sys/class/net/<if>/statistics) every `sample_ms` into a timeline.

Output (stdout, one JSON object per line): ``{"event": "ready", "t": <monotonic s>}`` once the engine
is connected and warmed up (the parent's fault clock starts there), then ``{"event": "result", ...}``.
Times are CLOCK_MONOTONIC seconds, which every namespace shares with the parent.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from tent_core.engine import Engine, LocalBuffer, Request
from tent_core.types import OpCode, Priority

from .runner import pattern, percentile, run_point

log = logging.getLogger(__name__)

KiB, MiB = 1024, 1024 * 1024
OFFSET_STEP = 64 * KiB  # verified READs rotate their remote offset so stale bytes cannot pass
OFFSET_SLOTS = 16
MAX_OUTCOMES = 50_000


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _wire_bytes(ifaces: list[str]) -> list[int]:
    """rx + tx bytes per interface (0 when unreadable, e.g. outside the namespace)."""
    out = []
    for name in ifaces:
        total = 0
        for what in ("rx_bytes", "tx_bytes"):
            try:
                total += int(Path(f"/sys/class/net/{name}/statistics/{what}").read_text())
            except (OSError, ValueError):
                pass
        out.append(total)
    return out


class Sampler:
    """Every `period_s`: monotonic time, per-rail engine bytes, health states, wire bytes."""

    def __init__(self, eng: Engine, ifaces: list[str], period_s: float = 0.01) -> None:
        self.eng = eng
        self.ifaces = ifaces
        self.period_s = period_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fabric-sampler", daemon=True)

    def snapshot(self) -> dict[str, Any]:
        stats = sorted((r for r in self.eng.rail_stats() if r["transport"] == "tcp"), key=lambda r: r["index"])
        t = time.monotonic()  # stamped next to the wire read: the timeline is drawn from the wire counters
        return {
            "t": t,
            "bytes": [r["bytes"] for r in stats],
            "errors": [r["errors"] for r in stats],
            "state": [r["state"][0] for r in stats],  # H / D / P
            "bw": [round(r["bandwidth_GBps"] * 8, 4) for r in stats],  # the engine's estimate, Gbit/s
            "wire": _wire_bytes(self.ifaces),
        }

    def _run(self) -> None:
        nxt = time.monotonic()
        while not self._stop.is_set():
            try:
                self.samples.append(self.snapshot())
            except Exception:  # the engine may be closing; never kill the run for a sample
                log.debug("sample failed", exc_info=True)
            nxt += self.period_s
            delay = nxt - time.monotonic()
            if delay < 0:
                nxt = time.monotonic()
                delay = 0.0
            self._stop.wait(delay)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.samples


def _rail_bytes(eng: Engine) -> list[int]:
    stats = sorted((r for r in eng.rail_stats() if r["transport"] == "tcp"), key=lambda r: r["index"])
    return [r["bytes"] for r in stats]


def _rail_view(eng: Engine) -> dict[str, list[Any]]:
    """The engine's own view of each rail: bandwidth estimate and health state."""
    stats = sorted((r for r in eng.rail_stats() if r["transport"] == "tcp"), key=lambda r: r["index"])
    return {"rail_est_gbit": [round(r["bandwidth_GBps"] * 8, 3) for r in stats], "rail_state": [r["state"] for r in stats]}


def _connect(eng: Engine, local: LocalBuffer, remote: str, n: int, seed: int) -> None:
    """First READ: connects every rail, and checks the bytes once."""
    expect = pattern(n, seed)
    local.array[:n] = 0  # type: ignore[index]
    eng.submit([Request(OpCode.READ, local, 0, remote, 0, n)], deadline=30.0).wait()
    if not np.array_equal(local.array[:n], expect):  # type: ignore[index]
        raise RuntimeError("fabric worker: first READ returned wrong bytes")


# ------------------------------------------------------------------ sweep


def run_sweep(eng: Engine, spec: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
    sw = spec["sweep"]
    blocks: list[int] = sw["block_sizes"]
    batches: list[int] = sw["batch_sizes"]
    threads: int = sw["threads"]
    size = max(blocks) * max(batches) * threads
    local = eng.allocate(size, segment="fabric-local")
    _connect(eng, local, spec["remote"], min(size, 8 * MiB), spec["seed"])
    emit({"event": "ready", "t": time.monotonic()})
    rows: list[dict[str, Any]] = []
    for op_name in sw.get("ops", ["READ"]):
        for batch in batches:
            for block in blocks:
                before = _rail_bytes(eng)
                t0 = time.monotonic()
                extra: dict[str, Any] = {}
                if sw.get("offered_gbit"):
                    gbps, lat, window, extra = _open_point(eng, local, spec["remote"], OpCode[op_name], block, threads,
                                                           float(sw["offered_gbit"]), sw["budget_s"],
                                                           int(sw.get("arrival_seed", 1234)), sw.get("requests"))  # fmt: skip
                else:
                    gbps, lat, window = _point(eng, local, spec["remote"], OpCode[op_name], block, batch, threads,
                                               sw["iters"], sw["warmup"], sw["budget_s"])  # fmt: skip
                t1 = time.monotonic()
                after = _rail_bytes(eng)
                steady = _steady_gbit(sampler.samples, *window)
                rows.append(
                    {
                        "engine": "tent",
                        "transport": "tcp",
                        "op": op_name,
                        "block_size": block,
                        "batch_size": batch,
                        "threads": threads,
                        "gbps": round(gbps, 4),
                        # steady state: bytes the rails delivered while every submitter was busy
                        "gbit": round(steady if steady is not None else gbps * 8, 4),
                        "gbit_wall": round(gbps * 8, 4),  # the local runner's accounting (timed requests / wall)
                        "steady_window_s": round(window[1] - window[0], 3),
                        "avg_us": round(float(np.mean(lat)) * 1e6, 2),
                        "p50_us": round(percentile(lat, 50) * 1e6, 2),
                        "p99_us": round(percentile(lat, 99) * 1e6, 2),
                        "iters": len(lat),
                        "rail_bytes": [a - b for a, b in zip(after, before, strict=False)],
                        **_rail_view(eng),
                        "t0": t0,
                        "t1": t1,
                        **extra,
                    }
                )
                log.info("point %s %d x%d: %.3f Gbit/s", op_name, block, batch, gbps * 8)
    return {"rows": rows}


def _open_point(eng: Engine, local: LocalBuffer, remote: str, op: OpCode, block: int, slots: int,
                offered_gbit: float, duration_s: float, arrival_seed: int = 1234, requests: int | None = None,
                ) -> tuple[float, list[float], tuple[float, float], dict[str, Any]]:  # fmt: skip
    """Open loop: Poisson arrivals of `block`-byte requests at a mean of `offered_gbit`, whatever
    the engine's state. Latency runs from the *scheduled* submit time, so a path that cannot keep
    up shows its queue (a closed loop hides it: fewer requests are offered when they are slow).
    One arrival process per `arrival_seed`; a short one realizes a load that can be far from the
    mean, so the load it realized (requests x bytes / arrival span) is returned with the rest.
    With `requests`, exactly that many timed requests (plus the warm-up ones) are offered."""
    interval = block * 8 / (offered_gbit * 1e9)
    duration_s = max(duration_s, OPEN_LOOP_MIN_REQUESTS * interval)
    rng = random.Random(arrival_seed)  # Poisson arrivals (deterministic ones at < capacity never queue)
    pending: deque[tuple[float, Any]] = deque()
    cv = threading.Condition()
    lat: list[float] = []
    done = {"submitting": True}
    errors: list[BaseException] = []

    def waiter() -> None:
        while True:
            with cv:
                while not pending and done["submitting"]:
                    cv.wait(0.1)
                if not pending:
                    return
                t_sched, h = pending.popleft()
            try:
                h.wait()
            except BaseException as exc:  # reported below
                errors.append(exc)
                return
            if warm["left"] > 0:
                warm["left"] -= 1  # the first requests meet cold estimates and fresh connections
                warm["t"] = time.monotonic()
                continue
            lat.append(time.monotonic() - t_sched)

    wt = threading.Thread(target=waiter, daemon=True)
    wt.start()
    t0 = time.monotonic()
    warm = {"t": t0, "left": OPEN_LOOP_WARMUP}
    t_next, end, k = t0, t0 + duration_s, 0
    arrivals: list[float] = []
    seen: list[dict[str, list[Any]]] = []
    total = None if requests is None else requests + OPEN_LOOP_WARMUP
    while (t_next < end if total is None else k < total) and not errors:
        now = time.monotonic()
        if now < t_next:
            time.sleep(t_next - now)
        off = (k % slots) * block
        seen.append(_rail_view(eng))  # what the plan of this request saw
        h = eng.submit([Request(op, local, off, remote, off, block)], deadline=120)
        arrivals.append(t_next)
        with cv:
            pending.append((t_next, h))
            cv.notify()
        k += 1
        t_next += rng.expovariate(1.0 / interval)
    with cv:
        done["submitting"] = False
        cv.notify()
    wt.join(timeout=180)
    if errors:
        raise errors[0]
    t1 = time.monotonic()
    timed = arrivals[OPEN_LOOP_WARMUP:]
    # realized load of the timed arrivals: n requests over n inter-arrival gaps
    span = (timed[-1] - arrivals[OPEN_LOOP_WARMUP - 1]) if len(timed) >= 1 and OPEN_LOOP_WARMUP >= 1 else 0.0
    realized = len(timed) * block * 8 / span / 1e9 if span > 0 else 0.0
    extra = {"offered_gbit": offered_gbit, "realized_gbit": round(realized, 4), "arrival_seed": arrival_seed,
             "requests": len(timed),
             # per timed request, in arrival order (the waiter takes them in submit order): which
             # requests make the tail, against an ideal queue fed the same arrivals
             "latencies_ms": [round(x * 1e3, 2) for x in lat],
             "arrivals_s": [round(t - arrivals[0], 4) for t in arrivals],
             "est_gbit_at_submit": [v["rail_est_gbit"] for v in seen],
             "state_at_submit": [v["rail_state"] for v in seen]}  # fmt: skip
    return len(lat) * block / max(t1 - warm["t"], 1e-9) / 1e9, lat, (warm["t"], t_next), extra


def _point(eng: Engine, local: LocalBuffer, remote: str, op: OpCode, block: int, batch: int, threads: int,
           iters: int, warmup: int, budget_s: float) -> tuple[float, list[float], tuple[float, float]]:
    """runner.run_point plus the window in which every submitter was in its timed loop.

    With few large requests in flight, "timed requests / wall" undercounts: other threads' warm-up
    requests and the drain share the wire. The window [last thread started, first thread ended]
    has every submitter busy, and the rail counters say what was delivered in it."""
    lock = threading.Lock()
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}

    def tick() -> None:
        tid = threading.get_ident()
        now = time.monotonic()
        with lock:
            starts.setdefault(tid, now)
            ends[tid] = now

    class _Eng:
        def submit(self, reqs: Any, deadline: float | None = None) -> Any:
            h = eng.submit(reqs, deadline)
            return _H(h)

    class _H:
        def __init__(self, h: Any) -> None:
            self.h = h

        def wait(self, timeout: float | None = None) -> bool:
            r = self.h.wait(timeout)
            tick()
            return r

    gbps, lat = run_point(_Eng(), local, remote, op, block, batch, threads, iters, warmup, budget_s)  # type: ignore[arg-type]
    # starts[tid]: the thread's first completion = the end of its warm-up (the fabric sweep uses warmup=1)
    if not starts:
        return gbps, lat, (0.0, 0.0)
    return gbps, lat, (max(starts.values()), min(ends.values()))


def _steady_gbit(samples: list[dict[str, Any]], a: float, b: float) -> float | None:
    """Gbit/s the rails completed between monotonic times a and b (None if too short to say)."""
    if b - a < 0.2:
        return None
    good = [s for s in list(samples) if s["bytes"]]
    ts = np.array([s["t"] for s in good])
    if len(ts) < 2 or ts[0] > a or ts[-1] < b:
        return None
    tot = np.array([sum(s["bytes"]) for s in good], dtype=np.float64)
    return float((np.interp(b, ts, tot) - np.interp(a, ts, tot)) * 8 / (b - a) / 1e9)


# ------------------------------------------------------------------ verify


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.app_errors = 0
        self.corrupt = 0
        self.bytes_verified = 0
        self.bytes_requested = 0
        self.error_samples: list[dict[str, Any]] = []
        self.done: list[tuple[float, float, int]] = []  # (completion time, latency s, bytes)
        # every request: (submitted, finished, outcome: "ok", "corrupt" or the error's class name)
        self.outcomes: list[tuple[float, float, str]] = []
        self.error_kinds: dict[str, str] = {}  # error class name -> its first message

    def outcome(self, t0: float, t1: float, what: str) -> None:
        if len(self.outcomes) < MAX_OUTCOMES:
            self.outcomes.append((t0, t1, what))


def run_verify(eng: Engine, spec: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
    vf = spec["verify"]
    threads: int = vf["threads"]
    block: int = vf["block"]
    tsize: int = spec["target_size"]
    deadline_s: float = vf.get("deadline_s", 30.0)
    error_backoff_s: float = vf.get("error_backoff_s", 0.02)
    if block + OFFSET_STEP * (OFFSET_SLOTS - 1) > tsize:
        raise ValueError("target buffer too small for the rotating offsets")
    local = eng.allocate(block * threads, segment="fabric-local")
    _connect(eng, local, spec["remote"], min(block, 8 * MiB), spec["seed"])
    expect = pattern(tsize, spec["seed"])
    counters = _Counters()
    stop = threading.Event()
    # warm-up so the telemetry has seen every rail before the clock starts
    eng.submit([Request(OpCode.READ, local, 0, spec["remote"], 0, block)], deadline=30.0).wait()
    t_start = time.monotonic()
    emit({"event": "ready", "t": t_start})
    end = t_start + vf["duration_s"]

    def worker(tid: int) -> None:
        base = tid * block
        view = local.array[base : base + block]  # type: ignore[index]
        view64 = view.view(np.uint64)
        i = tid
        while not stop.is_set() and time.monotonic() < end:
            off = (i % OFFSET_SLOTS) * OFFSET_STEP
            i += threads
            t0 = time.monotonic()
            with counters.lock:
                counters.bytes_requested += block
            try:
                eng.submit([Request(OpCode.READ, local, base, spec["remote"], off, block)], deadline=deadline_s).wait()
            except Exception as exc:  # every failure the application would see
                t1 = time.monotonic()
                kind = type(exc).__name__
                with counters.lock:
                    counters.app_errors += 1
                    counters.outcome(t0, t1, kind)
                    counters.error_kinds.setdefault(kind, str(exc))
                    if len(counters.error_samples) < 20:
                        counters.error_samples.append({"t": t1, "error": f"{kind}: {exc}"})
                stop.wait(error_backoff_s)  # an application backs off a little before trying again
                continue
            t1 = time.monotonic()
            ok = bool(np.array_equal(view64, expect[off : off + block].view(np.uint64)))
            with counters.lock:
                counters.outcome(t0, t1, "ok" if ok else "corrupt")
                if ok:
                    counters.bytes_verified += block
                    counters.done.append((t1, t1 - t0, block))
                else:
                    counters.corrupt += 1
                    bad = int(np.flatnonzero(view != expect[off : off + block])[0])
                    if len(counters.error_samples) < 20:
                        counters.error_samples.append({"t": t1, "error": f"corrupt: first bad byte at {bad} (offset {off})"})

    ts = [threading.Thread(target=worker, args=(i,), name=f"verify-{i}", daemon=True) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=max(1.0, end - time.monotonic()) + deadline_s + 10)
    stop.set()
    hung = sum(t.is_alive() for t in ts)
    lat = [d[1] for d in counters.done]
    return {
        "t_start": t_start,
        "t_end": time.monotonic(),
        "app_errors": counters.app_errors + hung,
        "corrupt": counters.corrupt,
        "hung_threads": hung,
        "bytes_requested": counters.bytes_requested,
        "bytes_verified": counters.bytes_verified,
        "transfers": len(counters.done),
        "p50_us": round(percentile(lat, 50) * 1e6, 1),
        "p99_us": round(percentile(lat, 99) * 1e6, 1),
        "max_us": round(max(lat, default=0.0) * 1e6, 1),
        "errors": counters.error_samples,
        "error_kinds": counters.error_kinds,
        "completions": [[round(t, 6), round(lt, 6)] for t, lt, _ in counters.done],
        "outcomes": [[round(a, 6), round(b, 6), k] for a, b, k in counters.outcomes],
        "block": block,
    }


# ------------------------------------------------------------------ first transfer of a fresh engine


def run_first(eng: Engine, spec: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
    """The very first transfer of a fresh engine (the parent may still be bringing links up): one
    READ of `block` bytes with the given deadline, every byte checked."""
    fs = spec["first"]
    block: int = fs["block"]
    local = eng.allocate(block, segment="fabric-local")
    emit({"event": "ready", "t": time.monotonic()})
    t0 = time.monotonic()
    error = None
    h = None
    try:
        h = eng.submit([Request(OpCode.READ, local, 0, spec["remote"], 0, block)], deadline=fs.get("deadline_s", 60.0))
        h.wait()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    t1 = time.monotonic()
    ok = error is None and bool(np.array_equal(local.array, pattern(block, spec["seed"])))  # type: ignore[arg-type]
    return {"t_start": t0, "t_end": t1, "latency_s": round(t1 - t0, 6), "error": error, "verified": ok,
            "retries": h.retries if h is not None else 0}  # fmt: skip


# ------------------------------------------------------------------ mixed (QoS mice / elephants)


def run_mixed(eng: Engine, spec: dict[str, Any], sampler: Sampler) -> dict[str, Any]:
    mx = spec["mixed"]
    block: int = mx["block"]
    nel: int = mx["elephants"]
    mouse: int = mx["mouse_bytes"]
    interval = mx["mouse_interval_ms"] / 1e3
    remote = spec["remote"]
    local = eng.allocate(block * nel + mouse, segment="fabric-local")
    _connect(eng, local, remote, min(block, 8 * MiB), spec["seed"])
    mbase = block * nel

    def mice(duration: float, out: list[float]) -> None:
        end = time.monotonic() + duration
        nxt = time.monotonic()
        while time.monotonic() < end:
            t0 = time.perf_counter()
            eng.submit([Request(OpCode.READ, local, mbase, remote, 0, mouse, Priority.HIGH)], deadline=30.0).wait()
            out.append(time.perf_counter() - t0)
            nxt += interval
            time.sleep(max(0.0, nxt - time.monotonic()))

    def lone(prio: Priority, seconds: float, quiet: float) -> float:
        """One elephant flow alone on the fabric (a checkpoint or weight sync): Gbit/s. It starts
        after a quiet spell, so no earlier request of a higher priority counts as active."""
        time.sleep(quiet)
        end, moved = time.monotonic() + seconds, 0
        t0 = time.monotonic()
        while time.monotonic() < end:
            eng.submit([Request(OpCode.READ, local, 0, remote, 0, block, prio)], deadline=30.0).wait()
            moved += block
        return moved * 8 / (time.monotonic() - t0) / 1e9

    # first, before any HIGH traffic: what QoS costs a flow that has the fabric to itself
    lone_s = mx.get("lone_s", 2.0)
    quiet = mx.get("quiet_s", 1.2)  # past the QoS active window (1 s) of the warm-up's MID requests
    lone_low = lone(Priority.LOW, lone_s, quiet) if lone_s > 0 else None
    # only LOW ran since: nothing of a higher priority than MID can count as active
    lone_mid = lone(Priority.MID, lone_s, mx.get("mid_quiet_s", 0.2)) if lone_s > 0 else None
    idle: list[float] = []
    mice(mx.get("idle_s", 0.5), idle)
    emit({"event": "ready", "t": time.monotonic()})
    stop = threading.Event()
    el_bytes = [0] * nel
    el_err: list[str] = []

    def elephant(k: int) -> None:
        while not stop.is_set():
            try:
                eng.submit([Request(OpCode.READ, local, k * block, remote, 0, block, Priority.LOW)], deadline=30.0).wait()
                el_bytes[k] += block
            except Exception as exc:
                el_err.append(f"{type(exc).__name__}: {exc}")
                return

    ths = [threading.Thread(target=elephant, args=(k,), daemon=True) for k in range(nel)]
    for t in ths:
        t.start()
    time.sleep(mx.get("ramp_s", 0.5))  # let the elephants fill every rail's queue first
    loaded: list[float] = []
    b0 = sum(el_bytes)
    t0 = time.monotonic()
    mice(mx["duration_s"], loaded)
    t1 = time.monotonic()
    b1 = sum(el_bytes)
    stop.set()
    for t in ths:
        t.join(timeout=40)

    def pct(v: list[float], q: float) -> float:
        return round(percentile(v, q) * 1e6, 1)

    return {
        "mice_idle_p50_us": pct(idle, 50),
        "mice_idle_p99_us": pct(idle, 99),
        "mice_p50_us": pct(loaded, 50),
        "mice_p99_us": pct(loaded, 99),
        "mice_count": len(loaded),
        "elephant_gbit": round((b1 - b0) * 8 / max(t1 - t0, 1e-9) / 1e9, 4),
        "lone_low_gbit": None if lone_low is None else round(lone_low, 4),
        "lone_mid_gbit": None if lone_mid is None else round(lone_mid, 4),
        "elephant_errors": el_err[:5],
    }




OPEN_LOOP_WARMUP = 3
OPEN_LOOP_MIN_REQUESTS = 60

MODES = {"sweep": run_sweep, "verify": run_verify, "mixed": run_mixed, "first": run_first}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.fabric_worker")
    ap.add_argument("--spec", required=True, help="JSON: mode, remote, host, config, ifaces, and the mode's section")
    args = ap.parse_args(argv)
    spec = json.loads(args.spec)
    logging.basicConfig(level=spec.get("log_level", logging.WARNING), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    mode = MODES[spec["mode"]]
    with Engine(spec["config"], host=spec["host"], transports=["tcp"]) as eng:
        sampler = Sampler(eng, spec.get("ifaces", []), spec.get("sample_ms", 10) / 1e3)
        sampler.start()
        try:
            result = mode(eng, spec, sampler)
        finally:
            samples = sampler.stop()
        rails = sorted((r for r in eng.rail_stats() if r["transport"] == "tcp"), key=lambda r: r["index"])
        result["rail_names"] = [r["rail"] for r in rails]
        result["samples"] = samples
        emit({"event": "result", **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
