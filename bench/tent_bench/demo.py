"""`tent demo`: the job people come for, on one machine, in about a minute.

A trainer process publishes a model-like state dict (a few hundred tensors, ~1 GiB) through refhub;
rollout processes replicate it, first one at a time (the time of one transfer alone), then all at
once after a training step (pipeline replication: a receiving rollout serves what it already holds).
Every byte is verified. Then a short `tent bench` puts the engine next to the bare limits of this
host, and a summary says what the engine chose and what each receiver's time was against one
transfer alone. Nothing to start by hand: the refhub server runs embedded in this process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import click
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn, TransferSpeedColumn
from rich.table import Table

MODEL = "demo-policy"
GiB, MiB = 1 << 30, 1 << 20
STEP_TIMEOUT_S = 300.0  # any one step (start-up, a publish, a replicate) finishes within this or the demo fails
PROGRESS_S = 0.1


# ------------------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's state dict (Qwen/Llama-like names and shapes), bf16."""

    layers: int = 24
    hidden: int = 1280
    intermediate: int = 3456
    vocab: int = 32000

    def shapes(self) -> dict[str, tuple[int, ...]]:
        h, f = self.hidden, self.intermediate
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab, h)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = (h,)
            for proj in ("q", "k", "v"):
                out[p + f"self_attn.{proj}_proj.weight"] = (h, h)
                out[p + f"self_attn.{proj}_proj.bias"] = (h,)
            out[p + "self_attn.o_proj.weight"] = (h, h)
            out[p + "post_attention_layernorm.weight"] = (h,)
            out[p + "mlp.gate_proj.weight"] = (f, h)
            out[p + "mlp.up_proj.weight"] = (f, h)
            out[p + "mlp.down_proj.weight"] = (h, f)
        out["model.norm.weight"] = (h,)
        out["lm_head.weight"] = (self.vocab, h)
        return out

    def nbytes(self) -> int:
        return sum(2 * int(np.prod(s)) for s in self.shapes().values())


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def make_state_dict(spec: ModelSpec, alloc: Callable[[str, tuple[int, ...], Any], Any] | None = None) -> dict[str, Any]:
    """Zeroed, pre-faulted tensors: torch bf16 when torch is installed, numpy float16 otherwise; from
    `alloc(name, shape, dtype)` when given (refhub's `ShardHandle.allocate`: engine memory, which the
    same-host transport reaches; it registers them too)."""
    torch = _torch()
    dtype = torch.bfloat16 if torch is not None else np.float16
    sd: dict[str, Any] = {}
    for name, shape in spec.shapes().items():
        if alloc is not None:
            t = alloc(name, shape, dtype)
        else:
            t = torch.zeros(shape, dtype=dtype) if torch is not None else np.zeros(shape, dtype)
        as_bytes(t)[::4096] = 0  # touch every page now, as a live model's weights are
        sd[name] = t
    return sd


def as_bytes(t: Any) -> np.ndarray:
    """A flat uint8 view of a numpy array or a CPU torch tensor (no copy)."""
    if isinstance(t, np.ndarray):
        return t.reshape(-1).view(np.uint8)
    import torch

    return t.view(-1).view(torch.uint8).numpy()


_MIX = np.uint64(0x9E3779B97F4A7C15)


def fill(sd: dict[str, Any], step: int) -> None:
    """Weights of training step `step`: every 8-byte word distinct within a tensor, and different
    per tensor and per step (a pattern that never repeats, so a misplaced byte cannot pass)."""
    for k, t in enumerate(sd.values()):
        b = as_bytes(t)
        words = len(b) // 8
        w = b[: words * 8].view(np.uint64)
        np.multiply(np.arange(words, dtype=np.uint64), _MIX, out=w)
        w ^= np.uint64((step << 32) | (k + 1))
        b[words * 8 :] = (step + k) & 0xFF


def digest(sd: dict[str, Any]) -> str:
    """One xxh3-64 over the whole state dict (names in order): an independent end-to-end check."""
    import xxhash

    x = xxhash.xxh3_64()
    for name in sorted(sd):
        x.update(name.encode())
        x.update(memoryview(as_bytes(sd[name])))
    return x.hexdigest()


# ------------------------------------------------------------------------------------ child processes


def _rail_counters(engine: Any) -> dict[tuple[str, str, str], tuple[int, int, int]]:
    return {(r["transport"], r["rail"], r["peer"]): (r["bytes"], r["slices"], r["errors"]) for r in engine.rail_stats()}


