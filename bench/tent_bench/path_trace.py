"""Where the synthesized path's time and CPU go: `tent bench --path file:tcp`, chunk by chunk.

Runs the same setup as `tent bench --path file:tcp` (a file here, an engine with the file transport
and tcp, `tent_bench.target` in another process), moves `--iters` transfers of `--size` bytes
file -> remote memory through the staged pipeline with `tent_core.staged.TRACE` set, and reports:

- per chunk, when its stage 1 (file -> staging) and stage 2 (staging -> remote, tcp) were submitted
  and seen done, in ms from the request's start (median over the timed transfers);
- how much of a request's time had both stages in flight, only the file stage, only the tcp stage;
- every thread's user and system CPU and context switches (both processes, from /proc) for the
  staged transfers and for each stage alone (file -> memory; memory -> remote), per GiB moved;
- with `--mapped`, one more case: the file mapped read-only (mmap, MAP_SHARED) and registered as
  host memory, tcp sending straight from the page cache (what the engine's mapped path,
  `tent_core.mapped`, sends from, without its per-request window lookup).

The engine here runs with `mapped_paths` off, so the file -> remote case is the staged pipeline
this tool traces (with it on, the engine would send that case from a mapping of the file).

A leg's "done" is when the pipeline thread saw it (it waits for the oldest stage 1 at once; stage
2s are polled or waited for), so it is an upper bound of the leg's real end.
Single runs are noisy on a shared machine; interleave runs of two builds for an A/B.

    python -m tent_bench.path_trace --size 64M --iters 100 --mapped
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from typing import Any

import click

from .staging import _parse_size
from .staging_threads import delta, echo_run, thread_cpu

GiB = 1 << 30


def _phases(ev: list[tuple[str, int, int]]) -> dict[str, float]:
    """Seconds of one request with both stages in flight, only stage 1, only stage 2, neither."""
    marks = sorted((t, name) for name, _, t in ev if name.startswith("stage"))
    t0 = next(t for name, _, t in ev if name == "begin")
    t1 = next(t for name, _, t in ev if name == "end")
    s1 = s2 = 0
    out = {"both": 0.0, "stage1": 0.0, "stage2": 0.0, "neither": 0.0}
    last = t0
    for t, name in marks + [(t1, "end")]:
        key = "both" if s1 and s2 else "stage1" if s1 else "stage2" if s2 else "neither"
        out[key] += (t - last) / 1e9
        last = t
        s1 += {"stage1_submit": 1, "stage1_done": -1}.get(name, 0)
        s2 += {"stage2_submit": 1, "stage2_done": -1}.get(name, 0)
    out["total"] = (t1 - t0) / 1e9
    return out


def run(size: int, iters: int, config: dict[str, Any], file_dir: str, mapped: bool = False) -> dict[str, Any]:
    import mmap

    import numpy as np

    from tent_core import Engine, OpCode, Permission, Request, staged
    from tent_core.types import MemoryKind

    from .runner import bench_file, target_process

    report: dict[str, Any] = {"size": size, "iters": iters, "config": config, "runs": []}
    with bench_file(file_dir, size) as path, target_process(size, "127.0.0.1", config, pattern_fill=False) as target:
        remote, me, tp = target["segment"], os.getpid(), target["pid"]
        probe = Engine(config)
        ftr = [n for n, p in probe._profiles.items() if p.serves(MemoryKind.HOST, MemoryKind.FILE, True)][0]
        probe.close()
        with Engine({**config, "mapped_paths": False}, transports=[ftr, "tcp"]) as eng:
            f = eng.register_file(path, segment="bench-file", perm=Permission.READ)
            local = eng.allocate(size, segment="bench-local")
            own = eng.segment_name("bench-file")
            cases = {"file->memory": (local, own, OpCode.READ), "memory->remote": (local, remote, OpCode.WRITE),
                     "staged": (f, remote, OpCode.WRITE)}
            view = None
            if mapped:
                with open(path, "rb") as fh:
                    # the mapping outlives the fd, and this process (the engine's buffer keeps a view of it)
                    view = mmap.mmap(fh.fileno(), size, prot=mmap.PROT_READ)
                mbuf = eng.register(np.frombuffer(view, np.uint8), segment="bench-map", perm=Permission.READ)
                cases["file mapped->remote"] = (mbuf, remote, OpCode.WRITE)
            events: list[tuple[str, int, int]] = []
            app: list[tuple[int, int]] = []
            for name, (lo, rem, op) in cases.items():
                req = [Request(op, lo, 0, rem, 0, size)]
                for _ in range(2):  # warm: connections, staging buffers made and faulted in
                    eng.submit(req).wait()
                names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
                a, ta = thread_cpu(me), thread_cpu(tp)
                if name == "staged":
                    staged.TRACE = lambda ev, i, n: events.append((ev, i, time.perf_counter_ns()))
                t0 = time.perf_counter()
                try:
                    for _ in range(iters):
                        ta0 = time.perf_counter_ns()
                        eng.submit(req).wait()
                        if name == "staged":  # the request as the application saw it
                            app.append((ta0, time.perf_counter_ns()))
                finally:
                    staged.TRACE = None
                secs = time.perf_counter() - t0
                names.update({t.native_id: t.name for t in threading.enumerate() if t.native_id is not None})
                b, tb = thread_cpu(me), thread_cpu(tp)
                report["runs"].append({"case": name, "seconds": secs, "gib": size * iters / GiB,
                                       "initiator": delta(a, b, names), "target": delta(ta, tb, {})})
            # per request: split the event stream at each "begin"
            reqs: list[list[tuple[str, int, int]]] = []
            for ev in events:
                if ev[0] == "begin":
                    reqs.append([])
                reqs[-1].append(ev)
            chunks: dict[tuple[str, int], list[float]] = {}
            for r in reqs:
                t0 = r[0][2]
                for name, i, t in r:
                    if i >= 0:
                        chunks.setdefault((name, i), []).append((t - t0) / 1e6)
            report["chunks"] = {f"{i}:{name}": round(statistics.median(v), 3) for (name, i), v in sorted(chunks.items(), key=lambda kv: (kv[0][1], kv[0][0]))}
            ph = [_phases(r) for r in reqs]
            for p, r, (a0, a1) in zip(ph, reqs, app, strict=True):
                p["app_total"] = (a1 - a0) / 1e9  # submit to wait's return, application side
                p["app_to_begin"] = (r[0][2] - a0) / 1e9  # submit to the pipeline's start
                p["end_to_app"] = (a1 - r[-1][2]) / 1e9  # the pipeline's end to wait's return
            report["phases_ms"] = {k: round(statistics.median(p[k] for p in ph) * 1e3, 3) for k in ph[0]}
            report["phases_mean_ms"] = {k: round(statistics.fmean(p[k] for p in ph) * 1e3, 3) for k in ph[0]}
            # every byte of the last staged transfer arrived
            n = min(size, 16 << 20)
            local.array[:n] = 0
            eng.submit([Request(OpCode.READ, local, 0, remote, 0, n)]).wait()
            if not np.array_equal(local.array[:n], np.fromfile(path, np.uint8, count=n)):
                raise RuntimeError("staged path verification failed: the target holds wrong bytes")
            eng.unregister(f)
    return report


@click.command("path-trace")
@click.option("--size", default="64M", show_default=True, help="Bytes per transfer.")
@click.option("--iters", default=20, show_default=True, type=click.IntRange(1, 10000), help="Timed transfers per case.")
@click.option("--config", "config_json", default="{}", help="Engine config (JSON), both processes.")
@click.option("--file-dir", default=None, help="Directory for the benchmark file (default: the temp dir).")
@click.option("--mapped", is_flag=True, help="Also tcp straight from a read-only mapping of the file (no staging).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def main(size: str, iters: int, config_json: str, file_dir: str | None, mapped: bool, as_json: bool) -> None:
    """Per-chunk timeline and per-thread CPU of the synthesized path file -> tcp."""
    rep = run(_parse_size(size), iters, json.loads(config_json), file_dir or tempfile.gettempdir(), mapped)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    for r in rep["runs"]:
        echo_run(r["case"], r)
    click.echo("staged, per chunk (ms from the request's start, median): " + ", ".join(f"{k} {v}" for k, v in rep["chunks"].items()))
    click.echo("staged, per request (ms, median): " + ", ".join(f"{k} {v}" for k, v in rep["phases_ms"].items()))
    click.echo("staged, per request (ms, mean): " + ", ".join(f"{k} {v}" for k, v in rep["phases_mean_ms"].items()))


if __name__ == "__main__":
    main()
