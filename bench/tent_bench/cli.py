"""`tent bench`: the benchmark command, contributed to the `tent` CLI through the entry-point group
``tent_core.cli`` (see bench/pyproject.toml)."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import click
from rich.console import Console
from rich.table import Table

KiB, MiB, GiB = 1024, 1024**2, 1024**3
# File benchmarks: bytes every measurement moves at least (--min-bytes), so each runs for hundreds of
# milliseconds (1 MiB requests from the page cache go at 10-17 GB/s here); --quick moves less.
DEFAULT_FILE_BYTES, QUICK_FILE_BYTES = 4 * GiB, 64 * MiB


def parse_size(text: str) -> int:
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    mult = 1
    for suffix, m in (("k", KiB), ("m", MiB), ("g", GiB)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        value = int(float(t) * mult)
    except ValueError as exc:
        raise click.BadParameter(f"not a size: {text!r} (examples: 65536, 64K, 4M, 1G)") from exc
    if value <= 0:
        raise click.BadParameter(f"size must be > 0: {text!r}")
    return value


def _out() -> Console:
    """Tables on stdout; a pipe or file gets a wide console instead of an 80-column squeeze."""
    con = Console()
    return con if con.is_terminal else Console(width=160)


def _load_config_arg(src: str | None) -> dict[str, Any] | None:
    if not src:
        return None
    from tent_core.config import load_config

    try:
        data = json.loads(src) if src.lstrip().startswith("{") else None
        if data is None:
            import tomllib

            with open(src, "rb") as f:
                data = tomllib.load(f)
        load_config(data)  # validate now: a typo is a usage error, not a crash in a subprocess
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"--config: {exc}") from exc
    return data


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def human(n: int) -> str:
    for unit, m in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return str(n)


@click.command()
@click.option("--quick", is_flag=True,
              help="A short sweep: 4 KiB-1 MiB, one request at a time, next to the bare-copy limit, with latency percentiles.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout.")
@click.option("--transport", "transports", default=None, help="Comma-separated transports (default: every available).")
@click.option("--block-sizes", default=None, help="Comma-separated sizes, e.g. 64K,4M,64M.")
@click.option("--batch-sizes", default=None, help="Comma-separated batch sizes, e.g. 1,4.")
@click.option("--ops", default="READ,WRITE", show_default=True, help="READ, WRITE or both.")
@click.option("--threads", default=None, type=click.IntRange(1, 64), help="Submitting threads [default: 1; 4 with --fabric].")
@click.option("--iters", default=None, type=click.IntRange(1), help="Max batches per point.")
@click.option("--baseline", default=None, help="Comma-separated peers/limits run in the same sweep: mooncake, socket, cma, memcpy.")
@click.option("--submit-cost", is_flag=True, help="Also measure the cost of submit() for one 64 KiB request.")
@click.option("--no-verify", is_flag=True, help="Skip the byte-for-byte check before timing.")
@click.option("--fabric", "fabric", default=None, metavar="SPEC",
              help="Run over a fresh multi-rail netns fabric, e.g. 4x1gbit or 2x1gbit+2x500mbit (needs root).")
@click.option("--degrade", default=None, metavar="I:FACTOR[,..]", help="--fabric: rails kept at FACTOR of their rate.")
@click.option("--policy", "policies", default=None, metavar="LIST",
              help="--fabric: scheduler policies run in turn (spray, round_robin, single, stripe).")
@click.option("--timeline", default=None, metavar="PATH", help="--fabric: per-rail throughput over time, as a PNG.")
@click.option("--fault", default=None, metavar="SCENARIO",
              help="--fabric: e.g. 'down 0 at 1s; up 0 at 3s', 'degrade 2:0.5 at 1s; restore 2 at 3s', 'flap 1 every 300ms'.")
@click.option("--duration", default=None, type=click.FloatRange(0.5, 600), metavar="SECONDS",
              help="--fabric: continuous verified transfers for this long (default 5 with --fault).")
@click.option("--mixed", is_flag=True, help="--fabric: 64 KiB HIGH-priority mice under 64 MiB LOW-priority elephants, QoS off/on.")
@click.option("--path", "path_spec", default=None, metavar="KIND:TRANSPORT",
              help="A synthesized path: e.g. file:tcp = a file here -> memory in another process, staged, vs each stage alone.")
@click.option("--wire", "wire_rate", default=None, metavar="RATE",
              help="--path over a real wire: this engine and the target in two network namespaces joined by a veth "
                   "pair shaped to RATE (e.g. 2gbit). Needs root.")
@click.option("--config", "config_src", default=None, metavar="JSON|PATH",
              help="Engine config for both sides: inline JSON or a TOML file (see tent_core/config.py).")
@click.option("--file-dir", default="/var/tmp", show_default=True, help="Where file benchmarks keep their file.")
@click.option("--min-bytes", default=None, metavar="SIZE",
              help="File benchmarks: every measurement (ours and fio's) moves at least SIZE bytes, i.e. "
                   "max(--iters, SIZE / block) requests [default: 4G; 64M with --quick].")
@click.option("--offered-load", "offered", default=None, metavar="GBIT[,GBIT..]",
              help="--fabric sweep: open loop at these offered loads (Gbit/s) instead of closed-loop submitters.")
@click.option("--rounds", default=None, type=click.IntRange(1, 100),
              help="Rounds, the engine and every baseline (or policy) once per round in rotating order; "
                   "medians and min-max are reported [default: 3; 1 with --quick and sizes or baselines given; "
                   "--quick alone: its small-request sweep, 3].")
@click.option("--seeds", default=None, type=click.IntRange(1, 100),
              help="--offered-load: arrival processes (seeds) per load and policy [default: 3].")
def bench(
    quick: bool,
    as_json: bool,
    transports: str | None,
    block_sizes: str | None,
    batch_sizes: str | None,
    ops: str,
    threads: int | None,
    iters: int | None,
    baseline: str | None,
    submit_cost: bool,
    no_verify: bool,
    fabric: str | None,
    degrade: str | None,
    policies: str | None,
    timeline: str | None,
    fault: str | None,
    duration: float | None,
    mixed: bool,
    path_spec: str | None,
    wire_rate: str | None,
    config_src: str | None,
    file_dir: str,
    min_bytes: str | None,
    offered: str | None,
    rounds: int | None,
    seeds: int | None,
) -> None:
    """TEBench-style sweep between a target and an initiator process on this host.

    With --fabric, the two processes run in network namespaces joined by shaped veth rails
    (see tent_bench/fabric_bench.py) and the engine uses its multi-rail TCP transport.
    """
    from . import runner

    fabric_only = {"--degrade": degrade, "--policy": policies, "--timeline": timeline, "--fault": fault,
                   "--duration": duration, "--mixed": mixed or None, "--offered-load": offered,
                   "--seeds": seeds}  # fmt: skip
    if fabric is not None and wire_rate:
        raise click.UsageError("--wire applies to --path; --fabric builds its own shaped rails")
    if fabric is None:
        given = [k for k, v in fabric_only.items() if v is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)} only apply with --fabric")
    else:
        _bench_fabric(fabric, quick, as_json, block_sizes, batch_sizes, ops, threads, iters, degrade, policies,
                      timeline, fault, duration, mixed, baseline, submit_cost, transports, offered, rounds, seeds)  # fmt: skip
        return
    threads = threads or 1
    if quick and not (block_sizes or batch_sizes or baseline or path_spec or submit_cost or iters or threads > 1):
        _bench_quick(as_json, _csv(transports), [o.upper() for o in _csv(ops)], _load_config_arg(config_src), rounds or 3)
        return
    if wire_rate and not path_spec:
        raise click.UsageError("--wire only applies with --path (for the multi-rail fabric use --fabric)")
    spec = runner.BenchSpec(threads=threads, verify=not no_verify, file_dir=file_dir, config=_load_config_arg(config_src),
                            wire=wire_rate, min_bytes=_min_bytes(min_bytes, quick))
    if quick:
        spec.block_sizes = [64 * KiB, 4 * MiB, 64 * MiB]
        spec.iters, spec.time_budget_s = 20, 0.3
    else:
        spec.block_sizes = list(runner.DEFAULT_BLOCKS)
        spec.iters, spec.time_budget_s = 200, 1.5
    if block_sizes:
        spec.block_sizes = [parse_size(s) for s in _csv(block_sizes)]
    if batch_sizes:
        try:
            spec.batch_sizes = [int(s) for s in _csv(batch_sizes)]
        except ValueError as exc:
            raise click.BadParameter(f"batch sizes must be integers: {batch_sizes!r}") from exc
        if any(b <= 0 for b in spec.batch_sizes):
            raise click.BadParameter("batch sizes must be > 0")
    spec.ops = [o.upper() for o in _csv(ops)]
    bad = [o for o in spec.ops if o not in ("READ", "WRITE")]
    if bad or not spec.ops:
        raise click.BadParameter(f"--ops takes READ and/or WRITE, got {ops!r}")
    if iters:
        spec.iters = iters
    spec.transports = _csv(transports) or None
    baselines = _csv(baseline)
    from . import baselines as bl

    unknown = [b for b in baselines if b not in bl.BASELINES]
    if unknown:
        raise click.BadParameter(f"unknown baseline(s) {unknown}; choose from {sorted(bl.BASELINES)}")

    err = Console(stderr=True)
    rows = _local_rounds(spec, baselines, rounds or (1 if quick else 3), path_spec, file_dir, err)
    extra: dict[str, Any] = {}
    if submit_cost:
        extra = runner.submit_cost_us(transports=spec.transports)
    if as_json:
        click.echo(json.dumps(rows if not extra else rows + [dict(kind="submit_cost", **extra)], indent=1))
        return
    _print_rows(rows, baselines)
    if extra:
        _out().print(f"submit() cost, one 64 KiB request: median {extra['median_us']:.2f} us, p99 {extra['p99_us']:.2f} us, "
                     f"back to back {extra['queued_median_us']:.2f} us")


def _min_bytes(text: str | None, quick: bool) -> int:
    if text is None:
        return QUICK_FILE_BYTES if quick else DEFAULT_FILE_BYTES
    return 0 if text.strip() == "0" else parse_size(text)  # 0: exactly --iters requests


def _transport_setting(config: dict[str, Any] | None, transport: str, key: str, absent: Any) -> Any:
    """`key` of `transport`'s section under `config`, else the default its plugin publishes
    (`Transport.config_keys`, the one place it lives): the baselines follow the engine's shape even
    where a plugin's default changes. `absent` where the plugin is not installed (then no engine
    row of that transport is measured to compare with)."""
    section = ((config or {}).get("transports") or {}).get(transport) or {}
    if key in section:
        return section[key]
    from tent_core.plugin_manager import discover

    entry = discover().registry.entries.get(transport)
    return absent if entry is None else entry.factory().config_keys[key]


def _file_parallelism(config: dict[str, Any] | None) -> dict[str, int]:
    """The gds executor's shape under `config` (worker threads, I/Os in flight per worker, piece
    size): fio's settings are swept within it."""
    from .baselines import BaselineSweep as D

    return {"threads": int(_transport_setting(config, "gds", "threads", D.threads)),
            "depth": int(_transport_setting(config, "gds", "queue_depth", D.depth)),
            "piece_bytes": int(_transport_setting(config, "gds", "chunk", D.piece_bytes)) or D.piece_bytes}  # fmt: skip


