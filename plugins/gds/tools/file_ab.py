"""Interleaved A/B of the gds transport against fio at one point, one request at a time (not a test).

    python plugins/gds/tools/file_ab.py --op WRITE --block 1M [--bytes 4G] [--rounds 9]
        [--fio psync,1,1 [--fio libaio,2,16,--scramble_buffers=0 ...]] [--prefix "chrt -f 10"]
        [--file PATH] SIDE [SIDE ...]

A SIDE is `CHECKOUT` or `CHECKOUT@{json config}`: the engine of that source tree (its `.venv`,
e.g. main's from `git archive main | tar -x -C /tmp/main` and `make install` there) with that
engine config, e.g. `.@{"transports": {"gds": {"inline_bytes": 0}}}`. Every round runs fio (the
bench baseline's command: page-aligned buffers, I/Os of block / (jobs x depth), `--fio
ENGINE,JOBS,DEPTH`) and every side once, in rotating order, each in a fresh process moving
`--bytes` over [0, block) of the same file (one made here, pattern-filled, unless --file); prints
the median GB/s and CPU seconds per GB (engine sides: the whole process) per contender and the
median of the per-round ratios to the first fio setting. Every `--fio` is one more contender (its
extra fio options after the depth, comma-separated). `--prefix` runs every contender, fio and
engine alike, under that command: `chrt -f 10` (root) keeps the other sessions' processes off the
cores while a run lasts, which on a loaded 2-core machine brings the rates back near their quiet
values (both sides under the same policy). Each run's line shows the system's Dirty/Writeback MiB
at its start (the page-cache state both sides start from).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

MiB = 1 << 20


def parse_size(text: str) -> int:
    mult = {"K": 1 << 10, "M": MiB, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if mult > 1 else text) * mult)


def child(path: str, op: str, block: int, count: int, config: dict) -> dict:
    """In the checkout's own Python: `count` requests of `block` bytes, timed."""
    import time

    import numpy as np

    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    with Engine(config or None, transports=["gds"]) as eng:
        eng.register_file(path, segment="ab-file")
        local = eng.allocate(block, segment="ab-local")
        local.array[:] = np.fromfile(path, np.uint8, count=block)  # WRITEs keep the file's bytes
        reqs = [Request(OpCode[op], local, 0, eng.segment_name("ab-file"), 0, block)]
        for _ in range(3):
            eng.submit(reqs).wait()
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            eng.submit(reqs).wait()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        stats = eng.transports["gds"].stats()
    return {"gbps": count * block / wall / 1e9, "cpu_s_per_gb": cpu / (count * block / 1e9),
            "waiter_pieces": stats.get("waiter_pieces"), "nowait_slices": stats.get("nowait_slices")}  # fmt: skip


def run_fio(path: str, op: str, block: int, count: int, setting: dict, extra: list[str], prefix: list[str]) -> dict:
    """The bench baseline's fio run (its rate over the span of its I/Os, `fio_span`)."""
    from tent_bench.baselines import _fio_run

    row = _fio_run(shutil.which("fio") or "fio", path, op, block, count, setting, tuple(extra), tuple(prefix))
    return {"gbps": row["gbps"], "cpu_s_per_gb": row["cpu_s_per_gb"], "reported_gbps": row["fio_reported_gbps"],
            "skew_ms": row["fio_job_start_skew_ms"]}  # fmt: skip


def dirty_mib() -> tuple[int, int]:
    """The system's (Dirty, Writeback) MiB from /proc/meminfo."""
    with open("/proc/meminfo") as f:
        m = dict(line.split(":", 1) for line in f)
    return int(m["Dirty"].split()[0]) >> 10, int(m["Writeback"].split()[0]) >> 10


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--op", default="WRITE", choices=["READ", "WRITE"])
    ap.add_argument("--block", default="1M")
    ap.add_argument("--bytes", default="4G")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--fio", action="append", help="ENGINE,JOBS,DEPTH[,EXTRA FIO OPTION...] (repeatable)")
    ap.add_argument("--prefix", default="", help="run every contender under this command, e.g. 'chrt -f 10'")
    ap.add_argument("--file", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("sides", nargs="*")
    a = ap.parse_args()
    block = parse_size(a.block)
    count = max(1, -(-parse_size(a.bytes) // block))
    if a.child is not None:
        print(json.dumps(child(a.file, a.op, block, count, json.loads(a.child))), flush=True)
        return
    if not a.sides:
        ap.error("name at least one side")
    fios: dict[str, tuple[dict, list[str]]] = {}
    for spec in a.fio or ["psync,1,1"]:
        eng, jobs, depth, *extra = spec.split(",")
        fios["fio " + spec] = ({"ioengine": eng, "numjobs": int(jobs), "iodepth": int(depth)}, extra)
    prefix = shlex.split(a.prefix)
    tmp = None
    path = a.file
    if path is None:
        tmp = tempfile.mkdtemp(prefix="gds-ab-", dir="/var/tmp")
        path = os.path.join(tmp, "data.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(block))
            os.fsync(f.fileno())
    try:
        sides = []
        for s in a.sides:
            tree, _, cfg = s.partition("@")
            sides.append((s, os.path.abspath(tree), cfg or "{}"))
        names = list(fios) + [s[0] for s in sides]
        got: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(a.rounds):
            for n in names[r % len(names):] + names[: r % len(names)]:
                start = dirty_mib()
                if n in fios:
                    got[n].append(run_fio(path, a.op, block, count, *fios[n], prefix))
                else:
                    _, tree, cfg = next(s for s in sides if s[0] == n)
                    argv = [os.path.join(tree, ".venv/bin/python"), os.path.abspath(__file__), "--child", cfg, "--file",
                            path, "--op", a.op, "--block", a.block, "--bytes", a.bytes]  # fmt: skip
                    out = subprocess.run(prefix + argv, cwd=tree, capture_output=True, text=True, timeout=900)
                    if out.returncode != 0:
                        raise SystemExit(f"{n}: {out.stderr[-2000:]}")
                    got[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
                x = got[n][-1]
                fio_own = f" (fio's own figure {x['reported_gbps']:.2f}, jobs {x['skew_ms']:.0f} ms apart)" if n in fios else ""
                print(f"round {r + 1}: {n}: {x['gbps']:.2f} GB/s{fio_own}, CPU {x['cpu_s_per_gb']:.3f} s/GB; "
                      f"Dirty/Writeback at start {start[0]}/{start[1]} MiB, load {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)  # fmt: skip
        ref = names[0]
        print(f"{a.op} {a.block}, {a.bytes} per run, {a.rounds} rounds, prefix {a.prefix!r}")
        for n in names:
            g = [x["gbps"] for x in got[n]]
            c = [x["cpu_s_per_gb"] for x in got[n]]
            ratio = [x / y["gbps"] for x, y in zip(g, got[ref], strict=True)]
            print(f"  {n}: {statistics.median(g):.2f} GB/s ({min(g):.2f}-{max(g):.2f}), CPU {statistics.median(c):.3f} s/GB; "
                  f"x {ref} {statistics.median(ratio):.3f} ({min(ratio):.2f}-{max(ratio):.2f})")  # fmt: skip
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
