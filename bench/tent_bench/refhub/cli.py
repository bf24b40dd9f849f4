"""`refhub bench ...`: refhub's benchmarks, contributed to the `refhub` CLI through the entry-point
group ``refhub.cli`` (see bench/pyproject.toml)."""

from __future__ import annotations

import json

import click


@click.group()
def bench() -> None:
    """Benchmarks (paper §5.1), printing JSON with --json."""


def _emit(res: dict, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(res, indent=2))
    else:
        for k, v in res.items():
            click.echo(f"{k:>24}: {v}")


@bench.command("server")
@click.option("--clients", default=4096, show_default=True)
@click.option("--procs", default=2, show_default=True, help="Load-generator processes.")
@click.option("--sockets", default=4, show_default=True, help="DEALER sockets per generator process.")
@click.option("--shards", default=1, show_default=True, help="Shards per replica.")
@click.option("--duration", default=5.0, show_default=True)
@click.option("--batch/--no-batch", default=True, show_default=True, help="Batch a socket's requests per frame.")
@click.option("--json", "as_json", is_flag=True)
def bench_server(clients: int, procs: int, sockets: int, shards: int, duration: float, batch: bool, as_json: bool) -> None:
    """Reference-server capacity: closed-loop publish/update/unpublish."""
    from .server import run

    _emit(run(clients=clients, procs=procs, sockets=sockets, shards=shards, duration=duration, batch=batch), as_json)


@bench.command("dataplane")
@click.option("--size-mb", default=1024.0, show_default=True, help="Shard size.")
@click.option("--tensors", default=500, show_default=True, help="Tensors in the shard (half of them tiny, packed).")
@click.option("--repeat", default=5, show_default=True)
@click.option("--transport", default=None, help="Restrict both engines to one transport (e.g. tcp); default: engine's choice.")
@click.option("--json", "as_json", is_flag=True)
def bench_dataplane(size_mb: float, tensors: int, repeat: int, transport: str | None, as_json: bool) -> None:
    """One publisher, one reader: verified replicate GB/s vs raw tent_core READs of the same bytes."""
    from .data import dataplane

    _emit(dataplane(size_mb, repeat, tensors, transport), as_json)


@bench.command("burst")
@click.option("--n", "ns", default="1,2,3,4,5,6", show_default=True, help="Receiver counts N.")
@click.option("--size-mb", default=128.0, show_default=True)
@click.option("--tensors", default=32, show_default=True, help="Tensors in the shard (half tiny).")
@click.option("--rate", default="500mbit", show_default=True, help="Every node's link rate, each direction.")
@click.option("--peers", default="gloo,ray", show_default=True, help="Baselines to run in the same run (gloo, ray).")
@click.option("--loopback", is_flag=True, help="Loopback processes even when namespaces are available.")
@click.option("--json", "as_json", is_flag=True)
def bench_burst(ns: str, size_mb: float, tensors: int, rate: str, peers: str, loopback: bool, as_json: bool) -> None:
    """One publisher, N receivers replicating at once over shaped links: pipeline vs not, gloo, Ray."""
    from .net import burst

    res = burst([int(x) for x in ns.split(",")], size_mb, tensors, rate,
                tuple(p for p in peers.split(",") if p), loopback)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    for k, v in res.items():
        if k != "rows":
            click.echo(f"{k:>24}: {v}")
    for row in res["rows"]:
        click.echo("  " + "  ".join(f"{k}={v}" for k, v in row.items()))


@bench.command("failover")
@click.option("--size-mb", default=64.0, show_default=True)
@click.option("--tensors", default=32, show_default=True)
@click.option("--rate", default="500mbit", show_default=True, help="Link rate (namespaces, as root).")
@click.option("--kill-at", default=0.5, show_default=True, help="Kill A at this fraction of one transfer time.")
@click.option("--loopback", is_flag=True, help="Loopback with an emulated NIC cap on A (the old benchmark).")
@click.option("--cap-mbps", default=100.0, show_default=True, help="Loopback only: A's emulated cap (MB/s).")
@click.option("--json", "as_json", is_flag=True)
def bench_failover(size_mb: float, tensors: int, rate: str, kill_at: float, loopback: bool, cap_mbps: float,
                   as_json: bool) -> None:
    """publisher -> A -> B; SIGKILL A mid-transfer; B's completion time vs no failure."""
    from ..testbed import Fabric

    ok, why = Fabric.available()
    if loopback or not ok:
        from .data import failover

        res = failover(size_mb, cap_mbps, kill_at)
        res["note"] = "loopback (" + ("requested" if loopback else why) + "): A's NIC emulated by a reader-side cap"
        res["extra_s"] = round(res["with_failure"]["B_seconds"] - res["no_failure"]["B_seconds"], 3)
    else:
        from .net import failover as net_failover

        res = net_failover(size_mb, tensors, rate, kill_at)
    _emit(res, as_json)
