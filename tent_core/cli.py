"""The `tent` command line: `tent plugins`, `tent bench`."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .plugin_manager import discover, instantiate

KiB, MiB, GiB = 1024, 1024**2, 1024**3


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


def _csv(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def human(n: int) -> str:
    for unit, m in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n >= m and n % m == 0:
            return f"{n // m}{unit}"
    return str(n)


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """TENT: a declarative transfer engine."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """Installed transports: version, availability (with the reason when unavailable)."""
    ps = discover()
    rows: list[dict[str, Any]] = []
    for name, entry in sorted(ps.registry.entries.items()):
        transport, avail = instantiate(entry)
        rows.append(
            {
                "name": name,
                "distribution": entry.distribution,
                "version": entry.version,
                "abi_version": entry.abi_version,
                "status": "available" if avail.available else "unavailable",
                "reason": avail.reason,
            }
        )
    for b in ps.registry.broken:
        rows.append(
            {"name": b.name, "distribution": b.distribution, "version": "", "abi_version": None, "status": "broken", "reason": b.reason}
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="tent transports")
    for col in ("name", "distribution", "version", "status", "reason"):
        table.add_column(col)
    for r in rows:
        color = {"available": "green", "unavailable": "yellow", "broken": "red"}[r["status"]]
        table.add_row(r["name"], r["distribution"], r["version"], f"[{color}]{r['status']}[/]", r["reason"])
    Console().print(table)


@main.command()
@click.option("--quick", is_flag=True, help="A short sweep (a few seconds per transport).")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON on stdout.")
@click.option("--transport", "transports", default=None, help="Comma-separated transports (default: every available).")
@click.option("--block-sizes", default=None, help="Comma-separated sizes, e.g. 64K,4M,64M.")
@click.option("--batch-sizes", default=None, help="Comma-separated batch sizes, e.g. 1,4.")
@click.option("--ops", default="READ,WRITE", show_default=True, help="READ, WRITE or both.")
@click.option("--threads", default=1, show_default=True, type=click.IntRange(1, 64), help="Submitting threads.")
@click.option("--iters", default=None, type=click.IntRange(1), help="Max batches per point.")
@click.option("--baseline", default=None, help="Comma-separated peers/limits run in the same sweep: mooncake, socket, cma, memcpy.")
@click.option("--submit-cost", is_flag=True, help="Also measure the cost of submit() for one 64 KiB request.")
@click.option("--no-verify", is_flag=True, help="Skip the byte-for-byte check before timing.")
def bench(
    quick: bool,
    as_json: bool,
    transports: str | None,
    block_sizes: str | None,
    batch_sizes: str | None,
    ops: str,
    threads: int,
    iters: int | None,
    baseline: str | None,
    submit_cost: bool,
    no_verify: bool,
) -> None:
    """TEBench-style sweep between a target and an initiator process on this host."""
    from .bench import runner

    spec = runner.BenchSpec(threads=threads, verify=not no_verify)
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
    from .bench import baselines as bl

    unknown = [b for b in baselines if b not in bl.BASELINES]
    if unknown:
        raise click.BadParameter(f"unknown baseline(s) {unknown}; choose from {sorted(bl.BASELINES)}")

    err = Console(stderr=True)
    rows: list[dict[str, Any]] = []
    npoints = len(spec.ops) * len(spec.block_sizes) * len(spec.batch_sizes)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
        console=err, transient=True, disable=not err.is_terminal,
    ) as prog:
        task = prog.add_task("tent", total=npoints * max(1, len(spec.transports or [1])))

        def step(desc: str) -> None:
            prog.update(task, advance=1, description=desc)

        rows += runner.run_tent(spec, step)
        sweep = bl.BaselineSweep(
            block_sizes=spec.block_sizes, batch_sizes=spec.batch_sizes, ops=spec.ops,
            iters=spec.iters, warmup=spec.warmup, time_budget_s=spec.time_budget_s,
        )
        for name in baselines:
            prog.update(task, description=f"baseline {name}")
            try:
                rows += bl.BASELINES[name](sweep)
            except bl.BaselineUnavailable as exc:
                err.print(f"[yellow]baseline {name} unavailable: {exc}[/]")
    runner.add_ratios(rows)
    extra: dict[str, Any] = {}
    if submit_cost:
        extra = runner.submit_cost_us()
    if as_json:
        click.echo(json.dumps(rows if not extra else rows + [dict(kind="submit_cost", **extra)], indent=1))
        return
    _print_rows(rows, baselines)
    if extra:
        Console().print(f"submit() cost, one 64 KiB request: median {extra['median_us']:.2f} us, p99 {extra['p99_us']:.2f} us")


def _print_rows(rows: list[dict[str, Any]], baselines: list[str]) -> None:
    table = Table(title="tent bench")
    cols = ["engine", "transport", "op", "block", "batch", "GB/s", "avg us", "p99 us"]
    ratio_cols = [f"x_{b}" for b in baselines]
    for c in cols + ratio_cols:
        table.add_column(c, justify="right" if c not in ("engine", "transport", "op") else "left")
    for r in rows:
        cells = [
            r["engine"], r["transport"], r["op"], human(r["block_size"]), str(r["batch_size"]),
            f"{r['gbps']:.2f}", f"{r['avg_us']:.0f}", f"{r['p99_us']:.0f}",
        ]
        cells += [f"{r[c]:.2f}" if c in r else "" for c in ratio_cols]
        table.add_row(*cells)
    Console().print(table)


if __name__ == "__main__":
    main()
