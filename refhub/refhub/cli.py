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
def serve(bind: str, hb_timeout: float, barrier_timeout: float) -> None:
    """Run a reference server (primary or backup: they are the same program)."""
    from .server import serve as _serve

    _serve(bind, hb_timeout=hb_timeout, barrier_timeout=barrier_timeout)


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
@click.option("--size-mb", default=256.0, show_default=True)
@click.option("--repeat", default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_dataplane(size_mb: float, repeat: int, as_json: bool) -> None:
    """One publisher, one reader: replicate GB/s vs a raw tent_core READ."""
    from .bench_data import dataplane

    _emit(dataplane(size_mb, repeat), as_json)


@bench.command("burst")
@click.option("--k", "ks", default="1,2,4", show_default=True, help="Reader counts.")
@click.option("--size-mb", default=64.0, show_default=True)
@click.option("--cap-mbps", default=200.0, show_default=True, help="Emulated per-reader NIC cap (MB/s).")
@click.option("--json", "as_json", is_flag=True)
def bench_burst(ks: str, size_mb: float, cap_mbps: float, as_json: bool) -> None:
    """K readers at once, with and without pipeline replication."""
    from .bench_data import burst

    _emit(burst(tuple(int(x) for x in ks.split(",")), size_mb, cap_mbps), as_json)


@bench.command("failover")
@click.option("--size-mb", default=64.0, show_default=True)
@click.option("--cap-mbps", default=100.0, show_default=True)
@click.option("--kill-at", default=0.5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_failover(size_mb: float, cap_mbps: float, kill_at: float, as_json: bool) -> None:
    """trainer -> A -> B; SIGKILL A mid-transfer; B's completion time vs no failure."""
    from .bench_data import failover

    _emit(failover(size_mb, cap_mbps, kill_at), as_json)


if __name__ == "__main__":
    main()