def _rail_delta(before: dict, after: dict) -> list[dict[str, Any]]:
    rows = []
    for key, (b, s, e) in after.items():
        b0, s0, e0 = before.get(key, (0, 0, 0))
        if b - b0 or s - s0 or e - e0:
            rows.append({"transport": key[0], "rail": key[1], "peer": key[2], "bytes": b - b0, "slices": s - s0,
                         "errors": e - e0})  # fmt: skip
    return rows


def _child(role: str, server: str, spec: ModelSpec, cmds: Any, events: Any) -> None:
    """One process: the trainer (publishes) or a rollout (replicates). Commands come from `cmds`;
    everything it has to say goes to `events` as a dict with "who"."""
    import refhub

    def say(kind: str, **kw: Any) -> None:
        events.put({"kind": kind, "who": role, **kw})

    try:
        h = refhub.open(MODEL, replica=role, server=server, hb_interval=0.2)
        # the weights live in engine memory (memfd-backed): other processes of this host read them with
        # the shm transport; numpy/torch memory register()'d in place is reachable there only through
        # CMA, which shm leaves off by default, so its bytes would go over TCP
        sd = make_state_dict(spec, alloc=h.allocate)
        from tent_core.types import MemoryKind

        memory = sorted(n for n, p in h.engine._profiles.items() if p.serves(MemoryKind.HOST, MemoryKind.HOST, True))
        say("ready", engine=h.engine.engine_id, transports=sorted(h.engine.transports), memory_transports=memory,
            torch=_torch() is not None, tensors=len(sd), bytes=sum(as_bytes(t).nbytes for t in sd.values()))  # fmt: skip
        while True:
            cmd = cmds.get(timeout=STEP_TIMEOUT_S * 4)
            if cmd[0] == "stop":
                break
            if cmd[0] == "publish":  # trainer: a training step, then publish its weights
                step = cmd[1]
                h.unpublish()  # readers of the previous version drain first
                t0 = time.perf_counter()
                fill(sd, step)
                t1 = time.perf_counter()
                h.publish(step)
                say("published", version=step, fill_s=t1 - t0, publish_s=time.perf_counter() - t1,
                    checksum_s=h.stats.get("publish_checksum_s", 0.0), digest=digest(sd))  # fmt: skip
            elif cmd[0] in ("replicate", "update"):
                before = _rail_counters(h.engine)
                done = threading.Event()

                def report(done: threading.Event = done) -> None:
                    while not done.wait(PROGRESS_S):
                        _, held, total = h.progress
                        say("progress", held=held, total=total)

                reporter = threading.Thread(target=report, daemon=True)
                reporter.start()
                t0 = time.perf_counter()
                try:
                    v = h.replicate(cmd[1], timeout=STEP_TIMEOUT_S) if cmd[0] == "replicate" else h.update(STEP_TIMEOUT_S)
                finally:
                    seconds = time.perf_counter() - t0
                    done.set()
                    reporter.join()
                _, held, total = h.progress
                say("progress", held=held, total=total)
                say("replicated", version=v, seconds=seconds, stats=dict(h.stats), digest=digest(sd),
                    rails=_rail_delta(before, _rail_counters(h.engine)))  # fmt: skip
        h.close()
        h.engine.close()
    except BaseException as exc:  # the parent reports it and stops the others
        import traceback

        say("error", error=f"{type(exc).__name__}: {exc}", tb=traceback.format_exc())


# ------------------------------------------------------------------------------------------- the show


class DemoError(click.ClickException):
    pass