def _parallelism(config: dict[str, Any] | None) -> tuple[int, int]:
    """(shm executor threads, tcp connections per rail) of the engine under `config`: the
    baselines get the same parallelism."""
    from .baselines import BaselineSweep as D

    return (int(_transport_setting(config, "shm", "threads", D.threads)),
            int(_transport_setting(config, "tcp", "conns_per_rail", D.streams)))


def _local_rounds(spec: Any, baselines: list[str], nrounds: int, path_spec: str | None, file_dir: str,
                  err: Console) -> list[dict[str, Any]]:  # fmt: skip
    """The engine and every baseline once per round, in rotating order (tent_bench.rounds);
    returns one row per point with medians, min-max and per-round ratios."""
    import dataclasses

    from tent_core.testing import fresh_seed

    from . import baselines as bl
    from . import rounds as rd
    from . import runner

    copy_threads, streams = _parallelism(spec.config)
    with contextlib.ExitStack() as cleanup:
        file_size = max(spec.block_sizes) * max(spec.batch_sizes) * spec.threads
        file_path = None
        if "fio" in baselines or any(t == "gds" for t in spec.transports or []):
            try:
                file_path = cleanup.enter_context(runner.bench_file(file_dir, file_size))
            except RuntimeError as exc:
                raise click.ClickException(str(exc)) from exc
        sweep = bl.BaselineSweep(
            block_sizes=spec.block_sizes, batch_sizes=spec.batch_sizes, ops=spec.ops,
            iters=spec.iters, warmup=spec.warmup, time_budget_s=spec.time_budget_s,
            walk_buffer=False,  # like our own sweep: every batch moves the same region
            file_path=file_path, threads=copy_threads, streams=streams,
        )  # fmt: skip

        def tent(r: int) -> list[dict[str, Any]]:
            if err.is_terminal:
                err.print(f"[dim]round {r + 1}/{nrounds}: tent[/]")
            try:
                if path_spec:
                    return runner.run_staged_path(spec, path_spec, file_dir)
                return runner.run_tent(spec, file_path=file_path)
            except (ValueError, RuntimeError) as exc:
                raise click.ClickException(str(exc)) from exc

        contenders: list[tuple[str, rd.Contender]] = [("tent", tent)]
        tuning: list[dict[str, Any]] = []
        fio_tuning: dict[str, Any] | None = None
        for name in baselines:
            if name == "mooncake":
                try:
                    err.print("[dim]mooncake: sweeping its TCP knobs[/]")
                    env, tuning = bl.mooncake_tune(dataclasses.replace(sweep, seed=fresh_seed()))
                    sweep_for = dataclasses.replace(sweep, mooncake_env=env)
                except bl.BaselineUnavailable as exc:
                    err.print(f"[yellow]baseline {name} unavailable: {exc}[/]")
                    continue
            elif name == "fio":
                try:
                    err.print("[dim]fio: sweeping its I/O engine, jobs and depth[/]")
                    fio_sweep = dataclasses.replace(sweep, **_file_parallelism(spec.config), min_bytes=spec.min_bytes)
                    best, fio_rows = bl.fio_tune(fio_sweep)
                    sweep_for = dataclasses.replace(fio_sweep, fio_settings=best)
                    fio_tuning = {"kind": "fio_tuning", "rows": fio_rows, "chosen": best}
                except bl.BaselineUnavailable as exc:
                    err.print(f"[yellow]baseline {name} unavailable: {exc}[/]")
                    continue
            else:
                sweep_for = sweep

            def run(r: int, name: str = name, sweep_for: bl.BaselineSweep = sweep_for) -> list[dict[str, Any]]:
                try:
                    return bl.BASELINES[name](dataclasses.replace(sweep_for, seed=fresh_seed()))
                except bl.BaselineUnavailable as exc:
                    raise rd.ContenderSkipped(str(exc)) from exc

            contenders.append((name, run))
        per_round = rd.run_rounds(contenders, nrounds,
                                  skipped=lambda n, why: err.print(f"[yellow]baseline {n} unavailable: {why}[/]"))  # fmt: skip
    metrics = (*rd.METRICS, "x_slower_stage", "cpu_s_per_GiB", "cpu_bound_limit") if path_spec else (*rd.METRICS, "cpu_s_per_gb", "fio_process_cpu_s_per_gb", "fio_reported_gbps", "fio_job_start_skew_ms")
    rows = rd.summarize(per_round, metrics=metrics)
    if tuning:
        rows.append({"kind": "mooncake_tuning", "rows": tuning, "chosen": next(
            (r["mooncake_env"] for r in rows if r.get("engine") == "mooncake"), None)})
    if fio_tuning:
        rows.append(fio_tuning)
    return rows


