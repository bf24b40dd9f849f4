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
@click.option("--per-client/--multiplexed", default=False, show_default=True,
              help="One socket per client, one request per frame, heartbeats on (the paper's setting).")
@click.option("--sockets", default=4, show_default=True, help="Multiplexed only: DEALER sockets per generator process.")
@click.option("--shards", default=1, show_default=True, help="Shards per replica.")
@click.option("--duration", default=5.0, show_default=True)
@click.option("--batch/--no-batch", default=True, show_default=True, help="Multiplexed only: batch a socket's requests per frame.")
@click.option("--hb-interval", default=0.5, show_default=True, help="Per-client only: heartbeat period of every client (s).")
@click.option("--json", "as_json", is_flag=True)
def bench_server(clients: int, procs: int, per_client: bool, sockets: int, shards: int, duration: float, batch: bool,
                 hb_interval: float, as_json: bool) -> None:
    """Reference-server capacity: closed-loop publish/update/unpublish (one configuration)."""
    from .server import run

    _emit(run(clients=clients, procs=procs, sockets=sockets, shards=shards, duration=duration, batch=batch,
              per_client=per_client, hb_interval=hb_interval), as_json)


@bench.command("server-sweep")
@click.option("--clients", default="1024,4096,8192", show_default=True, help="Client counts (per-client sockets).")
@click.option("--shards", default="1,2,4,8", show_default=True, help="Shards per replica.")
@click.option("--procs", default=2, show_default=True, help="Load-generator processes.")
@click.option("--duration", default=5.0, show_default=True)
@click.option("--rounds", default=3, show_default=True, help="Repeat the whole series; median and spread per row.")
@click.option("--batched-clients", default=4096, show_default=True, help="Clients of the multiplexed batched row (0: none).")
@click.option("--quick", is_flag=True, help="1024 and 8192 clients, shards 1 and 8, 2 s runs, 1 round.")
@click.option("--json", "as_json", is_flag=True)
def bench_server_sweep(clients: str, shards: str, procs: int, duration: float, rounds: int, batched_clients: int,
                       quick: bool, as_json: bool) -> None:
    """The paper's capacity figure: per-client sockets + heartbeats, clients x shards, plus the batched row."""
    from .server import sweep

    if quick:
        clients, shards, duration, rounds = "1024,8192", "1,8", 2.0, 1
    res = sweep([int(x) for x in clients.split(",")], [int(x) for x in shards.split(",")], procs=procs,
                duration=duration, rounds=rounds, batched_clients=batched_clients)
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    for r in res["rows"]:
        ops = r.get("ops_per_s", {})
        click.echo(f"{r.get('form', '?'):>60} clients={r.get('clients')} shards={r.get('shards_per_replica', r.get('shards'))} "
                   f"ops/s={ops.get('median') if isinstance(ops, dict) else ops} failed={r.get('server_failed_replicas')} "
                   f"errors={r.get('errors')}")


@bench.command("dataplane")
@click.option("--size-mb", default=1024.0, show_default=True, help="Shard size.")
@click.option("--tensors", default=500, show_default=True, help="Tensors in the shard (half of them tiny, packed).")
@click.option("--repeat", default=5, show_default=True)
@click.option("--transport", default=None, help="Restrict both engines to one transport (e.g. tcp); default: engine's choice.")
@click.option("--quick", is_flag=True, help="256 MB in 100 tensors, 3 rounds.")
@click.option("--json", "as_json", is_flag=True)
def bench_dataplane(size_mb: float, tensors: int, repeat: int, transport: str | None, quick: bool, as_json: bool) -> None:
    """One publisher, one reader: verified replicate GB/s vs raw tent_core READs of the same bytes."""
    from .data import dataplane

    if quick:
        size_mb, tensors, repeat = 256.0, 100, 3

    _emit(dataplane(size_mb, repeat, tensors, transport), as_json)


