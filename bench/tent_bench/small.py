"""Small requests, the KV-cache regime (issue 17): the engine next to the bare limit.

Every scenario runs the engine and what it is compared with *interleaved*: round after round,
one then the other (the order flips every round), so a noisy neighbour hurts both alike; each
figure is the median over the rounds with the lowest and highest round beside it. Byte checks
before timing use a pattern that never repeats (`small_target.fill`, i.e. `tent_core.testing.pattern`),
with a fresh seed per target process (per round where a round starts its own target).

Two bare copies stand next to the engine for small shm requests, one at a time: the *physical
limit*, a C loop (`tent_bench._bare`) with no interpreter between two copies, and *issue 17's
baseline*, the same copy called from a Python loop timed exactly like the engine's (what an
application would write without us: `PYTHON_FORMS`). The engine runs both ways an application
calls it: `submit(reqs).wait()` and `Engine.run(reqs)` (submit and wait in one call). The C limits:

* shm: one ``process_vm_readv``/``process_vm_writev`` per request, on one thread: what the engine
  does for a request of up to one chunk, which it copies on the submitting thread. For a batch, or
  a request longer than a chunk, the same pieces copied by two threads that poll for work (the
  engine has two workers plus the submitting thread, on this machine's two cores). In memfd mode
  the limit is ``memcpy`` between the same two mappings.
* tcp: a C client and server on one persistent connection, TCP_NODELAY, header and payload in
  one ``writev``, the answer read back before the next request (one request in flight, as the
  engine's one-at-a-time loop), moving bytes between the same two buffers the engine uses. Both
  ends poll before they sleep exactly as the engine's tcp transport is configured to
  (``busy_poll_us``, ``busy_poll_adaptive``: the same policy code); when the engine may poll,
  the same loop sleeping always is measured beside it (``bare_sleep_*``).

Scenarios (``SCENARIOS``): one_at_a_time, batches, large, two_engines, many_buffers, qos_tail,
submit_cost, multi_rail_mice (64 KiB mice over two tcp rails; ``--base`` runs another tent-core
tree, e.g. main's, interleaved with this one in child processes). ``run(names, ...)`` returns rows; ``markdown(rows)`` renders them as the tables of
docs/benchmarks.md. ``python -m tent_bench.small --help`` (or scripts/bench-small.sh).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tent_core import Engine, NoPathError, OpCode, PeerUnreachableError, Priority, Request
from tent_core.testing import fresh_seed

from . import _bare
from .small_target import PAGE, fill

log = logging.getLogger(__name__)

KiB, MiB = 1024, 1024 * 1024
QUICK_SIZES = [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB]
OPS = {"READ": OpCode.READ, "WRITE": OpCode.WRITE}


# ------------------------------------------------------------------ plumbing


@dataclass
class Target:
    info: dict[str, Any]
    proc: subprocess.Popen[str]

    @property
    def segment(self) -> str:
        return str(self.info["segment"])

    @property
    def seed(self) -> int:
        """The seed of the pattern the target's buffer holds (fresh per target)."""
        return int(self.info["seed"])

    def seg(self, name: str) -> str:
        return f"{self.info['engine']}/{name}"

    def call(self, **msg: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return json.loads(_readline(self.proc, 60.0))


def _readline(proc: subprocess.Popen[str], timeout: float) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive() or not out or not out[0]:
        proc.kill()
        raise RuntimeError(f"small-bench target did not answer (rc={proc.poll()})")
    return out[0]


@contextmanager
def target(size: int, config: dict[str, Any] | None = None, few: int = 0, many: int = 0) -> Iterator[Target]:
    """`python -m tent_bench.small_target` in its own process; always stopped."""
    argv = [sys.executable, "-m", "tent_bench.small_target", "--size", str(size), "--few", str(few), "--many", str(many),
            "--seed", str(fresh_seed())]
    if config:
        argv += ["--config", json.dumps(config)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        yield Target(json.loads(_readline(proc, 120.0)), proc)
    finally:
        try:
            if proc.stdin:
                proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                proc.stdin.close()
            proc.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait(timeout=5)


def with_shm_mode(config: dict[str, Any] | None, mode: str) -> dict[str, Any]:
    """`config` with the shm transport's mode set (both sides take the same config)."""
    cfg = dict(config or {})
    transports = dict(cfg.get("transports") or {})
    transports["shm"] = {**(transports.get("shm") or {}), "mode": mode}
    cfg["transports"] = transports
    return cfg


def interleave(rounds: int, fns: dict[str, Callable[[], dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """Run every function once per round, the order flipping each round."""
    names = list(fns)
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names if r % 2 == 0 else names[::-1]:
            out[n].append(fns[n]())
    return out


def spread(values: list[float]) -> dict[str, float]:
    v = sorted(values)
    return {"med": float(np.median(v)), "lo": float(v[0]), "hi": float(v[-1])}


def pct(lat: list[float] | np.ndarray, q: float) -> float:
    return float(np.percentile(np.asarray(lat), q)) * 1e6 if len(lat) else 0.0


def _timed(fn: Callable[[], Any], nbytes: int, count: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    lat = fn()
    wall = time.perf_counter() - t0
    return {"gbps": nbytes * count / wall / 1e9, "lat": list(lat)}


def engine_loop(eng: Engine, reqs: list[Request], count: int) -> list[float]:
    """`count` submit+wait of `reqs`, one batch in flight: each batch's seconds."""
    lat = []
    submit = eng.submit
    clock = time.perf_counter
    for _ in range(count):
        t0 = clock()
        submit(reqs).wait()
        lat.append(clock() - t0)
    return lat


def run_loop(eng: Engine, reqs: list[Request], count: int) -> list[float]:
    """`count` `Engine.run(reqs)` (submit and wait in one call), timed like `engine_loop`."""
    lat = []
    run = eng.run
    clock = time.perf_counter
    for _ in range(count):
        t0 = clock()
        run(reqs)
        lat.append(clock() - t0)
    return lat


def _py_memcpy_loop(dst: memoryview, src: memoryview, count: int) -> list[float]:
    """memfd mode from Python: one memoryview slice assignment (a single memcpy) per request."""
    lat = []
    clock = time.perf_counter
    for _ in range(count):
        t0 = clock()
        dst[:] = src
        lat.append(clock() - t0)
    return lat


def _py_cma_loop(fn: Any, pid: int, liov: Any, riov: Any, block: int, count: int) -> list[float]:
    """cma mode from Python: one ctypes `process_vm_readv`/`writev` per request, iovecs built once,
    the result checked as an application must."""
    lat = []
    clock = time.perf_counter
    for _ in range(count):
        t0 = clock()
        if fn(pid, liov, 1, riov, 1, 0) != block:
            raise OSError(ctypes.get_errno(), "process_vm_readv/writev from Python moved a short count")
        lat.append(clock() - t0)
    return lat


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


# The issue-17 baseline, "bare process_vm_readv from Python": the fastest form an application
# would write without us, per shm mode (see `_python_one`); named in the table's notes.
PYTHON_FORMS = {
    "cma": "ctypes `process_vm_readv`/`process_vm_writev`, iovecs built once, return value checked",
    "memfd": "memoryview slice assignment between the two mappings (one `memcpy`)",
}


def _python_one(eng: Engine, t: Target, op: str, block: int, count: int, local_addr: int) -> tuple[str, Callable[[], list[float]]]:
    """The same copy as the bare C loop, called from a Python loop timed like the engine's."""
    mode, mapped = _shm_view(eng, t)
    if mode == "cma":
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv if op == "READ" else libc.process_vm_writev
        fn.restype = ctypes.c_ssize_t
        liov, riov = _Iovec(local_addr, block), _Iovec(int(t.info["addr"]), block)
        lp, rp, pid = ctypes.byref(liov), ctypes.byref(riov), int(t.info["pid"])
        return mode, lambda: _py_cma_loop(fn, pid, lp, rp, block, count)
    local = memoryview((ctypes.c_char * block).from_address(local_addr)).cast("B")
    theirs = memoryview((ctypes.c_char * block).from_address(mapped)).cast("B")
    dst, src = (local, theirs) if op == "READ" else (theirs, local)
    return mode, lambda: _py_memcpy_loop(dst, src, count)


def _summary(name: str, samples: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [x for s in samples for x in s["lat"]]
    g = spread([s["gbps"] for s in samples])
    return {f"{name}_gbps": g["med"], f"{name}_gbps_lo": g["lo"], f"{name}_gbps_hi": g["hi"],
            f"{name}_p50_us": pct(lat, 50), f"{name}_p99_us": pct(lat, 99), f"{name}_p999_us": pct(lat, 99.9)}  # fmt: skip


def _ratio(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str = "gbps", prefix: str = "") -> dict[str, float]:
    r = spread([x[key] / y[key] for x, y in zip(a, b, strict=True) if y[key] > 0])
    return {f"{prefix}ratio": r["med"], f"{prefix}ratio_lo": r["lo"], f"{prefix}ratio_hi": r["hi"]}


def _verify(eng: Engine, local: Any, remote: str, n: int, seed: int) -> None:
    """READ the target's pattern (`seed`); WRITE one of a fresh seed, READ it back; restore. Every check
    reads into a zeroed buffer, and no two checks expect the same stream: a copy that moved nothing,
    or moved stale or misplaced bytes, fails."""
    local.array[:n] = 0
    eng.read(local, remote, n)
    if not np.array_equal(local.array[:n], fill(n, seed)):
        raise RuntimeError("small bench: READ returned wrong bytes")
    other = fresh_seed()
    local.array[:n] = fill(n, other)
    eng.write(local, remote, n)
    local.array[:n] = 0
    eng.read(local, remote, n)
    if not np.array_equal(local.array[:n], fill(n, other)):
        raise RuntimeError("small bench: WRITE then READ returned wrong bytes")
    local.array[:n] = fill(n, seed)
    eng.write(local, remote, n)


def _shm_view(eng: Engine, t: Target) -> tuple[str, int]:
    """The shm link's mode to the target, and for memfd mode the address its buffer is mapped at here."""
    tr = eng.transports["shm"]
    peer = eng.peers.lookup(t.info["engine"])
    route = peer.routes.get("shm") if peer else None
    if route is None:
        raise RuntimeError("small bench: no shm route to the target")
    mode = tr.link_mode(route.link)
    return mode, (tr.mapped_address(route.link, int(t.info["addr"])) if mode == "memfd" else 0)


def _bare_one(eng: Engine, t: Target, transport: str, op: str, block: int, count: int, local_addr: int,
              threads: int = 1, piece: int = 0, batch: int = 1, sleep: bool = False) -> Callable[[], list[float]]:  # fmt: skip
    """The bare loop matching the engine's one-at-a-time (or batch) loop on `transport`; tcp with
    `sleep`: both ends always sleep in the kernel for their bytes (no busy poll)."""
    o = 0 if op == "READ" else 1
    if transport == "shm":
        mode, mapped = _shm_view(eng, t)
        pid, remote = int(t.info["pid"]), int(t.info["addr"])
        if mode == "cma":
            if batch > 1:
                return lambda: np.frombuffer(_bare.batch_cma(pid, o, local_addr, remote, block, batch, count, threads), np.float64)
            return lambda: np.frombuffer(_bare.cma(pid, o, local_addr, remote, block * batch, count, threads, piece), np.float64)
        dst, src = (local_addr, mapped) if o == 0 else (mapped, local_addr)
        return lambda: np.frombuffer(
            _bare.memcpy(dst, src, block * batch, count, threads, piece or (block if batch > 1 else 0)), np.float64
        )
    if transport == "tcp":
        # both ends on the engine's buffers (the same memory, the same copies), polling before they
        # sleep under the engine's rule (the same code: tent/busy_poll.h), or never, under the
        # congestion control the engine gives its loopback connections (tcp loopback_congestion)
        tcp = eng.transports["tcp"]
        spin_us, adaptive = int(getattr(tcp, "busy_poll_us", 0)), int(getattr(tcp, "busy_poll_adaptive", 0))
        if sleep:
            spin_us, adaptive = 0, 0
        port = int(t.info["bare_tcp_sleep_port" if sleep else "bare_tcp_port"])
        _bare.tcp_congestion(str(getattr(tcp, "loopback_congestion", "")))  # as the engine's loopback connections
        if batch > 1:  # shared out over as many connections as the engine shares an inline batch
            conns = min(TCP_INLINE_RUNS, int(getattr(tcp, "conns_per_rail", 4)) + 1)
            return lambda: np.frombuffer(
                _bare.tcp_batch("127.0.0.1", port, o, block, batch, count, conns, local_addr, spin_us, adaptive), np.float64
            )
        return lambda: np.frombuffer(_bare.tcp("127.0.0.1", port, o, block, count, local_addr, spin_us, adaptive), np.float64)
    raise ValueError(f"no bare limit for {transport}")


# The tcp executor sends an inline batch over at most this many connections (INLINE_RUNS in
# plugins/tcp/csrc/tcp_executor.c; its conns_per_rail bulk slots and the express one permitting):
# the bare batch loop gets the same parallelism.
TCP_INLINE_RUNS = 4


def _counts(block: int, budget_bytes: int, lo: int = 200, hi: int = 5000) -> int:
    return int(min(hi, max(lo, budget_bytes // block)))


def _steady(make: Callable[[int], Callable[[], Any]], nbytes: int, seconds: float,
            probe: int) -> tuple[Callable[[], dict[str, Any]], int]:  # fmt: skip
    """A round of one loop that lasts about `seconds`, and its count.

    tcp's loops move 2-6 GB/s, so a byte budget of 64 MiB was a 10-30 ms loop: a few scheduler
    ticks, one migration or one neighbour's burst decided a round, and rows moved more than their
    margins between runs. Here the count comes from a probe run of `probe` iterations (its rate
    alone), so every loop, engine or bare, is timed for about the same wall time whatever its
    rate; each round first runs a twentieth of that count untimed (the other loop of the row ran
    last: its connection, caches and the scheduler's placement are cold), then the timed loop."""
    clock = time.perf_counter
    make(probe)()  # connections up, pages touched
    t0 = clock()
    make(probe)()
    dt = max(clock() - t0, 1e-6)
    count = int(min(1_000_000, max(probe, seconds * probe / dt)))
    warm, timed = make(max(10, count // 20)), make(count)

    def one() -> dict[str, Any]:
        warm()
        return _timed(timed, nbytes, count)

    return one, count


# ------------------------------------------------------------------ scenarios


def one_at_a_time(transport: str, sizes: list[int], ops: list[str], rounds: int, budget: int,
                  config: dict[str, Any] | None = None, seconds: float = 0.0) -> list[dict[str, Any]]:  # fmt: skip
    """One request in flight (submit, wait, repeat) vs the bare loop, per size and op. With
    `seconds`, every loop of a round runs about that long after an untimed warm-up (`_steady`)
    instead of moving `budget` bytes."""
    rows = []
    size = max(sizes)
    with target(size, config) as t, Engine(config, transports=[transport]) as eng:
        local = eng.allocate(size, segment="small-local")
        _verify(eng, local, t.segment, size, t.seed)
        for op in ops:
            for block in sizes:
                count = _counts(block, budget)
                reqs = [Request(OPS[op], local, 0, t.segment, 0, block)]
                engine_loop(eng, reqs, 20)  # warm: the plan is cached, connections are up
                run_loop(eng, reqs, 20)
                bare = _bare_one(eng, t, transport, op, block, count, local.addr)
                fns: dict[str, Callable[[], dict[str, Any]]] = {
                    "tent": lambda reqs=reqs, count=count, block=block: _timed(lambda: engine_loop(eng, reqs, count), block, count),
                    "run": lambda reqs=reqs, count=count, block=block: _timed(lambda: run_loop(eng, reqs, count), block, count),
                    "bare": lambda bare=bare, count=count, block=block: _timed(bare, block, count),
                }  # fmt: skip
                extra: dict[str, Any] = {}
                if transport == "tcp" and int(getattr(eng.transports["tcp"], "busy_poll_us", 0)) > 0:
                    # the engine may poll: the bare limit both ways, polling (as the engine) and sleeping
                    sleeper = _bare_one(eng, t, transport, op, block, count, local.addr, sleep=True)
                    fns["bare_sleep"] = lambda sleeper=sleeper, count=count, block=block: _timed(sleeper, block, count)
                if transport == "shm":
                    mode, py = _python_one(eng, t, op, block, count, local.addr)
                    fns["python"] = lambda py=py, count=count, block=block: _timed(py, block, count)
                    extra = {"shm_mode": mode, "python_form": PYTHON_FORMS[mode]}
                if seconds > 0:
                    makers: dict[str, Callable[[int], Callable[[], Any]]] = {
                        "tent": lambda c, reqs=reqs: lambda: engine_loop(eng, reqs, c),
                        "run": lambda c, reqs=reqs: lambda: run_loop(eng, reqs, c),
                        "bare": lambda c, op=op, block=block: _bare_one(eng, t, transport, op, block, c, local.addr),
                        "bare_sleep": lambda c, op=op, block=block: _bare_one(eng, t, transport, op, block, c, local.addr,
                                                                              sleep=True),
                    }  # fmt: skip
                    counts = {}
                    for name in list(fns):
                        if name in makers:
                            fns[name], counts[name] = _steady(makers[name], block, seconds, probe=200)
                    count = counts["tent"]
                    extra["seconds"] = seconds
                res = interleave(rounds, fns)
                row = {"scenario": "one_at_a_time", "transport": transport, "op": op, "block": block, "batch": 1,
                       "count": count, "rounds": rounds, **extra, **_summary("tent", res["tent"]), **_summary("run", res["run"]),
                       **_summary("bare", res["bare"]), **_ratio(res["tent"], res["bare"]),
                       **_ratio(res["run"], res["bare"], prefix="run_")}  # fmt: skip
                if "bare_sleep" in res:
                    row.update(_summary("bare_sleep", res["bare_sleep"]), **_ratio(res["tent"], res["bare_sleep"], prefix="sleep_"))
                if "python" in res:
                    row.update(_summary("python", res["python"]), **_ratio(res["tent"], res["python"], prefix="python_"),
                               **_ratio(res["run"], res["python"], prefix="run_python_"))  # fmt: skip
                rows.append(row)
    return rows


def batches(transport: str, n: int, block: int, ops: list[str], rounds: int, budget: int,
            config: dict[str, Any] | None = None, seconds: float = 0.0) -> list[dict[str, Any]]:  # fmt: skip
    """Batches of `n` requests of `block` bytes, one batch in flight; `seconds` as in `one_at_a_time`."""
    rows = []
    with target(n * block, config) as t, Engine(config, transports=[transport]) as eng:
        local = eng.allocate(n * block, segment="small-local")
        _verify(eng, local, t.segment, n * block, t.seed)
        for op in ops:
            count = _counts(n * block, budget, 50, 2000)
            reqs = [Request(OPS[op], local, i * block, t.segment, i * block, block) for i in range(n)]
            engine_loop(eng, reqs, 10)
            fns: dict[str, Callable[[], dict[str, Any]]] = {
                "tent": lambda reqs=reqs, count=count: _timed(lambda: engine_loop(eng, reqs, count), n * block, count)}
            bare = _bare_one(eng, t, transport, op, block, count, local.addr, threads=2, batch=n)
            fns["bare"] = lambda bare=bare, count=count: _timed(bare, n * block, count)
            extra: dict[str, Any] = {}
            if seconds > 0:
                fns["tent"], count = _steady(lambda c, reqs=reqs: lambda: engine_loop(eng, reqs, c), n * block, seconds, 20)
                fns["bare"], _ = _steady(lambda c, op=op: _bare_one(eng, t, transport, op, block, c, local.addr, threads=2,
                                                                    batch=n), n * block, seconds, 20)  # fmt: skip
                extra["seconds"] = seconds
            res = interleave(rounds, fns)
            row = {"scenario": "batches", "transport": transport, "op": op, "block": block, "batch": n, "count": count,
                   "rounds": rounds, **extra, **_summary("tent", res["tent"])}  # fmt: skip
            if "bare" in res:
                row.update(_summary("bare", res["bare"]), **_ratio(res["tent"], res["bare"]))
                if transport == "shm":
                    row["bare_threads"] = 2
                else:
                    row["bare_conns"] = min(TCP_INLINE_RUNS, int(getattr(eng.transports["tcp"], "conns_per_rail", 4)) + 1)
            rows.append(row)
    return rows


def large(sizes: list[int], ops: list[str], rounds: int, budget: int,
          config: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """shm requests of several MiB, one at a time, vs two threads copying 1 MiB pieces (issue 14)."""
    rows = []
    size = max(sizes)
    with target(size, config) as t, Engine(config, transports=["shm"]) as eng:
        local = eng.allocate(size, segment="small-local")
        _verify(eng, local, t.segment, min(size, 8 * MiB), t.seed)
        for op in ops:
            for block in sizes:
                count = _counts(block, budget, 10, 500)
                reqs = [Request(OPS[op], local, 0, t.segment, 0, block)]
                engine_loop(eng, reqs, 3)
                bare = _bare_one(eng, t, "shm", op, block, count, local.addr, threads=2, piece=MiB)
                res = interleave(rounds, {
                    "tent": lambda reqs=reqs, count=count, block=block: _timed(lambda: engine_loop(eng, reqs, count), block, count),
                    "bare": lambda bare=bare, count=count, block=block: _timed(bare, block, count),
                })  # fmt: skip
                rows.append({"scenario": "large", "transport": "shm", "op": op, "block": block, "batch": 1, "count": count,
                             "rounds": rounds, "bare_threads": 2, "bare_piece": MiB, **_summary("tent", res["tent"]),
                             **_summary("bare", res["bare"]), **_ratio(res["tent"], res["bare"])})  # fmt: skip
    return rows


def two_engines(rounds: int, budget: int, n: int = 16, block: int = 64 * KiB, op: str = "WRITE",
                config: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Batched small requests over tcp: both engines in this process vs the target in another."""
    count = _counts(n * block, budget, 50, 2000)
    with target(n * block, config) as t, Engine(config, transports=["tcp"]) as eng, \
            Engine(config, transports=["tcp"]) as tgt, Engine(config, transports=["tcp"]) as ini:  # fmt: skip
        local = eng.allocate(n * block, segment="small-local")
        _verify(eng, local, t.segment, n * block, t.seed)
        tbuf = tgt.allocate(n * block, segment="bench")
        tseed = fresh_seed()
        tbuf.array[:] = fill(n * block, tseed)  # type: ignore[index]
        ilocal = ini.allocate(n * block, segment="small-local")
        _verify(ini, ilocal, tgt.segment_name("bench"), n * block, tseed)
        two = [Request(OPS[op], local, i * block, t.segment, i * block, block) for i in range(n)]
        one = [Request(OPS[op], ilocal, i * block, tgt.segment_name("bench"), i * block, block) for i in range(n)]
        engine_loop(eng, two, 10)
        engine_loop(ini, one, 10)
        res = interleave(rounds, {
            "one_process": lambda: _timed(lambda: engine_loop(ini, one, count), n * block, count),
            "two_processes": lambda: _timed(lambda: engine_loop(eng, two, count), n * block, count),
        })  # fmt: skip
    return [{"scenario": "two_engines", "transport": "tcp", "op": op, "block": block, "batch": n, "count": count,
             "rounds": rounds, **_summary("one_process", res["one_process"]),
             **_summary("two_processes", res["two_processes"]), **_ratio(res["one_process"], res["two_processes"])}]  # fmt: skip


def many_buffers(transport: str, rounds: int, count: int = 2000, few: int = 10, many: int = 10_000,
                 config: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """4 KiB synchronous READs into a segment of `few` vs `many` registered buffers, and the first
    READ of a buffer registered after the initiator read the segment.

    The ratio is the engine's cost alone: both loops touch the same number of distinct pages
    (`few` buffers, in the large segment spread evenly over its whole range, so every lookup
    searches all of it). "scattered" reads every buffer of the large segment in turn: that
    adds the target's cache and TLB misses over 10,000 pages (40 MiB), which no lookup can avoid."""
    with target(PAGE, config, few=few, many=many) as t, Engine(config, transports=[transport]) as eng:
        local = eng.allocate(PAGE, segment="small-local")
        stride = max(1, many // few)
        reqs = {
            "few": [Request(OpCode.READ, local, 0, t.seg("few"), (k % few) * PAGE, PAGE) for k in range(count)],
            "many": [Request(OpCode.READ, local, 0, t.seg("many"), (k % few) * stride * PAGE, PAGE) for k in range(count)],
            "scattered": [Request(OpCode.READ, local, 0, t.seg("many"), ((k * 7919) % many) * PAGE, PAGE)
                          for k in range(count)],
        }  # fmt: skip

        def loop(name: str) -> dict[str, Any]:
            lat = []
            clock, submit = time.perf_counter, eng.submit
            t0 = clock()
            for r in reqs[name]:
                a = clock()
                submit(r).wait()
                lat.append(clock() - a)
            return {"gbps": PAGE * count / (clock() - t0) / 1e9, "lat": lat, "med_us": float(np.median(lat)) * 1e6}

        for name in reqs:
            loop(name)  # warm: the segment is read, the plan cached
        res = interleave(rounds, {name: (lambda name=name: loop(name)) for name in reqs})
        first: dict[str, list[float]] = {"few": [], "many": []}
        for _ in range(3):
            for name in ("few", "many"):
                off = t.call(cmd="register", segment=name)["offset"]
                a = time.perf_counter()
                eng.read(local, t.seg(name), PAGE, remote_offset=off)
                first[name].append(time.perf_counter() - a)
    ratio = spread([m["med_us"] / f["med_us"] for m, f in zip(res["many"], res["few"], strict=True)])
    return [{"scenario": "many_buffers", "transport": transport, "op": "READ", "block": PAGE, "batch": 1, "count": count,
             "rounds": rounds, "few": few, "many": many,
             "few_us": spread([x["med_us"] for x in res["few"]])["med"], "many_us": spread([x["med_us"] for x in res["many"]])["med"],
             "scattered_us": spread([x["med_us"] for x in res["scattered"]])["med"],
             "ratio": ratio["med"], "ratio_lo": ratio["lo"], "ratio_hi": ratio["hi"],
             "first_read_few_ms": float(np.median(first["few"])) * 1e3, "first_read_many_ms": float(np.median(first["many"])) * 1e3}]  # fmt: skip


def qos_tail(transport: str, rounds: int, count: int = 400, block: int = 64 * KiB, stream: int = 64 * MiB,
             config: dict[str, Any] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """P99 of one-at-a-time `block` HIGH-priority READs, alone and under a concurrent stream of
    `stream`-byte LOW-priority WRITEs to the same peer, QoS on."""
    cfg = {**(config or {}), "qos": {**((config or {}).get("qos") or {}), "enabled": True}}
    with target(stream + block, cfg) as t, Engine(cfg, transports=[transport]) as eng:
        local = eng.allocate(stream + block, segment="small-local")
        _verify(eng, local, t.segment, block, t.seed)
        mouse = [Request(OpCode.READ, local, stream, t.segment, stream, block, Priority.HIGH)]
        elephant = [Request(OpCode.WRITE, local, 0, t.segment, 0, stream, Priority.LOW)]
        engine_loop(eng, mouse, 20)
        engine_loop(eng, elephant, 2)

        def idle() -> dict[str, Any]:
            return _timed(lambda: engine_loop(eng, mouse, count), block, count)

        def loaded() -> dict[str, Any]:
            stop = threading.Event()
            moved = [0, 0.0]

            def stream_loop() -> None:
                t0 = time.perf_counter()
                while not stop.is_set():
                    eng.submit(elephant).wait()
                    moved[0] += stream
                moved[1] = time.perf_counter() - t0

            th = threading.Thread(target=stream_loop, daemon=True)
            th.start()
            time.sleep(0.02)  # the stream is in flight
            r = _timed(lambda: engine_loop(eng, mouse, count), block, count)
            stop.set()
            th.join(60)
            r["stream_gbps"] = moved[0] / max(moved[1], 1e-9) / 1e9
            return r

        res = interleave(rounds, {"idle": idle, "loaded": loaded})
    p99 = spread([pct(ld["lat"], 99) / pct(i["lat"], 99) for ld, i in zip(res["loaded"], res["idle"], strict=True)])
    return [{"scenario": "qos_tail", "transport": transport, "op": "READ", "block": block, "batch": 1, "count": count,
             "rounds": rounds, "stream": stream, **_summary("idle", res["idle"]), **_summary("loaded", res["loaded"]),
             "stream_gbps": spread([x["stream_gbps"] for x in res["loaded"]])["med"],
             "ratio": p99["med"], "ratio_lo": p99["lo"], "ratio_hi": p99["hi"]}]  # fmt: skip


def submit_cost(transport: str, rounds: int, count: int = 2000, block: int = 64 * KiB) -> list[dict[str, Any]]:
    """CPU time of the submitting thread per submit() (time.thread_time_ns: robust to a loaded
    machine), `count` one-request submissions back to back before any wait, for the fast path,
    the fast path without inline work, and the Python planner."""
    variants = {
        "fast path": {},
        "fast path, no inline": {"transports": {transport: {"inline_bytes": 0}}},
        "planner": {"fast_path": False, "transports": {transport: {"inline_bytes": 0}}},
    }
    rows = []
    with target(block) as t:
        for label, cfg in variants.items():
            with Engine(cfg, transports=[transport]) as eng:
                local = eng.allocate(block, segment="small-local")
                req = [Request(OpCode.WRITE, local, 0, t.segment, 0, block)]
                engine_loop(eng, req, 200)
                cpu, wall = [], []
                for _ in range(rounds):
                    hs = []
                    c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                    for _ in range(count):
                        hs.append(eng.submit(req))
                    cpu.append((time.thread_time_ns() - c0) / count / 1e3)
                    wall.append((time.perf_counter_ns() - w0) / count / 1e3)
                    for h in hs:
                        h.wait()
                c, w = spread(cpu), spread(wall)
                rows.append({"scenario": "submit_cost", "transport": transport, "variant": label, "block": block,
                             "count": count, "rounds": rounds, "cpu_us": c["med"], "cpu_us_lo": c["lo"], "cpu_us_hi": c["hi"],
                             "wall_us": w["med"]})  # fmt: skip
    return rows


MICE_RAILS = {"tcp": {"rails": ["127.0.0.1", "127.0.0.2"]}}  # two loopback tcp rails to the target


def mice_once(count: int = 2000, block: int = 64 * KiB, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """One round of `multi_rail_mice` with the tent_core this process imports: `count` READs of
    `block` bytes one at a time (submit+wait, per-request seconds), then `count` submits back to
    back before any wait (CPU and wall time of the submitting thread per call), over a route of two
    loopback tcp rails; which share of the mice the native fast path placed (None where the engine
    has no such count), and the bytes each rail moved."""
    cfg = {**(config or {}), "transports": {**MICE_RAILS, **((config or {}).get("transports") or {})}}
    slots = 16
    with target(slots * block, cfg) as t, Engine(cfg, transports=["tcp"]) as eng:
        local = eng.allocate(slots * block, segment="small-local")
        _verify(eng, local, t.segment, slots * block, t.seed)  # also connects both rails
        reqs = [[Request(OpCode.READ, local, i * block, t.segment, i * block, block)] for i in range(slots)]
        for i in range(400):
            eng.submit(reqs[i % slots]).wait()
        time.sleep(0.05)  # a health tick or two: the rails' state is published
        fast = getattr(eng, "_fast", None)
        mice0 = getattr(fast, "mice", None)
        by0 = {r["index"]: r["bytes"] for r in eng.rail_stats()}
        submit, clock = eng.submit, time.perf_counter
        lat = []
        for i in range(count):
            t0 = clock()
            submit(reqs[i % slots]).wait()
            lat.append(clock() - t0)
        hs = []
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        for i in range(count):
            hs.append(submit(reqs[i % slots]))
        cpu_us = (time.thread_time_ns() - c0) / count / 1e3
        wall_us = (time.perf_counter_ns() - w0) / count / 1e3
        for h in hs:
            h.wait()
        mice1 = getattr(fast, "mice", None)
        by1 = {r["index"]: r["bytes"] for r in eng.rail_stats()}
        local.array[:] = 0
        for i in range(slots):
            eng.submit(reqs[i]).wait()
        if not np.array_equal(local.array[: slots * block], fill(slots * block, t.seed)):
            raise RuntimeError("multi_rail_mice: mice landed wrong bytes")
    moved = {i: by1.get(i, 0) - by0.get(i, 0) for i in by1}
    return {"p50_us": pct(lat, 50), "p99_us": pct(lat, 99), "gbps": block * count / sum(lat) / 1e9,
            "cpu_us": cpu_us, "wall_us": wall_us,
            "native_share": None if mice0 is None or mice1 is None else (mice1 - mice0) / (2 * count),
            "rail_share": min(moved.values()) / max(1, sum(moved.values())) if len(moved) == 2 else 0.0}


def _mice_child(env_path: str | None, count: int, block: int, config: dict[str, Any] | None) -> dict[str, Any]:
    """`mice_once` in a child process; `env_path`: a tent-core source tree put first on its path
    (another commit's, e.g. main's, built in place), None: this tree."""
    env = dict(os.environ)
    if env_path:
        env["PYTHONPATH"] = env_path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [sys.executable, "-m", "tent_bench.small", "--mice-once", "--mice-count", str(count), "--mice-block", str(block)]
    if config:
        argv += ["--config", json.dumps(config)]
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"multi_rail_mice child failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def multi_rail_mice(rounds: int, count: int = 2000, block: int = 64 * KiB, config: dict[str, Any] | None = None,
                    base: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """64 KiB mice on a route of two tcp rails (issue 17): per-request latency and submit cost.
    With `base` (the path of another tent-core tree, e.g. main's, its native module built in
    place), each round runs it and this tree in child processes, interleaved (the order flips
    every round); without, this tree only."""
    variants = {"this tree": None} if base is None else {"base": base, "this tree": None}
    res = interleave(rounds, {name: (lambda p=path: _mice_child(p, count, block, config)) for name, path in variants.items()})
    rows = []
    for name, samples in res.items():
        row: dict[str, Any] = {"scenario": "multi_rail_mice", "transport": "tcp", "variant": name, "block": block,
                               "count": count, "rounds": rounds}  # fmt: skip
        for key in ("p50_us", "p99_us", "gbps", "cpu_us", "wall_us", "rail_share"):
            sp = spread([s[key] for s in samples])
            row.update({key: sp["med"], key + "_lo": sp["lo"], key + "_hi": sp["hi"]})
        shares = [s["native_share"] for s in samples if s["native_share"] is not None]
        row["native_share"] = float(np.median(shares)) if shares else None
        rows.append(row)
    return rows


SCENARIOS = ("one_at_a_time", "batches", "large", "two_engines", "many_buffers", "qos_tail", "submit_cost", "multi_rail_mice")


def run(names: list[str], transports: list[str], rounds: int = 5, budget: int = 64 * MiB, ops: list[str] | None = None,
        sizes: list[int] | None = None, config: dict[str, Any] | None = None,
        progress: Callable[[str], None] | None = None, base: str | None = None, tcp_seconds: float = 0.0,
        tcp_rounds: int = 0) -> list[dict[str, Any]]:  # fmt: skip
    """The scenarios `names` on `transports` (those that apply); rows in order. `tcp_seconds`: the
    tcp rows of one_at_a_time and batches time every loop for about that long (`_steady`), over
    `tcp_rounds` rounds (0: `rounds`). `base`: multi_rail_mice runs that tent-core tree beside this one."""
    ops = ops or ["READ", "WRITE"]
    tcp_rounds = tcp_rounds or rounds
    rows: list[dict[str, Any]] = []
    say = progress or (lambda msg: None)
    for name in names:
        if name not in SCENARIOS:
            raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
        say(name)
        if name == "one_at_a_time":
            for tr in transports:
                rows += one_at_a_time(tr, sizes or [64 * KiB, 256 * KiB], ops, tcp_rounds if tr == "tcp" else rounds,
                                      budget, config, seconds=tcp_seconds if tr == "tcp" else 0.0)  # fmt: skip
        elif name == "batches":
            for tr in transports:
                rows += batches(tr, 16, 64 * KiB, ops, tcp_rounds if tr == "tcp" else rounds, budget, config,
                                seconds=tcp_seconds if tr == "tcp" else 0.0)  # fmt: skip
        elif name == "large" and "shm" in transports:
            rows += large([4 * MiB, 64 * MiB], ops, rounds, 4 * budget, config)
        elif name == "two_engines" and "tcp" in transports:
            for op in ops:  # issue 17 measured batched 64 KiB requests either way
                rows += two_engines(rounds, budget, op=op, config=config)
        elif name == "many_buffers":
            for tr in transports:
                # the target registers plain memory (as an application registers its KV pool's
                # blocks); shm in memfd mode (the default) maps only engine-allocated buffers, so
                # over shm the scenario runs in CMA mode (opt-in on both sides), which reaches any
                cfg, extra = (with_shm_mode(config, "cma"), {"shm_mode": "cma"}) if tr == "shm" else (config, {})
                try:
                    rows += [{**r, **extra} for r in many_buffers(tr, rounds, config=cfg)]
                except (NoPathError, PeerUnreachableError) as exc:
                    log.warning("many_buffers over %s not measured: %s", tr, exc)
                    rows.append({"scenario": "many_buffers", "transport": tr, "not_measured": str(exc), **extra})
        elif name == "qos_tail":
            for tr in transports:
                rows += qos_tail(tr, rounds, config=config)
        elif name == "submit_cost":
            for tr in transports:
                rows += submit_cost(tr, rounds)
        elif name == "multi_rail_mice" and "tcp" in transports:
            rows += multi_rail_mice(rounds, config=config, base=base)
    return rows


# ------------------------------------------------------------------ tables


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n // KiB} KiB" if n % KiB == 0 else f"{n} B"


def _range(r: dict[str, Any], key: str, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(r[key])} ({fmt.format(r[key + '_lo'])}-{fmt.format(r[key + '_hi'])})"


def _first_sentence(reason: str) -> str:
    """The engine's refusal, for a table cell: its own words up to the staged-path alternatives."""
    return reason.split("; no staged path either")[0].replace("|", "/")


def markdown(rows: list[dict[str, Any]]) -> str:
    """docs/benchmarks.md tables: median (lowest-highest round) for every interleaved figure."""
    out: list[str] = []

    def table(title: str, head: list[str], body: list[list[str]]) -> None:
        if not body:
            return
        out.extend([f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)])
        out.extend("| " + " | ".join(r) + " |" for r in body)
        out.append("")

    sel = lambda name: [r for r in rows if r["scenario"] == name]  # noqa: E731
    where = lambda r: f"{r['transport']} ({r['shm_mode']})" if "shm_mode" in r else r["transport"]  # noqa: E731
    ones = sel("one_at_a_time")
    opt = lambda r, key: _range(r, key) if key in r else "-"  # noqa: E731
    lat = lambda r, q: " / ".join(f"{r[f'{n}_{q}_us']:.1f}" if f"{n}_{q}_us" in r else "-"  # noqa: E731
                                  for n in ("tent", "run", "bare", "python"))  # fmt: skip
    table("One request at a time: the engine vs the bare copy in C (physical limit) and from Python (issue 17's baseline)", [
        "transport", "op", "size", "submit+wait GB/s", "run() GB/s", "bare C GB/s", "bare C sleeping GB/s",
        "bare Python GB/s", "submit+wait x C", "run() x C", "submit+wait x Python", "run() x Python",
        "P50 us (submit+wait / run / C / Python)", "P99 us (same)"], [
        [where(r), r["op"], _size(r["block"]), _range(r, "tent_gbps"), opt(r, "run_gbps"), _range(r, "bare_gbps"),
         opt(r, "bare_sleep_gbps"), opt(r, "python_gbps"), _range(r, "ratio"), opt(r, "run_ratio"), opt(r, "python_ratio"), opt(r, "run_python_ratio"),
         lat(r, "p50"), lat(r, "p99")] for r in ones])  # fmt: skip
    forms = sorted({(r["shm_mode"], r["python_form"]) for r in ones if "python_form" in r})
    notes = [f"- bare Python, shm mode {m}: {f}" for m, f in forms]
    if any("bare_sleep_gbps" in r for r in ones):
        notes.append("- bare C: both ends poll before they sleep under the tcp transport's rule (busy_poll_us, "
                     "busy_poll_adaptive), on the congestion control it gives loopback connections (loopback_congestion); "
                     "bare C sleeping: the same loop always sleeping in the kernel")  # fmt: skip
    timed = sorted({(r["transport"], r["seconds"], r["rounds"]) for r in ones + sel("batches") if r.get("seconds")})
    notes += [f"- {tr} rows (here and in the batches): every loop timed for about {sec:g} s after an untimed warm-up, "
              f"{n} interleaved round{'s' if n != 1 else ''}" for tr, sec, n in timed]  # fmt: skip
    if notes:
        out[-1:-1] = [""] + notes
    table("Batches, one in flight", ["transport", "op", "batch", "tent GB/s", "bare GB/s", "x bare", "tent P50 / P99 us"], [
        [r["transport"], r["op"], f"{r['batch']} x {_size(r['block'])}", _range(r, "tent_gbps"),
         _range(r, "bare_gbps") if "bare_gbps" in r else "", _range(r, "ratio") if "ratio" in r else "",
         f"{r['tent_p50_us']:.0f} / {r['tent_p99_us']:.0f}"] for r in sel("batches")])  # fmt: skip
    bare_notes = []
    if any(r.get("bare_threads") for r in sel("batches")):
        bare_notes.append("- bare, shm: the batch's requests shared by two threads copying with process_vm_readv/writev "
                          "(or memcpy), helpers polling for work")  # fmt: skip
    conns = sorted({r["bare_conns"] for r in sel("batches") if "bare_conns" in r})
    if conns:
        bare_notes.append(f"- bare, tcp: the bare C request loop with the batch shared out over {'/'.join(map(str, conns))} "
                          "connections as the engine shares it (one pipelined run each, sent in one writev; the "
                          "answers read connection by connection, polling under the engine's rule, on its loopback "
                          "congestion control)")  # fmt: skip
    if bare_notes and out and out[-1] == "" and sel("batches"):
        out[-1:-1] = [""] + bare_notes
    table("shm, several MiB one at a time vs two threads copying 1 MiB pieces", ["op", "size", "tent GB/s", "bare GB/s", "x bare"], [
        [r["op"], _size(r["block"]), _range(r, "tent_gbps"), _range(r, "bare_gbps"), _range(r, "ratio")] for r in sel("large")])  # fmt: skip
    table("Two engines in one process vs two processes (tcp)", ["op", "batch", "one process GB/s", "two processes GB/s", "ratio"], [
        [r["op"], f"{r['batch']} x {_size(r['block'])}", _range(r, "one_process_gbps"), _range(r, "two_processes_gbps"),
         _range(r, "ratio")] for r in sel("two_engines")])  # fmt: skip
    table("4 KiB READ into a segment of many buffers", ["transport", "buffers", "median us (few / many)", "x few",
                                                        "many, scattered over all pages, us",
                                                        "first READ after a registration, ms (few / many)"], [
        [where(r), f"{r['few']} / {r['many']}", f"{r['few_us']:.1f} / {r['many_us']:.1f}", _range(r, "ratio"),
         f"{r['scattered_us']:.1f}",
         f"{r['first_read_few_ms']:.2f} / {r['first_read_many_ms']:.2f}"] if "not_measured" not in r else
        [where(r), "", f"not measured: {_first_sentence(r['not_measured'])}", "", "", ""]
        for r in sel("many_buffers")])  # fmt: skip
    table("64 KiB HIGH READs under a concurrent 64 MiB LOW stream to the same peer (QoS on)", [
        "transport", "idle P50 / P99 us", "loaded P50 / P99 us", "P99 loaded / idle", "stream GB/s"], [
        [r["transport"], f"{r['idle_p50_us']:.0f} / {r['idle_p99_us']:.0f}", f"{r['loaded_p50_us']:.0f} / {r['loaded_p99_us']:.0f}",
         _range(r, "ratio"), f"{r['stream_gbps']:.2f}"] for r in sel("qos_tail")])  # fmt: skip
    table("submit() CPU time per call, 64 KiB, back to back (calling thread)", ["transport", "path", "CPU us per submit", "wall us"], [
        [r["transport"], r["variant"], _range(r, "cpu_us"), f"{r['wall_us']:.2f}"] for r in sel("submit_cost")])  # fmt: skip
    table("64 KiB mice on a route of two tcp rails, one at a time and back to back", [
        "tree", "P50 us", "P99 us", "GB/s one at a time", "submit CPU us", "submit wall us", "placed natively",
        "smaller rail's share"], [
        [r["variant"], _range(r, "p50_us", "{:.1f}"), _range(r, "p99_us", "{:.1f}"), _range(r, "gbps"),
         _range(r, "cpu_us"), _range(r, "wall_us"), "-" if r["native_share"] is None else f"{r['native_share']:.0%}",
         _range(r, "rail_share")] for r in sel("multi_rail_mice")])  # fmt: skip
    verdicts = targets(rows)
    if verdicts:
        out += ["**Targets (issues 17 and 14), judged from the medians above**", ""] + [f"- {v}" for v in verdicts] + [""]
    return "\n".join(out)


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def targets(rows: list[dict[str, Any]]) -> list[str]:
    """Issue 17's and issue 14's small-request targets judged from the rows (medians of the rounds).

    One line per target and row; the engine's two call forms (`submit().wait()` and `run()`) are
    judged separately where both were timed, since applications use both."""
    out: list[str] = []
    for r in rows:
        sc, where = r["scenario"], f"{r['transport']}" + (f" ({r['shm_mode']})" if "shm_mode" in r else "")
        if "not_measured" in r:
            out.append(f"{sc} {where}: not measured ({_first_sentence(r['not_measured'])})")
            continue
        if sc == "one_at_a_time" and r["transport"] == "shm" and r["block"] in (64 * KiB, 256 * KiB):
            floor = 0.8 if r["block"] == 64 * KiB else 0.9
            forms = [("submit().wait()", r.get("python_ratio")), ("run()", r.get("run_python_ratio"))]
            forms = [(n, v) for n, v in forms if v is not None]
            c_forms = [("submit().wait()", r["ratio"]), ("run()", r.get("run_ratio", r["ratio"]))]
            # issue 17's baseline is the copy called from Python (its table's "bare process_vm_readv from
            # Python"); the C loop, the physical limit, is named beside it so the verdict says which bar it is
            judged = "from Python (issue 17's baseline)" if forms else "in C"
            c_figs = "" if not forms else "; against the bare C loop: " + ", ".join(f"{n} {v:.2f}x" for n, v in c_forms)
            forms = forms or c_forms
            figs = ", ".join(f"{n} {v:.2f}x" for n, v in forms)
            met = [v >= floor for _, v in forms]
            word = "**met**" if all(met) else ("**met with run() only**" if len(met) > 1 and met[-1] else "**not met**")
            out.append(f"shm {r['op']} {_size(r['block'])} one at a time >= {floor}x the bare copy {judged}: {word} "
                       f"({figs}{c_figs})")
        elif sc == "one_at_a_time" and r["transport"] == "tcp" and r["block"] in (64 * KiB, 256 * KiB):
            floor = 2.5 if r["block"] == 64 * KiB else 6.0
            best = max(r["tent_gbps"], r.get("run_gbps", 0.0))
            out.append(f"tcp {r['op']} {_size(r['block'])} one at a time >= {floor} GB/s: {_verdict(best >= floor)} "
                       f"({best:.2f} GB/s; the bare C loop moved {r['bare_gbps']:.2f} GB/s)")  # fmt: skip
        elif sc == "batches":
            floor = 12.0 if r["transport"] == "shm" else 4.0
            bare = f"; the bare C batch loop moved {r['bare_gbps']:.2f} GB/s" if "bare_conns" in r else ""
            out.append(f"{r['transport']} {r['op']} batches of {r['batch']} x {_size(r['block'])} >= {floor} GB/s: "
                       f"{_verdict(r['tent_gbps'] >= floor)} ({r['tent_gbps']:.2f} GB/s{bare})")  # fmt: skip
        elif sc == "large":  # issue 14's bar (two threads woken per transfer) is judged in the shm-cma/-memfd blocks
            out.append(f"shm {r['op']} {_size(r['block'])} one at a time vs two threads polling for 1 MiB pieces "
                       f"(a stricter bar than issue 14's, not a target): {r['ratio']:.2f}x")  # fmt: skip
        elif sc == "two_engines":
            out.append(f"two engines in one process >= 0.8x two processes ({r['op']}): {_verdict(r['ratio'] >= 0.8)} "
                       f"({r['ratio']:.2f}x)")  # fmt: skip
        elif sc == "many_buffers":
            out.append(f"{where}: a segment of {r['many']} buffers within 1.1x of {r['few']} for a 4 KiB READ: "
                       f"{_verdict(r['ratio'] <= 1.1)} ({r['ratio']:.2f}x)")  # fmt: skip
        elif sc == "qos_tail":
            out.append(f"{where}: 64 KiB P99 under a 64 MiB stream within 3x of idle: {_verdict(r['ratio'] <= 3.0)} "
                       f"({r['ratio']:.2f}x)")  # fmt: skip
    return out


def submit_target(runs: list[dict[str, Any]]) -> str:
    """Issue 14's submit() target from `tent bench --submit-cost` runs: the median of their queued medians."""
    q = sorted(float(r["queued_median_us"]) for r in runs)
    med = float(np.median(q))
    return (f"submit() queued median <= 2 us: {_verdict(med <= 2.0)} ({med:.2f} us, median of {len(q)} runs: "
            + ", ".join(f"{x:.2f}" for x in q) + ")")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.small", description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated: {', '.join(SCENARIOS)}")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", default="64M", help="bytes per timed loop (more: longer, steadier)")
    ap.add_argument("--tcp-seconds", type=float, default=0.0,
                    help="tcp one_at_a_time/batches: time every loop for about this long after an untimed warm-up "
                         "instead of by --budget (0: by --budget)")  # fmt: skip
    ap.add_argument("--tcp-rounds", type=int, default=0, help="rounds of those tcp rows (0: --rounds)")
    ap.add_argument("--cpu", type=int, default=None,
                    help="run on this one CPU, engine, target process and bare loops alike (sched_setaffinity before "
                         "anything starts; every thread and the target inherit it): what a user can do with taskset")  # fmt: skip
    ap.add_argument("--json", dest="as_json", action="store_true", help="rows as JSON instead of markdown tables")
    ap.add_argument("--config", default=None, help="JSON engine config for both sides")
    ap.add_argument("--base", default=None, help="multi_rail_mice: a tent-core tree (e.g. main's, built in place) "
                    "run interleaved with this one")  # fmt: skip
    ap.add_argument("--mice-once", action="store_true", help=argparse.SUPPRESS)  # one multi_rail_mice round (a child)
    ap.add_argument("--mice-count", type=int, default=2000, help=argparse.SUPPRESS)
    ap.add_argument("--mice-block", type=int, default=64 * KiB, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from .cli import parse_size
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})

    if args.mice_once:
        print(json.dumps(mice_once(args.mice_count, args.mice_block, json.loads(args.config) if args.config else None)))
        return 0

    rows = run([s for s in args.scenarios.split(",") if s], [t for t in args.transports.split(",") if t], args.rounds,
               parse_size(args.budget), config=json.loads(args.config) if args.config else None,
               progress=lambda m: print(f"... {m}", file=sys.stderr, flush=True), base=args.base,
               tcp_seconds=args.tcp_seconds, tcp_rounds=args.tcp_rounds)  # fmt: skip
    meta = {"cpus": os.cpu_count(), "load": os.getloadavg(), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    if args.as_json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
    else:
        print(f"_{meta['time']}, {meta['cpus']} CPUs, load average {meta['load'][0]:.1f} at the end; "
              f"{args.rounds} interleaved rounds, median (lowest-highest round)_\n")  # fmt: skip
        print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