class Cast:
    """The child processes and the one queue they all talk through."""

    def __init__(self, server: str, spec: ModelSpec, rollouts: int) -> None:
        self.ctx = mp.get_context("spawn")
        self.events = self.ctx.Queue()
        self.names = ["trainer"] + [f"rollout-{i}" for i in range(rollouts)]
        self.cmds = {n: self.ctx.Queue() for n in self.names}
        self.procs = {n: self.ctx.Process(target=_child, args=(n, server, spec, self.cmds[n], self.events),
                                          name=f"tent-demo-{n}", daemon=True) for n in self.names}  # fmt: skip
        self.info: dict[str, dict[str, Any]] = {}

    def start(self) -> None:
        for p in self.procs.values():
            p.start()

    def send(self, who: str, *cmd: Any) -> None:
        self.cmds[who].put(cmd)

    def next_event(self, deadline: float) -> dict[str, Any]:
        """The next event from any child; raises if a child died or nothing came before `deadline`."""
        while True:
            try:
                ev = self.events.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                dead = [n for n, p in self.procs.items() if p.exitcode is not None]
                if dead:
                    raise DemoError(f"{', '.join(dead)} exited unexpectedly (exit code "
                                    f"{self.procs[dead[0]].exitcode})") from None  # fmt: skip
                if time.monotonic() > deadline:
                    raise DemoError("a demo step did not finish in time") from None
                continue
            if ev["kind"] == "error":
                raise DemoError(f"{ev['who']} failed: {ev['error']}\n{ev['tb']}")
            return ev

    def wait_for(self, kind: str, who: set[str], on_event: Callable[[dict[str, Any]], None] | None = None,
                 timeout: float = STEP_TIMEOUT_S) -> dict[str, dict[str, Any]]:  # fmt: skip
        got: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while set(got) != who:
            ev = self.next_event(deadline)
            if on_event is not None:
                on_event(ev)
            if ev["kind"] == kind:
                got[ev["who"]] = ev
        return got

    def stop(self) -> None:
        for n, p in self.procs.items():
            if p.is_alive():
                self.cmds[n].put(("stop",))
        deadline = time.monotonic() + 30
        for p in self.procs.values():
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for q in [self.events, *self.cmds.values()]:
            q.close()
            q.cancel_join_thread()


@contextmanager
def _cast(server: str, spec: ModelSpec, rollouts: int) -> Iterator[Cast]:
    cast = Cast(server, spec, rollouts)
    try:
        cast.start()
        yield cast
    finally:
        cast.stop()


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def _replicate_with_bars(con: Console, cast: Cast, who: list[str], cmd: tuple[Any, ...]) -> dict[str, dict[str, Any]]:
    """Send `cmd` to every rollout in `who` at once; bars until all of them report the result."""
    bars = Progress(TextColumn("  {task.description:<10}"), BarColumn(bar_width=36), DownloadColumn(binary_units=False),
                    TransferSpeedColumn(), TimeElapsedColumn(), console=con)  # fmt: skip
    with bars:
        tasks = {n: bars.add_task(n, total=cast.info[n]["bytes"]) for n in who}

        def on_event(ev: dict[str, Any]) -> None:
            if ev["kind"] == "progress" and ev["who"] in tasks:
                bars.update(tasks[ev["who"]], completed=ev["held"], total=ev["total"])

        for n in who:
            cast.send(n, *cmd)
        return cast.wait_for("replicated", set(who), on_event)


def run_demo(con: Console, rollouts: int, spec: ModelSpec, bench: bool) -> dict[str, Any]:
    from refhub.server import start_embedded, stop_embedded

    t_start = time.monotonic()
    server = start_embedded(hb_timeout=3.0)
    try:
        with _cast(server, spec, rollouts) as cast:
            cast.info = cast.wait_for("ready", set(cast.names))
            trainer = cast.info["trainer"]
            roll = cast.names[1:]
            kind = "torch bf16" if trainer["torch"] else "numpy float16 (torch is not installed)"
            con.print(f"[bold]TENT + refhub demo[/]: RL weight sync between {1 + rollouts} processes on this host")
            head = Table.grid(padding=(0, 2))
            head.add_row("  refhub server", f"{server} (embedded in this process)")
            head.add_row("  model", f"{trainer['tensors']} tensors, {_gb(trainer['bytes'])}: a {spec.layers}-layer decoder as {kind}")
            head.add_row("  transports", f"{', '.join(trainer['transports'])} installed and usable")
            cast.send("trainer", "publish", 1)
            pub1 = cast.wait_for("published", {"trainer"})["trainer"]
            head.add_row("  trainer", f"published v1 in {pub1['publish_s']:.2f} s (a reference to the server; each "
                         "tensor hashed once)")  # fmt: skip
            con.print(head)
            con.print("\n[bold]1. One rollout at a time[/] replicates v1 (each one alone: the time of one transfer)")
            alone: dict[str, dict[str, Any]] = {}
            for n in roll:
                alone.update(_replicate_with_bars(con, cast, [n], ("replicate", 1)))

            cast.send("trainer", "publish", 2)
            pub2 = cast.wait_for("published", {"trainer"})["trainer"]
            con.print(f"\n[bold]2. The trainer publishes v2; {rollouts} rollouts update at once[/] (pipeline: a receiving "
                      "rollout serves what it holds)")  # fmt: skip
            together = _replicate_with_bars(con, cast, roll, ("update",))
            for res, pub in ((alone, pub1), (together, pub2)):
                bad = [n for n, r in res.items() if r["digest"] != pub["digest"] or not r["stats"].get("verified")]
                if bad:
                    raise DemoError(f"{', '.join(bad)}: state differs from the trainer's v{pub['version']}")
            infos = dict(cast.info)
        demo_s = time.monotonic() - t_start
    finally:
        stop_embedded(server)
    bench_rows = _bench(con) if bench else []
    result = {"alone": alone, "together": together, "info": infos, "digest": pub2["digest"], "bench": bench_rows,
              "demo_s": demo_s}  # fmt: skip
    _summary(con, result)
    return result