@bench.command("burst")
@click.option("--n", "ns", default="1,2,4,6", show_default=True, help="Receiver counts N.")
@click.option("--size-mb", default=64.0, show_default=True)
@click.option("--tensors", default=32, show_default=True, help="Tensors in the shard (half tiny).")
@click.option("--rate", default="500mbit", show_default=True, help="Every node's link rate, each direction.")
@click.option("--peers", default="gloo,ray", show_default=True, help="Baselines to run in the same run (gloo, ray).")
@click.option("--gloo-forms", default="chain,async", show_default=True,
              help="gloo forms: chain (pipelined send/recv chain), async (async broadcasts); the row reports the best.")
@click.option("--rounds", default=3, show_default=True, help="Rounds; systems interleaved in each; median and spread.")
@click.option("--quick", is_flag=True, help="N = 1,4,6, 32 MB in 16 tensors, gloo only, one round.")
@click.option("--loopback", is_flag=True, help="Loopback processes even when namespaces are available.")
@click.option("--json", "as_json", is_flag=True)
def bench_burst(ns: str, size_mb: float, tensors: int, rate: str, peers: str, gloo_forms: str, rounds: int, quick: bool,
                loopback: bool, as_json: bool) -> None:
    """One publisher, N receivers replicating at once over shaped links: pipeline vs not, gloo, Ray."""
    from .net import burst

    if quick:
        # 16 tensors: half of 32 would not fit 32 MB at >= 2 MB each (data.shard_sizes)
        ns, size_mb, tensors, peers, rounds = "1,4,6", 32.0, 16, "gloo", 1
    res = burst([int(x) for x in ns.split(",")], size_mb, tensors, rate,
                tuple(p for p in peers.split(",") if p), loopback, rounds=rounds,
                gloo_forms=tuple(f for f in gloo_forms.split(",") if f))
    if as_json:
        click.echo(json.dumps(res, indent=2))
        return
    for k, v in res.items():
        if k != "rows":
            click.echo(f"{k:>24}: {v}")
    for row in res["rows"]:
        click.echo("  " + "  ".join(f"{k}={v}" for k, v in row.items() if k != "pipeline_receivers"))


@bench.command("failover")
@click.option("--size-mb", default=64.0, show_default=True)
@click.option("--tensors", default=32, show_default=True)
@click.option("--rate", default="500mbit", show_default=True, help="Link rate (namespaces, as root).")
@click.option("--kill-at", default=0.5, show_default=True, help="Fail A at this fraction of one transfer time.")
@click.option("--failures", default="kill,stop,cut", show_default=True,
              help="How A fails: kill (SIGKILL), stop (SIGSTOP: silent), cut (its link drops every packet: silent).")
@click.option("--rounds", default=3, show_default=True, help="Rounds (cases interleaved); median and spread.")
@click.option("--quick", is_flag=True, help="32 MB in 16 tensors, one round.")
@click.option("--loopback", is_flag=True, help="Loopback with an emulated NIC cap on A (the old benchmark; SIGKILL only).")
@click.option("--cap-mbps", default=100.0, show_default=True, help="Loopback only: A's emulated cap (MB/s).")
@click.option("--json", "as_json", is_flag=True)
def bench_failover(size_mb: float, tensors: int, rate: str, kill_at: float, failures: str, rounds: int, quick: bool,
                   loopback: bool, cap_mbps: float, as_json: bool) -> None:
    """publisher -> A -> B; A fails mid-transfer (SIGKILL, SIGSTOP, link cut); B's time vs no failure."""
    from ..testbed import Fabric

    if quick:
        size_mb, tensors, rounds = 32.0, 16, 1
    ok, why = Fabric.available()
    if loopback or not ok:
        from .data import failover

        res = failover(size_mb, cap_mbps, kill_at)
        res["note"] = "loopback (" + ("requested" if loopback else why) + "): A's NIC emulated by a reader-side cap"
        res["extra_s"] = round(res["with_failure"]["B_seconds"] - res["no_failure"]["B_seconds"], 3)
    else:
        from .net import failover as net_failover

        res = net_failover(size_mb, tensors, rate, kill_at, failures=tuple(f for f in failures.split(",") if f),
                           rounds=rounds)
    _emit(res, as_json)
