"""Where a target-staged transfer's CPU goes, thread by thread, against the same bytes over the wire alone.

Runs `tent bench-staging`'s target process and an initiator engine here, moves `--iters` transfers
of `--size` bytes each through target-side staging (host memory here -> simulated device memory
there, and back) and then the same bytes to the target's host memory (the wire alone), and reads
every thread's user and system CPU and context switches of both processes from /proc before and
after each. Reported per thread (named: Python threads by their `threading` name, native ones by
their kernel name): CPU seconds per GiB moved and context switches per MiB. The staged path's
CPU beyond the wire's is what the stage-2 copy and the per-chunk control cost.
Interleave runs of two builds for an A/B; single runs are noisy on a shared machine.

    python -m tent_bench.staging_threads --size 256M --iters 8
    python -m tent_bench.staging_threads --size 256M --iters 8 --chunk 4M --op WRITE
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import click

from .staging import _parse_size, _Target

_TCK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float, int]]:
    """{tid: (kernel name, user s, system s, context switches)} of every thread of `pid`."""
    out: dict[int, tuple[str, float, float, int]] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{task}/status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        f = stat.rsplit(")", 1)[1].split()
        cs = sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)
        out[int(task)] = (name, int(f[11]) / _TCK, int(f[12]) / _TCK, cs)
    return out


def delta(before: dict[int, tuple[str, float, float, int]], after: dict[int, tuple[str, float, float, int]],
          names: dict[int, str]) -> list[dict[str, Any]]:
    """Per thread: name, user/system CPU seconds and context switches between two `thread_cpu` reads."""
    rows = []
    for tid, (kname, u, s, cs) in after.items():
        _, u0, s0, cs0 = before.get(tid, (kname, 0.0, 0.0, 0))
        rows.append({"thread": f"{names.get(tid, kname)}:{tid}", "user_s": u - u0, "sys_s": s - s0, "switches": cs - cs0})
    return rows


def run(size: int, iters: int, ops: list[str], chunk: int | None) -> dict[str, Any]:
    from tent_core import READ, WRITE, Engine
    from tent_core.testing import pattern

    common: dict[str, Any] = {"target_staging_depth": 4, "target_staging_slots": 16}
    if chunk:
        common.update(target_staging_chunk_bytes=chunk, target_staging_min_chunk_bytes=chunk)
    tgt = _Target(size, {**common, "transports": {"simdev": {"ipc": False}}})
    report: dict[str, Any] = {"size": size, "iters": iters, "chunk": chunk, "runs": []}
    try:
        remote, me, tp = tgt.info["engine"], os.getpid(), tgt.proc.pid
        with Engine(common, transports=["tcp"]) as eng:
            buf = eng.allocate(size)
            buf.array[:] = pattern(size, seed=5)
            back = eng.allocate(size)
            eng.transfer(WRITE, buf, 0, f"{remote}/dev", 0, size, timeout=600)  # warm: sessions, connections
            eng.transfer(READ, back, 0, f"{remote}/dev", 0, size, timeout=600)
            if not bool((back.array == buf.array).all()):
                raise RuntimeError("staged READ returned other bytes than the staged WRITE wrote")
            eng.transfer(WRITE, buf, 0, f"{remote}/host", 0, size, timeout=600)
            for op in ops:
                o, local = (WRITE, buf) if op == "WRITE" else (READ, back)
                for path, seg in (("staged", "dev"), ("wire", "host")):
                    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
                    tnames = {int(k): v for k, v in tgt.call(cmd="threads")["threads"].items()}
                    a, ta = thread_cpu(me), thread_cpu(tp)
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        eng.transfer(o, local, 0, f"{remote}/{seg}", 0, size, timeout=600)
                    secs = time.perf_counter() - t0
                    b, tb = thread_cpu(me), thread_cpu(tp)
                    report["runs"].append({"op": op, "path": path, "seconds": secs, "gib": size * iters / (1 << 30),
                                           "initiator": delta(a, b, names), "target": delta(ta, tb, tnames)})
    finally:
        tgt.close()
    return report


@click.command("staging-threads")
@click.option("--size", default="256M", show_default=True, help="Bytes per transfer.")
@click.option("--iters", default=8, show_default=True, type=click.IntRange(1, 1000), help="Transfers per path and op.")
@click.option("--op", "ops", default="WRITE,READ", show_default=True, help="WRITE, READ or both (comma-separated).")
@click.option("--chunk", default=None, help="Every staging chunk this long (e.g. 4M); default: the engine's chunking.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def main(size: str, iters: int, ops: str, chunk: str | None, as_json: bool) -> None:
    """Per-thread CPU of a target-staged transfer and of the wire alone, both processes."""
    rep = run(_parse_size(size), iters, [o.strip().upper() for o in ops.split(",") if o.strip()],
              _parse_size(chunk) if chunk else None)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    for r in rep["runs"]:
        echo_run(f"{r['op']} {r['path']}", r)


def echo_run(label: str, r: dict[str, Any]) -> None:
    """One run's rate and CPU per GiB, then each thread of both processes, busiest first."""
    gib, mib = r["gib"], r["gib"] * 1024
    total = sum(t["user_s"] + t["sys_s"] for side in ("initiator", "target") for t in r[side])
    click.echo(f"{label}: {gib / r['seconds'] * 1.073741824:.2f} GB/s, {total / gib:.3f} CPU s/GiB")
    for side in ("initiator", "target"):
        for t in sorted(r[side], key=lambda t: -(t["user_s"] + t["sys_s"])):
            cpu = t["user_s"] + t["sys_s"]
            if cpu > 0:
                click.echo(f"  {side:9} {t['thread']:32} {cpu / gib:.3f} s/GiB (user {t['user_s'] / gib:.3f}, "
                           f"sys {t['sys_s'] / gib:.3f})  {t['switches'] / mib:.2f} switches/MiB")


if __name__ == "__main__":
    main()
