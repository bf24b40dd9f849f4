"""When each chunk of a target-staged transfer moves: its wire leg, its control messages, its device copy.

Runs `tent bench-staging`'s target process and an initiator engine here, turns on the chunk timeline
of both halves of target staging (`tent_core.target_staging.TIMELINE`: monotonic-clock events, one
clock for both processes on one host) and moves `--iters` staged transfers of `--size` bytes per op.
Per transfer: how long the wire legs and the target's device copies were busy (the union of their
intervals) and both at once, when the first copy started, and per chunk the medians (min-max) of
each step: the wire leg, the control request's way to the target, its wait behind the session's
previous copy, the copy, the reply's way back to the initiator's pipeline. A staged transfer whose
stages overlap runs about as long as its busier stage; what it runs longer, the steps show where.

    python -m tent_bench.staging_timeline --size 512M --iters 3
    python -m tent_bench.staging_timeline --size 512M --iters 1 --chunks     # every chunk's events
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import click

from .staging import _parse_size, _Target


def _union_ms(spans: list[tuple[int, int]]) -> float:
    total, cur = 0, None
    for a, b in sorted(spans):
        if cur is None or a > cur[1]:
            if cur is not None:
                total += cur[1] - cur[0]
            cur = [a, b]
        else:
            cur[1] = max(cur[1], b)
    if cur is not None:
        total += cur[1] - cur[0]
    return total / 1e6


def _spread(xs: list[int]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"median_ms": statistics.median(xs) / 1e6, "min_ms": min(xs) / 1e6, "max_ms": max(xs) / 1e6}


def analyze(op: str, t0: int, t1: int, events: list[list[Any]]) -> dict[str, Any]:
    """One staged transfer between t0 and t1 (monotonic ns) from both halves' events: initiator
    ("submit"/"done", chunk offset, stage index), target ("arrive"/"start"/"finish", chunk offset)."""
    sub: dict[tuple[int, int], int] = {}
    done: dict[tuple[int, int], int] = {}
    tgt: dict[str, dict[int, int]] = {"arrive": {}, "start": {}, "finish": {}}
    sleeps = 0
    for ev in sorted(tuple(e) for e in events if t0 <= e[0] <= t1):
        t, kind = ev[0], ev[1]
        if kind == "submit":
            sub[(ev[2], ev[3])] = t
        elif kind == "done":
            done[(ev[2], ev[3])] = t
            sub.setdefault((ev[2], ev[3] + 1), t)  # the next stage starts as this one is seen done
        elif kind in tgt:
            tgt[kind][ev[2]] = t
        elif kind == "sleep":
            sleeps += 1
    offs = sorted(tgt["arrive"])
    wst = 0 if op == "WRITE" else 1  # WRITE: wire leg, then stage_push; READ: stage_pull, then wire leg
    cst = 1 - wst
    wire = [(sub[(o, wst)], done[(o, wst)]) for o in offs if (o, wst) in sub and (o, wst) in done]
    copy = [(tgt["start"][o], tgt["finish"][o]) for o in offs if o in tgt["start"] and o in tgt["finish"]]
    both = [(max(a, c), min(b, d)) for a, b in wire for c, d in copy if max(a, c) < min(b, d)]
    steps = {
        "wire_leg": [b - a for a, b in wire],
        "request_to_target": [tgt["arrive"][o] - sub[(o, cst)] for o in offs if (o, cst) in sub],
        "wait_for_previous_copy": [tgt["start"][o] - tgt["arrive"][o] for o in offs if o in tgt["start"]],
        "copy": [b - a for a, b in copy],
        "reply_to_pipeline": [done[(o, cst)] - tgt["finish"][o] for o in offs if (o, cst) in done and o in tgt["finish"]],
    }
    ms, wire_ms, copy_ms, both_ms = (t1 - t0) / 1e6, _union_ms(wire), _union_ms(copy), _union_ms(both)
    return {
        "op": op, "ms": ms, "chunks": len(offs), "pipeline_sleeps": sleeps,
        "wire_busy_ms": wire_ms, "copy_busy_ms": copy_ms, "both_busy_ms": both_ms,
        # on the loopback the copy alone is one thread (one core of two idle); neither: the pipeline's bubbles
        "wire_only_ms": wire_ms - both_ms, "copy_only_ms": copy_ms - both_ms,
        "neither_ms": max(0.0, ms - wire_ms - copy_ms + both_ms),
        "first_copy_ms": (min(tgt["start"].values()) - t0) / 1e6 if tgt["start"] else None,
        "steps": {k: _spread(v) for k, v in steps.items()},
        "chunk_events": {o: {"wire": [(a - t0) / 1e6 for a in (sub.get((o, wst)), done.get((o, wst))) if a],
                             "copy": [(tgt[k][o] - t0) / 1e6 for k in ("arrive", "start", "finish") if o in tgt[k]]}
                         for o in offs},
    }


def run(size: int, iters: int, ops: list[str], chunk: int | None, depth: int,
        config: dict[str, Any] | None = None) -> dict[str, Any]:
    from tent_core import READ, WRITE, Engine, target_staging
    from tent_core.testing import pattern

    common: dict[str, Any] = {"target_staging_depth": depth, "target_staging_slots": max(16, 2 * depth)}
    if chunk:
        common.update(target_staging_chunk_bytes=chunk, target_staging_min_chunk_bytes=chunk)
    common.update(config or {})
    # the target keeps --config's transport sections (a tcp setting holds for both ends)
    tgt = _Target(size, {**common, "transports": {**common.get("transports", {}), "simdev": {"ipc": False}}})
    out: dict[str, Any] = {"size": size, "iters": iters, "chunk": chunk, "depth": depth, "transfers": []}
    try:
        remote = tgt.info["engine"]
        with Engine(common, transports=["tcp"]) as eng:
            buf = eng.allocate(size)
            buf.array[:] = pattern(size, seed=7)
            back = eng.allocate(size)
            eng.transfer(WRITE, buf, 0, f"{remote}/dev", 0, size, timeout=600)  # warm: sessions, connections
            eng.transfer(READ, back, 0, f"{remote}/dev", 0, size, timeout=600)
            if not bool((back.array == buf.array).all()):
                raise RuntimeError("staged READ returned other bytes than the staged WRITE wrote")
            marks: list[tuple[str, int, int]] = []
            target_staging.TIMELINE = []
            tgt.call(cmd="timeline", on=True)
            try:
                for op in ops:
                    o, local = (WRITE, buf) if op == "WRITE" else (READ, back)
                    for _ in range(iters):
                        t0 = time.monotonic_ns()
                        eng.transfer(o, local, 0, f"{remote}/dev", 0, size, timeout=600)
                        marks.append((op, t0, time.monotonic_ns()))
                events = list(target_staging.TIMELINE) + tgt.call(cmd="timeline", on=False)["events"]
            finally:
                target_staging.TIMELINE = None
            out["transfers"] = [analyze(op, t0, t1, events) for op, t0, t1 in marks]
    finally:
        tgt.close()
    return out


@click.command("staging-timeline")
@click.option("--size", default="512M", show_default=True, help="Bytes per transfer.")
@click.option("--iters", default=3, show_default=True, type=click.IntRange(1, 100), help="Staged transfers per op.")
@click.option("--op", "ops", default="WRITE,READ", show_default=True, help="WRITE, READ or both (comma-separated).")
@click.option("--chunk", default=None, help="Every staging chunk this long (e.g. 4M); default: the engine's chunking.")
@click.option("--depth", default=4, show_default=True, type=click.IntRange(1, 64), help="Chunks in flight.")
@click.option("--config", "config", default="{}", show_default=True,
              help="More engine settings for both ends, JSON (e.g. '{\"target_staging_chunks\": 4}').")
@click.option("--chunks", "per_chunk", is_flag=True, help="Also every chunk's events (ms since the transfer began).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def main(size: str, iters: int, ops: str, chunk: str | None, depth: int, config: str, per_chunk: bool,
         as_json: bool) -> None:
    """The chunk timeline of target-staged transfers: stage overlap and the steps of each chunk."""
    rep = run(_parse_size(size), iters, [o.strip().upper() for o in ops.split(",") if o.strip()],
              _parse_size(chunk) if chunk else None, depth, json.loads(config))
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    for t in rep["transfers"]:
        click.echo(f"{t['op']} {t['ms']:.1f} ms, {t['chunks']} chunks: wire busy {t['wire_busy_ms']:.1f} ms, copy busy "
                   f"{t['copy_busy_ms']:.1f}, both {t['both_busy_ms']:.1f} (wire only {t['wire_only_ms']:.1f}, copy only "
                   f"{t['copy_only_ms']:.1f}, neither {t['neither_ms']:.1f}), first copy at {t['first_copy_ms']:.1f}, "
                   f"{t['pipeline_sleeps']} pipeline sleeps")
        click.echo("  " + "  ".join(f"{k} {v['median_ms']:.2f} [{v['min_ms']:.2f}-{v['max_ms']:.2f}]"
                                     for k, v in t["steps"].items() if v))
        if per_chunk:
            for off, ev in t["chunk_events"].items():
                click.echo(f"    chunk @{int(off) >> 20} MiB: wire " + " ".join(f"{x:.2f}" for x in ev["wire"])
                           + "  copy (arrive start finish) " + " ".join(f"{x:.2f}" for x in ev["copy"]))


if __name__ == "__main__":
    main()