def _bench_quick(as_json: bool, transports: list[str], ops: list[str], config: dict[str, Any] | None,
                 rounds: int = 3) -> None:  # fmt: skip
    """`tent bench --quick`: the small-request sweep (tent_bench.small.one_at_a_time) on the
    same-host transports, each size interleaved with its bare limit for `rounds` rounds."""
    from tent_core.plugin_manager import discover, instantiate

    from . import small

    if any(o not in ("READ", "WRITE") for o in ops) or not ops:
        raise click.BadParameter(f"--ops takes READ and/or WRITE, got {ops!r}")
    available = []
    for name, entry in sorted(discover().registry.entries.items()):
        if name in ("shm", "tcp") and instantiate(entry)[1].available:
            available.append(name)
    wanted = transports or available
    missing = [t for t in wanted if t not in available]
    if missing:
        raise click.BadParameter(f"--quick measures shm and tcp; not available here: {', '.join(missing)}")
    err = Console(stderr=True)
    rows: list[dict[str, Any]] = []
    for t in wanted:
        err.print(f"[dim]{t}: {', '.join(human(b) for b in small.QUICK_SIZES)}, {rounds} interleaved rounds...[/]")
        rows += small.one_at_a_time(t, small.QUICK_SIZES, ops, rounds, 8 * MiB, config)
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=f"tent bench --quick: one request at a time vs the bare limit (median of {rounds} interleaved rounds)")
    for c in ("transport", "op", "size", "tent GB/s", "run() GB/s", "bare GB/s", "x bare", "run() x bare", "python GB/s",
              "run() x python", "tent p50 us", "p99 us", "p99.9 us", "bare p50 us"):  # fmt: skip
        table.add_column(c, justify="left" if c in ("transport", "op") else "right")
    opt = lambda r, k: f"{r[k]:.2f}" if k in r else "-"  # noqa: E731
    for r in rows:
        table.add_row(r["transport"], r["op"], human(r["block"]), f"{r['tent_gbps']:.2f}", opt(r, "run_gbps"),
                      f"{r['bare_gbps']:.2f}", f"{r['ratio']:.2f}", opt(r, "run_ratio"), opt(r, "python_gbps"),
                      opt(r, "run_python_ratio"), f"{r['tent_p50_us']:.1f}", f"{r['tent_p99_us']:.1f}",
                      f"{r['tent_p999_us']:.1f}", f"{r['bare_p50_us']:.1f}")  # fmt: skip
    _out().print(table)
    _out().print("tent = submit().wait(); run() = engine.run (submit and wait in one call). bare: shm = one "
                 "process_vm_readv/writev per request in C (or memcpy between the same mappings in memfd mode); tcp = a C "
                 "request/response loop on one TCP_NODELAY connection. python: the same shm copy called from a Python loop "
                 "(issue 17's baseline). Full set: scripts/bench-small.sh")


