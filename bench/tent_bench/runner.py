"""`tent bench`: a TEBench-style sweep between a target process and this (initiator) process."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tent_core.engine import Engine, Request
from tent_core.testing import fresh_seed, pattern
from tent_core.types import MemoryKind, OpCode, Permission

from .baselines import file_point_requests
from .cpu import cores, process_cpu_s, staged_cpu_bound_limit

log = logging.getLogger(__name__)

KiB, MiB, GiB = 1024, 1024 * 1024, 1 << 30
DEFAULT_BLOCKS = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
QUICK_BLOCKS = [64 * KiB, 1 * MiB, 4 * MiB, 64 * MiB]


@dataclass
class BenchSpec:
    block_sizes: list[int] = field(default_factory=lambda: list(QUICK_BLOCKS))
    batch_sizes: list[int] = field(default_factory=lambda: [1])
    ops: list[str] = field(default_factory=lambda: ["READ", "WRITE"])
    threads: int = 1
    transports: list[str] | None = None  # None = every available transport
    iters: int = 50
    warmup: int = 3
    time_budget_s: float = 1.0  # per point
    host: str = "127.0.0.1"
    config: dict[str, Any] | None = None
    verify: bool = True
    file_dir: str = "/var/tmp"  # where file benchmarks keep their file (disk, not tmpfs)
    min_bytes: int = 0  # file points: each measurement moves at least this much (baselines.file_point_requests)
    wire: str | None = None  # --path over a shaped veth between two network namespaces at this rate


@contextmanager
def target_process(size: int, host: str = "127.0.0.1", config: dict[str, Any] | None = None, pattern_fill: bool = True,
                   argv_prefix: list[str] | None = None, seed: int | None = None) -> Iterator[dict[str, Any]]:
    """Start `python -m tent_bench.target`, yield its {"segment", "transports", "seed"}; always stopped.

    With `pattern_fill` the target's buffer holds `pattern(size, seed)`, a fresh seed unless given:
    each target (each benchmark round) has its own bytes, so a stale buffer never passes a check."""
    argv = [sys.executable, "-m", "tent_bench.target", "--size", str(size), "--host", host]
    if config:
        argv += ["--config", json.dumps(config)]
    if pattern_fill:
        seed = fresh_seed() if seed is None else seed
        argv += ["--pattern", "--seed", str(seed)]
    proc = subprocess.Popen((argv_prefix or []) + argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = _readline_with_timeout(proc, 60.0)
        if not line:
            raise RuntimeError(f"bench target exited early (rc={proc.poll()})")
        yield {**json.loads(line), "seed": seed if pattern_fill else None, "pid": proc.pid}
    finally:
        try:
            if proc.stdin:
                proc.stdin.close()
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def _readline_with_timeout(proc: subprocess.Popen[str], timeout: float) -> str:
    out: list[str] = []
    t = threading.Thread(target=lambda: out.append(proc.stdout.readline() if proc.stdout else ""), daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        proc.kill()
        raise TimeoutError(f"bench target did not start within {timeout:.0f}s")
    return out[0] if out else ""


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else 0.0


def run_point(
    eng: Engine,
    local: Any,
    remote: str,
    op: OpCode,
    block: int,
    batch: int,
    threads: int,
    iters: int,
    warmup: int,
    budget_s: float,
) -> tuple[float, list[float]]:
    """Returns (GB/s over the timed part, per-batch latencies in seconds)."""
    lat: list[float] = []
    lock = threading.Lock()
    errors: list[BaseException] = []
    spans: list[float] = []  # timed-loop start/end stamps of every thread

    def worker(tid: int) -> None:
        base = tid * batch * block
        reqs = [Request(op, local, base + i * block, remote, base + i * block, block) for i in range(batch)]
        for _ in range(warmup):
            eng.submit(reqs).wait()
        mine: list[float] = []
        spans.append(time.perf_counter())
        end = time.monotonic() + budget_s
        n = 0
        while n < iters and (n < 3 or time.monotonic() < end):
            t0 = time.perf_counter()
            eng.submit(reqs).wait()
            mine.append(time.perf_counter() - t0)
            n += 1
        spans.append(time.perf_counter())
        with lock:
            lat.extend(mine)

    def guarded(tid: int) -> None:
        try:
            worker(tid)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    ts = [threading.Thread(target=guarded, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    wall = max(max(spans) - min(spans), 1e-9)  # timed loops only, warm-up excluded
    return len(lat) * batch * block / wall / 1e9, lat


def run_tent(spec: BenchSpec, progress: Callable[[str], None] | None = None,
             file_path: str | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Our own rows: one per (transport, op, block_size, batch_size). File transports use
    `file_path` (made here, pattern-filled, when None); memory transports a fresh target process
    filled with a fresh pattern, checked byte for byte before timing (`verified_bytes`)."""
    max_block = max(spec.block_sizes)
    max_batch = max(spec.batch_sizes)
    size = max_block * max_batch * spec.threads
    rows: list[dict[str, Any]] = []
    memory, files = classify_transports(spec)
    wanted = spec.transports or memory + files
    missing = [t for t in wanted if t not in memory and t not in files]
    if missing:
        raise SystemExit(f"transport(s) not available: {', '.join(missing)} (have {sorted(memory + files)})")
    if any(t in files for t in wanted):
        with contextlib.ExitStack() as stack:
            path = file_path or stack.enter_context(bench_file(spec.file_dir, size))
            rows += run_tent_files(spec, [t for t in wanted if t in files], path)
        if progress:
            progress("files")
    names = [t for t in wanted if t in memory]
    if not names:
        return rows
    with target_process(size, spec.host, spec.config) as target:
        remote = target["segment"]
        offered = set(target["transports"])
        missing = [t for t in names if t not in offered]
        if missing:
            raise SystemExit(f"transport(s) not available on both sides: {', '.join(missing)} (target has {sorted(offered)})")
        for tname in names:
            with Engine(spec.config, host=spec.host, transports=[tname]) as eng:
                local = eng.allocate(size, segment="bench-local")
                verified = _verify(eng, local, remote, min(size, 8 * MiB), target["seed"]) if spec.verify else 0
                for op_name in spec.ops:
                    op = OpCode[op_name]
                    for batch in spec.batch_sizes:
                        for block in spec.block_sizes:
                            gbps, lat = run_point(
                                eng, local, remote, op, block, batch, spec.threads, spec.iters, spec.warmup, spec.time_budget_s
                            )
                            rows.append(
                                {
                                    "engine": "tent",
                                    "transport": tname,
                                    "op": op_name,
                                    "block_size": block,
                                    "batch_size": batch,
                                    "threads": spec.threads,
                                    "gbps": round(gbps, 4),
                                    "avg_us": round(float(np.mean(lat)) * 1e6, 2),
                                    "p50_us": round(percentile(lat, 50) * 1e6, 2),
                                    "p99_us": round(percentile(lat, 99) * 1e6, 2),
                                    "iters": len(lat),
                                    "verified_bytes": verified,
                                }
                            )
                            if progress:
                                progress(f"tent {tname} {op_name} {block} x{batch}")
    return rows