# ---------------------------------------------------------------------------------------- the bench

# Which bare limit each transport is held against: the syscall/stream it is built on, and memcpy
LIMITS = {"shm": ("cma", "memcpy"), "tcp": ("socket",)}
LIMIT_TEXT = {
    "cma": "bare process_vm_readv of 1 MiB pieces on 2 threads between two processes",
    "memcpy": "memcpy of 1 MiB pieces on 2 threads inside one process (the memory bus)",
    "socket": "4 bare TCP streams on loopback (the tcp transport's connections)",
}


def _bench(con: Console) -> list[dict[str, Any]]:
    from . import baselines as bl
    from . import runner

    spec = runner.BenchSpec(block_sizes=[64 * MiB], ops=["READ"], iters=40, warmup=2, time_budget_s=1.0)
    memory, _files = runner.classify_transports(spec)
    spec.transports = [t for t in LIMITS if t in memory]
    if not spec.transports:
        con.print("[yellow]no memory transport to benchmark[/]")
        return []
    con.print(f"\n[bold]3. tent bench[/]: 64 MiB READs between two processes ({', '.join(spec.transports)}) next to the bare "
              "limits of this host")  # fmt: skip
    sweep = bl.BaselineSweep(block_sizes=spec.block_sizes, batch_sizes=spec.batch_sizes, ops=spec.ops,
                             iters=spec.iters, warmup=spec.warmup, time_budget_s=spec.time_budget_s,
                             walk_buffer=False)  # fmt: skip
    names = sorted({b for t in spec.transports for b in LIMITS[t]})
    steps = Progress(TextColumn("  {task.description}"), BarColumn(bar_width=20), TimeElapsedColumn(), console=con,
                     transient=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    with steps:
        task = steps.add_task("tent", total=1 + len(names))
        rows += runner.run_tent(spec)
        for name in names:
            steps.update(task, advance=1, description=f"bare limit: {name}")
            try:
                rows += bl.BASELINES[name](sweep)
            except bl.BaselineUnavailable as exc:
                con.print(f"  [yellow]limit {name} unavailable here: {exc.reason}[/]")
        steps.update(task, advance=1)
    table = Table(box=None, padding=(0, 2), show_edge=False)
    for c in ("transport", "tent GB/s", "bare limit", "limit GB/s", "tent / limit"):
        table.add_column(c, justify="left" if c in ("transport", "bare limit") else "right")
    for r in (r for r in rows if r["engine"] == "tent"):
        for lim in LIMITS[r["transport"]]:
            b = next((x for x in rows if x["engine"] == lim and x["block_size"] == r["block_size"]), None)
            if b is None:
                continue
            r[f"x_{lim}"] = r["gbps"] / b["gbps"] if b["gbps"] else 0.0
            table.add_row(r["transport"], f"{r['gbps']:.2f}", lim, f"{b['gbps']:.2f}", f"{r[f'x_{lim}']:.2f}")
    con.print(table)
    for name in names:
        con.print(f"  [dim]{name}: {LIMIT_TEXT[name]}[/]")
    return rows


# -------------------------------------------------------------------------------------- the summary


def _summary(con: Console, res: dict[str, Any]) -> None:
    alone, together, info = res["alone"], res["together"], res["info"]
    t_alone = statistics.median(r["seconds"] for r in alone.values())
    con.print("\n[bold]Summary[/]")
    table = Table(box=None, padding=(0, 2), show_edge=False, pad_edge=False)
    for c in ("  receiver", "alone", "together", "x alone", "read v2 from", "transport:rail", "slices"):
        table.add_column(c, justify="right" if c in ("alone", "together", "x alone", "slices") else "left", no_wrap=True)
    used: dict[str, int] = {}
    rails_used: set[str] = set()
    retries = reroutes = 0
    pipelined = False
    for n in sorted(together):
        r = together[n]
        st = r["stats"]
        sources = []
        for s, partial in st.get("sources", []):
            sources.append(f"{s}{' (p)' if partial else ''}")
            pipelined |= bool(partial)
        rails = sorted({f"{row['transport']}:{row['rail']}" for row in r["rails"]})
        rails_used.update(rails)
        for row in r["rails"]:
            used[row["transport"]] = used.get(row["transport"], 0) + row["bytes"]
        errors = sum(row["errors"] for row in r["rails"])
        retries += errors
        reroutes += int(st.get("reroutes", 0))
        table.add_row(
            f"  {n}", f"{alone[n]['seconds']:.2f} s", f"{r['seconds']:.2f} s", f"{r['seconds'] / t_alone:.2f}",
            " > ".join(sources), ", ".join(rails) or "-", str(sum(row["slices"] for row in r["rails"])),
        )  # fmt: skip
    con.print(table)
    if pipelined:
        con.print("  [dim](p): read while that rollout was itself still receiving v2 (pipeline replication)[/]")
    n = len(together)
    slowest = max(r["seconds"] for r in together.values())
    total = sum(used.values()) or 1
    idle = [t for t in info["trainer"]["memory_transports"] if t not in used]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(
        "  receivers",
        f"one transfer alone: {t_alone:.2f} s (median of {len(alone)}); {n} at once: the slowest took {slowest:.2f} s "
        f"({slowest / t_alone:.1f}x one), against {n * t_alone:.2f} s for {n} one after another. On one host every "
        f"copy runs on the same {os.cpu_count()} cores and memory bus; across hosts, where a sender's link is the "
        "limit, pipeline replication keeps each receiver near one transfer (refhub bench burst).",
    )  # fmt: skip
    grid.add_row(
        "  engine chose",
        ", ".join(f"{t} for {b / total:.0%} of the bytes" for t, b in sorted(used.items()))
        + f" (rails: {', '.join(sorted(rails_used))}): every pair of processes shares this host"
        + (f"; {', '.join(idle)} usable, not needed" if idle else ""),
    )
    grid.add_row("  retries", f"{retries} failed slices re-issued on another rail, {reroutes} changes of source")
    grid.add_row(
        "  verified",
        f"{n} x {info['trainer']['tensors']} tensors hashed as they arrived (xxh3_64) and compared with the "
        f"trainer's checksums; whole-state digest {res['digest']} on every rollout",
    )
    if res["bench"]:
        big = max(r["block_size"] for r in res["bench"])
        ratios = [f"{r['transport']} {r[f'x_{lim}']:.2f} of {lim}" for r in res["bench"]
                  if r["engine"] == "tent" and r["block_size"] == big for lim in LIMITS[r["transport"]]
                  if f"x_{lim}" in r]  # fmt: skip
        grid.add_row("  vs limits", f"{big // MiB} MiB READs: {', '.join(ratios)}")
    con.print(grid)
    con.print(f"  [dim]replication part {res['demo_s']:.0f} s; again: make demo, or .venv/bin/tent demo --help[/]")


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@click.command()
@click.option("--rollouts", default=3, show_default=True, type=click.IntRange(1, 16), help="Rollout processes.")
@click.option("--layers", default=24, show_default=True, type=click.IntRange(1, 200),
              help="Decoder layers of the synthetic model (24: 291 tensors, ~1.1 GB).")
@click.option("--no-bench", is_flag=True, help="Skip the short `tent bench` part.")
def demo(rollouts: int, layers: int, no_bench: bool) -> None:
    """RL weight sync on this host: a trainer publishes ~1 GiB of weights through refhub, rollout
    processes replicate them (alone, then all at once, every byte verified), then a short bench
    against the bare limits and a summary of what the engine chose."""
    con = Console()
    if not con.is_terminal:
        con = Console(width=100)
    spec = ModelSpec(layers=layers)
    need = spec.nbytes() * (1 + rollouts)
    avail = _available_memory() or need
    if need > avail:
        raise click.ClickException(f"the demo needs {_gb(need)} of free memory here ({_gb(avail)} free): "
                                   "use fewer --rollouts or --layers")  # fmt: skip
    run_demo(con, rollouts, spec, bench=not no_bench)