def _bench_fabric(
    fabric: str,
    quick: bool,
    as_json: bool,
    block_sizes: str | None,
    batch_sizes: str | None,
    ops: str,
    threads: int | None,
    iters: int | None,
    degrade: str | None,
    policies: str | None,
    timeline: str | None,
    fault: str | None,
    duration: float | None,
    mixed: bool,
    baseline: str | None,
    submit_cost: bool,
    transports: str | None,
    offered: str | None = None,
    rounds: int | None = None,
    seeds: int | None = None,
) -> None:
    """`tent bench --fabric SPEC ...`: build, run every policy, tear down, print rows."""
    from tent_core.config import POLICIES

    from . import fabric_bench as fb
    from .testbed.fabric import parse_fabric_spec

    if baseline or submit_cost:
        raise click.UsageError("--baseline and --submit-cost are local-mode options (not with --fabric)")
    if transports and _csv(transports) != ["tcp"]:
        raise click.UsageError("--fabric runs the tcp transport only (both namespaces share one kernel)")
    try:
        rates = parse_fabric_spec(fabric)
        spec = fb.FabricBenchSpec(fabric=fabric, degrade=fb.parse_degrade(degrade), timeline=timeline, fault=fault,
                                  duration_s=duration, mixed=mixed)  # fmt: skip
        if fault:
            fb.parse_fault(fault, duration or 5.0)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if any(i >= len(rates) for i, _ in spec.degrade):
        raise click.BadParameter(f"--degrade names a rail outside 0..{len(rates) - 1}")
    spec.policies = _csv(policies) or ["spray"]
    bad = [p for p in spec.policies if p not in POLICIES]
    if bad:
        raise click.BadParameter(f"unknown policy {bad}; choose from {list(POLICIES)}")
    if mixed and (fault or duration):
        raise click.UsageError("--mixed runs its own fixed load; drop --fault/--duration")
    spec.threads = threads or 4
    try:
        spec.offered_loads = [float(x) for x in _csv(offered)]
    except ValueError as exc:
        raise click.BadParameter(f"--offered-load takes Gbit/s values, e.g. 1.2 or 0.8,1.2: {offered!r}") from exc
    if any(not 0.01 <= x <= 1000 for x in spec.offered_loads):
        raise click.BadParameter("--offered-load values must lie in 0.01..1000 Gbit/s")
    if offered and (fault or duration or mixed):
        raise click.UsageError("--offered-load applies to the sweep (not with --fault/--duration/--mixed)")
    if seeds and not offered:
        raise click.UsageError("--seeds applies to --offered-load")
    spec.seeds = seeds or 3
    spec.rounds = rounds or (1 if quick else 3)
    if quick:
        spec.block_sizes, spec.budget_s = [1 * MiB, 64 * MiB], 1.5
        spec.mixed_duration_s, spec.lone_s = 2.0, 1.0
    else:
        # --mixed: each variant runs once per round; shorter runs keep 3 rounds near one 4 s run's time
        spec.mixed_duration_s, spec.lone_s = 2.0, 1.0
        spec.block_sizes, spec.budget_s = [256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB], 3.0
    if block_sizes:
        spec.block_sizes = [parse_size(s) for s in _csv(block_sizes)]
    if batch_sizes:
        try:
            spec.batch_sizes = [int(s) for s in _csv(batch_sizes)]
        except ValueError as exc:
            raise click.BadParameter(f"batch sizes must be integers: {batch_sizes!r}") from exc
    src = click.get_current_context().get_parameter_source("ops")
    spec.ops = [o.upper() for o in _csv(ops)] if src is not click.core.ParameterSource.DEFAULT else ["READ"]
    if any(o not in ("READ", "WRITE") for o in spec.ops):
        raise click.BadParameter(f"--ops takes READ and/or WRITE, got {ops!r}")
    if iters:
        spec.iters = iters
    if logging.getLogger().isEnabledFor(logging.INFO):
        spec.log_level = logging.getLogger().getEffectiveLevel()
    try:
        fb.check_available()
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    err = Console(stderr=True)
    rows = fb.run_fabric_bench(spec, lambda msg: err.print(f"[dim]{msg}[/]"))
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    _print_fabric_rows(rows)