def _verify(eng: Engine, local: Any, remote: str, n: int, seed: int) -> int:
    """Byte-for-byte check before timing anything: READ the target's pattern, WRITE another one, READ it
    back, restore. Returns the bytes checked."""
    expect = pattern(n, seed)
    local.array[:n] = 0
    eng.submit([Request(OpCode.READ, local, 0, remote, 0, n)]).wait()
    if not np.array_equal(local.array[:n], expect):
        raise RuntimeError("bench verification failed: READ returned wrong bytes")
    other = pattern(n, fresh_seed())
    local.array[:n] = other
    eng.submit([Request(OpCode.WRITE, local, 0, remote, 0, n)]).wait()
    local.array[:n] = 0
    eng.submit([Request(OpCode.READ, local, 0, remote, 0, n)]).wait()
    if not np.array_equal(local.array[:n], other):
        raise RuntimeError("bench verification failed: WRITE then READ returned wrong bytes")
    local.array[:n] = expect  # leave the target as we found it (the next transport verifies too)
    eng.submit([Request(OpCode.WRITE, local, 0, remote, 0, n)]).wait()
    return 3 * n


def submit_cost_us(samples: int = 2000, transports: list[str] | None = None) -> dict[str, Any]:
    """Cost of submit() for one 64 KiB request (call to return), against a local target."""
    block = 64 * KiB
    with target_process(block, pattern_fill=False) as target:
        with Engine(transports=transports) as eng:
            local = eng.allocate(block, segment="bench-local")
            req = [Request(OpCode.WRITE, local, 0, target["segment"], 0, block)]
            for _ in range(50):
                eng.submit(req).wait()
            costs = []
            for _ in range(samples):
                t0 = time.perf_counter_ns()
                h = eng.submit(req)
                costs.append((time.perf_counter_ns() - t0) / 1e3)
                h.wait()
            # back to back: many submissions queued before any wait (how an engine drives KV blocks)
            queued = []
            for _ in range(max(1, samples // 200)):
                handles = []
                t0 = time.perf_counter_ns()
                for _ in range(200):
                    handles.append(eng.submit(req))
                queued.append((time.perf_counter_ns() - t0) / 1e3 / 200)
                for h in handles:
                    h.wait()
            used = sorted({r["transport"] for r in eng.rail_stats() if r["bytes"] > 0})
    return {
        "transport": ",".join(used),
        "median_us": float(np.median(costs)),
        "p99_us": percentile(costs, 99),
        "queued_median_us": float(np.median(queued)),
        "samples": samples,
    }


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """For each tent row, ratio of its GB/s and P99 to every baseline row of the same point."""
    base: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        if r["engine"] != "tent":
            base.setdefault((r["op"], r["block_size"], r["batch_size"]), []).append(r)
    for r in rows:
        if r["engine"] != "tent":
            continue
        for b in base.get((r["op"], r["block_size"], r["batch_size"]), []):
            if b["gbps"] > 0:
                r[f"x_{b['engine']}"] = round(r["gbps"] / b["gbps"], 3)
            if b.get("p99_us"):
                r[f"p99_vs_{b['engine']}"] = round(r["p99_us"] / b["p99_us"], 3)


def env_info() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": sys.version.split()[0], "time": time.strftime("%Y-%m-%d %H:%M:%S")}


# ---------------------------------------------------------------- files and synthesized paths
@contextmanager
def bench_file(directory: str, size: int, seed: int | None = None) -> Iterator[str]:
    """A file of `size` bytes holding `pattern(size, seed)` (a fresh seed unless given) for file
    benchmarks, in a directory private to this run (created mode 0700 under `directory`) and removed
    with it on exit: a file another user's run left behind is never reused, written or in the way."""
    seed = fresh_seed() if seed is None else seed
    try:
        tmp = tempfile.mkdtemp(prefix="tent-bench-", dir=directory)
    except OSError as exc:
        raise RuntimeError(f"cannot create the benchmark file in {directory}: {exc} (choose another with --file-dir)") from exc
    try:
        path = os.path.join(tmp, f"data-{size}.bin")
        with open(path, "xb") as f:
            for off in range(0, size, 16 * MiB):
                f.write(pattern(min(16 * MiB, size - off), seed, offset=off).tobytes())
            f.flush()
            os.fsync(f.fileno())
        yield path
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def classify_transports(spec: BenchSpec) -> tuple[list[str], list[str]]:
    """Available transports that move host memory between processes, and those that serve files."""
    probe = Engine(spec.config, host=spec.host)
    try:
        prof = probe._profiles
        memory = sorted(n for n, p in prof.items() if p.serves(MemoryKind.HOST, MemoryKind.HOST, True))
        files = sorted(n for n, p in prof.items() if p.serves(MemoryKind.HOST, MemoryKind.FILE, True))
    finally:
        probe.close()
    return memory, files


def run_tent_files(spec: BenchSpec, transports: list[str], path: str) -> list[dict[str, Any]]:
    """Host memory <-> a registered file, through each transport that serves (host, file)."""
    rows: list[dict[str, Any]] = []
    size = os.path.getsize(path)
    for tname in transports:
        with Engine(spec.config, host=spec.host, transports=[tname]) as eng:
            f = eng.register_file(path, segment="bench-file")
            remote = eng.segment_name("bench-file")
            local = eng.allocate(size, segment="bench-local")
            local.array[:] = np.fromfile(path, np.uint8, count=size)  # WRITEs keep the file's content
            # the bytes the file transport moves are checked once: READ the file's head into zeroed memory
            n = min(size, 8 * MiB)
            local.array[:n] = 0
            eng.submit([Request(OpCode.READ, local, 0, remote, 0, n)]).wait()
            if not np.array_equal(local.array[:n], np.fromfile(path, np.uint8, count=n)):
                raise RuntimeError(f"bench verification failed: {tname} READ of the file returned wrong bytes")
            for op_name in spec.ops:
                op = OpCode[op_name]
                for batch in spec.batch_sizes:
                    for block in spec.block_sizes:
                        if block * batch * spec.threads > size:
                            continue
                        # a fixed request count (no time budget): fio is given the same count
                        count = file_point_requests(spec.iters, spec.min_bytes, block, batch, spec.threads)
                        cpu0 = time.process_time()
                        gbps, lat = run_point(eng, local, remote, op, block, batch, spec.threads, count,
                                              spec.warmup, float("inf"))  # fmt: skip
                        cpu = time.process_time() - cpu0  # this process, every thread (warm-up included)
                        moved = (count + spec.warmup) * block * batch * spec.threads
                        rows.append(_row(tname, op_name, block, batch, spec.threads, gbps, lat, kind="file",
                                         verified_bytes=n, cpu_s_per_gb=round(cpu / (moved / 1e9), 4)))  # fmt: skip
            eng.unregister(f)
    return rows


def _row(transport: str, op: str, block: int, batch: int, threads: int, gbps: float, lat: list[float], **extra: Any) -> dict[str, Any]:
    return {
        "engine": "tent",
        "transport": transport,
        "op": op,
        "block_size": block,
        "batch_size": batch,
        "threads": threads,
        "gbps": round(gbps, 4),
        "avg_us": round(float(np.mean(lat)) * 1e6, 2),
        "p50_us": round(percentile(lat, 50) * 1e6, 2),
        "p99_us": round(percentile(lat, 99) * 1e6, 2),
        "iters": len(lat),
        **extra,
    }


def run_staged_path(spec: BenchSpec, path_spec: str, file_dir: str) -> list[dict[str, Any]]:
    """`--path file:tcp`: a file here -> memory in another process, through the path the engine
    synthesizes (file -> host staging -> remote transport, or the remote transport straight from a
    read-only mapping of the file: `tent_core.mapped`; the row's `path` and `route` name it), next
    to each stage alone, in one run.

    Rows: the staged transfer ("file:tcp"), stage 1 alone (file -> local memory) and stage 2 alone
    (local memory -> remote memory). `x_slower_stage` = staged / min(stage 1, stage 2).
    With `spec.wire` (a rate), see `run_staged_path_wire`."""
    kind, _, remote_transport = path_spec.partition(":")
    if kind != "file" or not remote_transport:
        raise ValueError(f"--path takes file:TRANSPORT (e.g. file:tcp), got {path_spec!r}")
    size = max(spec.block_sizes) * max(spec.batch_sizes)
    with bench_file(file_dir, size) as path:
        if spec.wire:
            return run_staged_path_wire(spec, path_spec, path, size)
        return _run_staged_path(spec, path_spec, remote_transport, path, size)


def run_staged_path_wire(spec: BenchSpec, path_spec: str, path: str, size: int, timeout_s: float = 1800.0) -> list[dict[str, Any]]:
    """The synthesized path over a real wire: this engine in one network namespace, the target in
    another, joined by one veth pair shaped to `spec.wire` by tc (addresses from 198.18.0.0/15).
    On loopback the TCP stage's copies run on the same cores as the file and staging copies; over
    the veth the wire is a rate the CPU does not set. Needs root; the fabric goes on every exit."""
    from .testbed.fabric import Fabric

    ok, why = Fabric.available()
    if not ok:
        raise RuntimeError(f"--wire needs root and ip netns: {why}")
    remote_transport = path_spec.partition(":")[2]
    with Fabric(nodes=2, rails=1, rate=spec.wire) as fab:
        args = {"spec": {**{f: getattr(spec, f) for f in spec.__dataclass_fields__}, "wire": None, "host": fab.addrs(0)[0]},
                "path_spec": path_spec, "remote_transport": remote_transport, "path": path, "size": size,
                "target_host": fab.addrs(1)[0], "target_prefix": fab.exec_argv(1, [])}
        rows: list[dict[str, Any]] = fab.run_json(
            0, [sys.executable, "-m", "tent_bench.runner", "--staged-path", json.dumps(args)], timeout_s,
            "the wire path benchmark")
        for r in rows:
            r["wire_gbit"] = fab.rate(0) / 1e9
    return rows


def _both_cpu_s(target_pid: int) -> float | None:
    """CPU seconds of this process and the target process, every thread of each."""
    other = process_cpu_s(target_pid)
    return None if other is None else time.process_time() + other


def _run_staged_path(spec: BenchSpec, path_spec: str, remote_transport: str, path: str, size: int,
                     target_host: str | None = None, target_prefix: list[str] | None = None) -> list[dict[str, Any]]:
    expect = np.fromfile(path, np.uint8, count=min(size, 16 * MiB))
    rows: list[dict[str, Any]] = []
    with target_process(size, target_host or spec.host, spec.config, pattern_fill=False, argv_prefix=target_prefix) as target:
        remote = target["segment"]
        probe = Engine(spec.config, host=spec.host)
        file_transports = [n for n, p in probe._profiles.items() if p.serves(MemoryKind.HOST, MemoryKind.FILE, True)]
        probe.close()
        if not file_transports:
            raise RuntimeError("no installed transport serves files (install tent-gds)")
        if remote_transport not in target["transports"]:
            raise RuntimeError(f"the target does not offer {remote_transport}")
        with Engine(spec.config, host=spec.host, transports=[file_transports[0], remote_transport]) as eng:
            f = eng.register_file(path, segment="bench-file", perm=Permission.READ)
            local = eng.allocate(size, segment="bench-local")
            own = eng.segment_name("bench-file")

            def timed(lo: Any, rem: str, op: OpCode, block: int, batch: int) -> tuple[float, list[float], float | None]:
                """run_point, and the CPU seconds per GiB both processes spent in it (warm-up included)."""
                c0 = _both_cpu_s(target["pid"])
                g, lat = run_point(eng, lo, rem, op, block, batch, 1, spec.iters, spec.warmup, spec.time_budget_s)
                c1 = _both_cpu_s(target["pid"])
                moved = (len(lat) + spec.warmup) * block * batch
                return g, lat, None if c0 is None or c1 is None else round((c1 - c0) / (moved / GiB), 4)

            for block in spec.block_sizes:
                for batch in spec.batch_sizes:
                    # the path the engine plans for the file -> remote request (mapped or staged)
                    ex = eng.explain(Request(OpCode.WRITE, f, 0, remote, 0, block))
                    label = "staged" if ex.chosen == "initiator-staged" else ex.chosen
                    # stage 1 alone: file -> local memory; stage 2 alone: local memory -> remote
                    g1, l1, c1 = timed(local, own, OpCode.READ, block, batch)
                    g2, l2, c2 = timed(local, remote, OpCode.WRITE, block, batch)
                    gs, ls, cs = timed(f, remote, OpCode.WRITE, block, batch)
                    # the limit is the staged pipeline's (it pays both stages' CPU); a mapped path pays
                    # only the wire stage's, so that limit says nothing about it
                    limit = {} if c1 is None or c2 is None or ex.chosen == "mapped" else {
                        "cpu_bound_limit": staged_cpu_bound_limit(GiB / 1e9 / g1, GiB / 1e9 / g2, c1, c2, cores())}
                    rows.append(_row(file_transports[0], "READ", block, batch, 1, g1, l1, stage="file->memory",
                                     cpu_s_per_GiB=c1))
                    rows.append(_row(remote_transport, "WRITE", block, batch, 1, g2, l2, stage="memory->remote",
                                     cpu_s_per_GiB=c2))
                    rows.append(_row(path_spec, "WRITE", block, batch, 1, gs, ls, stage=f"file->remote ({label})",
                                     x_slower_stage=round(gs / max(min(g1, g2), 1e-9), 3), cpu_s_per_GiB=cs,
                                     path=ex.chosen, route=ex.route, **limit))  # fmt: skip
            # every byte of the last staged transfer arrived: read it back from the target and compare
            n = len(expect)
            local.array[:n] = 0
            eng.submit([Request(OpCode.READ, local, 0, remote, 0, n)]).wait()
            if not np.array_equal(local.array[:n], expect[:n]):
                raise RuntimeError("staged path verification failed: the target holds wrong bytes")
            eng.unregister(f)
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--staged-path":  # run_staged_path_wire's side in its namespace
        _a = json.loads(sys.argv[2])
        _rows = _run_staged_path(BenchSpec(**_a["spec"]), _a["path_spec"], _a["remote_transport"], _a["path"], _a["size"],
                                 _a["target_host"], _a["target_prefix"])
        print(json.dumps(_rows), flush=True)
    else:
        sys.exit("usage: python -m tent_bench.runner --staged-path JSON (internal)")
