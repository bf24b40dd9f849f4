"""Command line: ``refhub serve``, ``refhub status``, ``refhub bench ...``."""

from __future__ import annotations

import json
import logging

import click


@click.group()
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """refhub: Reference-Oriented Storage for model weights."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


@main.command()
@click.option("--bind", default="tcp://127.0.0.1:5555", show_default=True, help="ZeroMQ endpoint to bind.")
@click.option("--hb-timeout", default=5.0, show_default=True, help="Seconds of silence before a client is failed.")
@click.option("--barrier-timeout", default=30.0, show_default=True, help="Per-replica barrier timeout (s).")
@click.option("--pipeline/--no-pipeline", default=True, show_default=True,
              help="Pipeline replication (partially received replicas serve others).")
@click.option("--auth-token-file", default="", envvar="REFHUB_AUTH_TOKEN_FILE",
              help="File holding the cluster auth token (else $REFHUB_AUTH_TOKEN or $TENT_AUTH_TOKEN[_FILE]).")
@click.option("--auth-token", default="", help="The cluster auth token itself (visible in `ps`: prefer the file).")
@click.option("--require-auth", type=click.Choice(["non_loopback", "always", "never"]), default=None,
              help="When a token is mandatory [default: non_loopback, i.e. as soon as --bind is not loopback].")
def serve(bind: str, hb_timeout: float, barrier_timeout: float, pipeline: bool, auth_token_file: str,
          auth_token: str, require_auth: str | None) -> None:
    """Run a reference server (primary or backup: they are the same program)."""
    from tent_core.auth import AuthError

    from .server import serve as _serve
    from .server import server_auth

    try:
        auth = server_auth(bind, auth_token, auth_token_file, require_auth)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    _serve(bind, hb_timeout=hb_timeout, barrier_timeout=barrier_timeout, pipeline=pipeline, auth=auth)


@main.command()
@click.option("--server", default="tcp://127.0.0.1:5555", show_default=True)
@click.option("--model", default=None, help="Also list this model's versions and replicas.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.option("--timeout", default=2.0, show_default=True)
def status(server: str, model: str | None, as_json: bool, timeout: float) -> None:
    """Query a server's counters (and a model's versions)."""
    from .client import query

    out = {"stats": query(server, {"op": "stats"}, timeout=timeout)}
    if model:
        out["model"] = query(server, {"op": "list", "model": model}, timeout=timeout)
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    st = out["stats"]
    console.print(f"[bold]refhub server[/bold] {server}  epoch={st.get('epoch')} handles={st.get('handles')} "
                  f"ops={st.get('ops')} errors={st.get('errors')} failures={st.get('failures')}")
    if model:
        m = out["model"]
        t = Table(title=f"model {model} (latest={m.get('latest')}, retained={m.get('retained')})")
        for col in ("version", "complete replicas", "receiving shards", "available"):
            t.add_column(col)
        for v, d in sorted(m.get("versions", {}).items()):
            t.add_row(str(v), str(d["replicas"]), str(d["receiving_shards"]), str(d["available"]))
        console.print(t)


@main.group()
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
    from .bench_server import run

    _emit(run(clients=clients, procs=procs, sockets=sockets, shards=shards, duration=duration, batch=batch), as_json)


@bench.command("dataplane")
@click.option("--size-mb", default=1024.0, show_default=True, help="Shard size.")
@click.option("--tensors", default=500, show_default=True, help="Tensors in the shard (half of them tiny, packed).")
@click.option("--repeat", default=5, show_default=True)
@click.option("--transport", default=None, help="Restrict both engines to one transport (e.g. tcp); default: engine's choice.")
@click.option("--json", "as_json", is_flag=True)
def bench_dataplane(size_mb: float, tensors: int, repeat: int, transport: str | None, as_json: bool) -> None:
    """One publisher, one reader: verified replicate GB/s vs raw tent_core READs of the same bytes."""
    from .bench_data import dataplane

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
    from .bench_net import burst

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
    from tent_core.testbed import Fabric

    ok, why = Fabric.available()
    if loopback or not ok:
        from .bench_data import failover

        res = failover(size_mb, cap_mbps, kill_at)
        res["note"] = "loopback (" + ("requested" if loopback else why) + "): A's NIC emulated by a reader-side cap"
        res["extra_s"] = round(res["with_failure"]["B_seconds"] - res["no_failure"]["B_seconds"], 3)
    else:
        from .bench_net import failover as net_failover

        res = net_failover(size_mb, tensors, rate, kill_at)
    _emit(res, as_json)


if __name__ == "__main__":
    main()