def _print_fabric_rows(rows: list[dict[str, Any]]) -> None:
    con = _out()
    fab = next((r for r in rows if r.get("kind") == "fabric"), None)
    if fab:
        con.print(f"fabric {fab['spec']}: rails {fab['rail_gbit_actual']} Gbit/s (nominal sum {fab['nominal_sum_gbit']}, "
                  f"actual {fab['actual_sum_gbit']})")  # fmt: skip
    perf = [r for r in rows if r.get("engine") == "tent"]
    if perf:
        table = Table(title="tent bench --fabric")
        for c in ("policy", "op", "block", "batch", "Gbit/s", "x nominal", "x actual", "p50 ms", "p99 ms", "rail share",
                  "rail estimate Gbit/s", "rail state"):  # fmt: skip
            table.add_column(c, justify="left" if c in ("policy", "op", "rail share", "rail estimate Gbit/s", "rail state") else "right")
        for r in perf:
            table.add_row(
                r["policy"], r["op"], human(r["block_size"]), str(r["batch_size"]), f"{r['gbit']:.3f}",
                f"{r.get('x_nominal', r['gbit'] / r['nominal_sum_gbit']):.3f}",
                f"{r.get('x_actual', r['gbit'] / r['actual_sum_gbit']):.3f}",
                f"{r.get('p50_us', 0) / 1e3:.1f}", f"{r['p99_us'] / 1e3:.1f}",
                " ".join(f"{x:.2f}" for x in r.get("rail_share", [])),
                " ".join(f"{x:.2f}" for x in r.get("rail_est_gbit", [])),
                " ".join(str(x)[0] for x in r.get("rail_state", [])),  # H(ealthy) D(egraded) P(aused)
            )  # fmt: skip
        con.print(table)
    for r in rows:
        if r.get("kind") == "fault_summary":
            keys = ("app_errors", "corrupt", "bytes_verified", "all_verified", "verified_gbit", "steady_gbit",
                    "dip_ms", "dip_ms_noise", "detect_ms", "readmit_ms", "readmit_state_ms")  # fmt: skip
            con.print(f"[bold]{r['policy']}[/] {r['fault']!r}: " + ", ".join(f"{k}={r.get(k)}" for k in keys if k in r))
            for ev in r.get("events", []):
                con.print("   ", json.dumps(ev))
            if "flap" in r:
                con.print("    flap:", json.dumps(r["flap"]))
        elif r.get("kind") == "mixed":
            con.print(f"[bold]{r['label']}[/]: mice p50 {r['mice_p50_us'] / 1e3:.2f} ms, p99 {r['mice_p99_us'] / 1e3:.2f} ms "
                      f"(idle p50 {r['mice_idle_p50_us'] / 1e3:.2f} ms); elephants {r['elephant_gbit']:.3f} Gbit/s")  # fmt: skip


def _print_rows(rows: list[dict[str, Any]], baselines: list[str]) -> None:
    table = Table(title="tent bench (medians over the rounds; min-max)")
    cols = ["engine", "transport", "op", "block", "batch", "GB/s", "avg us", "p99 us"]
    ratio_cols = [f"x_{b}" for b in baselines]
    for c in cols + ratio_cols:
        table.add_column(c, justify="right" if c not in ("engine", "transport", "op") else "left")
    for r in rows:
        if r.get("kind"):
            continue
        cells = [
            r["engine"], r["transport"], r["op"], human(r["block_size"]), str(r["batch_size"]),
            f"{r['gbps']:.2f}" + (f" ({r['gbps_min']:.2f}-{r['gbps_max']:.2f})" if r.get("rounds", 1) > 1 else ""),
            f"{r['avg_us']:.0f}", f"{r['p99_us']:.0f}",
        ]
        cells += [f"{r[c]:.2f}" if c in r else "" for c in ratio_cols]
        table.add_row(*cells)
    _out().print(table)
