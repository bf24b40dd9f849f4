"""Command line: ``refhub serve``, ``refhub status``, and the subcommands other distributions
contribute through the entry-point group ``refhub.cli`` (``refhub bench ...`` comes from tent-bench)."""

from __future__ import annotations

import json
import logging

import click

from tent_core.cli import EntryPointGroup

CLI_ENTRY_POINT_GROUP = "refhub.cli"


@click.group(cls=EntryPointGroup, entry_point_group=CLI_ENTRY_POINT_GROUP)
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
@click.option("--metrics-port", default=0, show_default=True, help="Serve Prometheus /metrics on 127.0.0.1:PORT (0: off).")
def serve(bind: str, hb_timeout: float, barrier_timeout: float, pipeline: bool, auth_token_file: str,
          auth_token: str, require_auth: str | None, metrics_port: int) -> None:
    """Run a reference server (primary or backup: they are the same program)."""
    from tent_core.auth import AuthError

    from .server import serve as _serve
    from .server import server_auth

    try:
        auth = server_auth(bind, auth_token, auth_token_file, require_auth)
    except AuthError as exc:
        raise click.ClickException(str(exc)) from None
    _serve(bind, hb_timeout=hb_timeout, barrier_timeout=barrier_timeout, pipeline=pipeline, auth=auth,
           metrics_port=metrics_port)


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


if __name__ == "__main__":
    main()
