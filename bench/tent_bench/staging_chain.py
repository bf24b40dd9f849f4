"""The target's per-chunk chain of target-side staging alone: control and device copy, no wire bytes.

A client sends raw ``stage_push`` requests (4 in flight, one connection, as the initiator's
pipeline does) for 4 MiB chunks of a session over the target's device memory; the slots hold
whatever they hold, so no byte crosses the wire and what is measured is the target's side of each
chunk: its control thread, the device copy, the reply. Reported: the target process's CPU seconds
per GiB (all its threads), its context switches per chunk (all its threads, /proc) and the rate.
Interleave runs of two builds (PYTHONPATH) for an A/B; single runs are noisy on a shared machine.

    python -m tent_bench.staging_chain --gib 4
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from .staging import MiB, _Target

SEG = 64 * MiB


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _switches(pid: int) -> int:
    n = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            for line in Path(f"/proc/{pid}/task/{task}/status").read_text().splitlines():
                if "ctxt_switches" in line:
                    n += int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            pass
    return n


def _push(client: Any, total: int, chunk: int, depth: int) -> int:
    """stage_push chunks over one session after another until `total` bytes; returns the chunks."""
    done = 0
    while done * chunk < total:
        rep = client.call({"op": "stage_open", "seg": "dev", "offset": 0, "length": SEG, "write": True,
                           "depth": depth}, 10)
        if not rep.get("ok"):
            raise RuntimeError(f"stage_open refused: {rep}")
        sid, slots = rep["sid"], len(rep["slots"])
        todo, inflight, free = list(range(SEG // chunk)), {}, list(range(slots))
        end = time.monotonic() + 120
        while todo or inflight:
            while todo and free:
                i, slot = todo.pop(0), free.pop()
                msg = {"op": "stage_push", "sid": sid, "slot": slot, "off": i * chunk, "len": chunk}
                inflight[client.send(msg, 10)] = slot
            for r in client.replies(max(0.0, end - time.monotonic())):
                if not r.get("ok"):
                    raise RuntimeError(f"stage_push failed: {r}")
                free.append(inflight.pop(r["id"]))
                done += 1
            if time.monotonic() > end:
                raise RuntimeError("stage_push replies did not come within 120 s")
        client.call({"op": "stage_close", "sid": sid}, 10)
    return done


def run(total: int, chunk: int = 4 * MiB, depth: int = 4) -> dict[str, float]:
    from tent_core.metadata import ControlClient

    cfg = {"transports": {"simdev": {"ipc": False}}, "target_staging_chunk_bytes": chunk,
           "target_staging_slots": depth, "target_staging_depth": depth}
    tgt = _Target(SEG, cfg)
    client = ControlClient(tgt.info["engine"])
    try:
        pid = tgt.proc.pid
        _push(client, 256 * MiB, chunk, depth)  # warm: slots made, pages touched
        c0, s0, t0 = _cpu_s(pid), _switches(pid), time.perf_counter()
        n = _push(client, total, chunk, depth)
        c1, s1, t1 = _cpu_s(pid), _switches(pid), time.perf_counter()
    finally:
        client.close()
        tgt.close()
    gib = n * chunk / (1 << 30)
    return {"chunks": n, "chunk": chunk, "target_cpu_s_per_GiB": (c1 - c0) / gib,
            "target_switches_per_chunk": (s1 - s0) / n, "GBps": n * chunk / (t1 - t0) / 1e9}


@click.command()
@click.option("--gib", default=4, show_default=True, type=click.IntRange(1, 64), help="GiB pushed (after 256 MiB warm-up).")
@click.option("--chunk-mib", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option("--depth", default=4, show_default=True, type=click.IntRange(1, 16))
def main(gib: int, chunk_mib: int, depth: int) -> None:
    """The target's side of target-side staging per chunk (control + device copy, no wire)."""
    click.echo(json.dumps(run(gib << 30, chunk_mib * MiB, depth)))


if __name__ == "__main__":
    main()
