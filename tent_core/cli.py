"""The `tent` command line: `tent plugins`, `tent new-plugin`, `tent doctor`, and the subcommands other
distributions contribute through the entry-point group ``tent_core.cli`` (``tent bench`` comes
from tent-bench)."""

from __future__ import annotations

import importlib.metadata as md
import json
import logging
import os
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

CLI_ENTRY_POINT_GROUP = "tent_core.cli"


def _out() -> Console:
    """Tables on stdout; a pipe or file gets a wide console instead of an 80-column squeeze."""
    con = Console()
    return con if con.is_terminal else Console(width=160)


class EntryPointGroup(click.Group):
    """A click group that also offers the commands other distributions register under an
    entry-point group (``name = "module:click_command"``). They load on first use; one that
    fails to load shows up as a command that explains why, instead of breaking the whole CLI."""

    def __init__(self, *args: Any, entry_point_group: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entry_point_group = entry_point_group

    def _contributed(self) -> dict[str, md.EntryPoint]:
        return {ep.name: ep for ep in md.entry_points(group=self.entry_point_group)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._contributed()))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            return cmd
        ep = self._contributed().get(cmd_name)
        if ep is None:
            return None
        dist = ep.dist.name if ep.dist else "?"
        try:
            cmd = ep.load()
        except Exception as exc:  # a broken contributor must not take the other commands down
            return _broken_command(cmd_name, f"{dist}: {ep.value} failed to load: {type(exc).__name__}: {exc}")
        if not isinstance(cmd, click.Command):
            return _broken_command(cmd_name, f"{dist}: {ep.value} is not a click command")
        return cmd


def _broken_command(name: str, reason: str) -> click.Command:
    def fail() -> None:
        raise click.ClickException(f"command {name!r} is unavailable: {reason}")

    return click.Command(name, callback=fail, help=f"(unavailable: {reason})")


@click.group(cls=EntryPointGroup, entry_point_group=CLI_ENTRY_POINT_GROUP)
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """TENT: a declarative transfer engine."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@main.command()
@click.option("--file", "path", default=None, type=click.Path(dir_okay=False),
              help="Write it to this file (mode 0600) instead of stdout.")
def token(path: str | None) -> None:
    """Make a new cluster auth token (256 random bits) for TENT_AUTH_TOKEN / auth_token_file."""
    from .auth import new_token

    tok = new_token()
    if path is None:
        click.echo(tok)
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(tok + "\n")
    click.echo(f"wrote a new token to {path}; set TENT_AUTH_TOKEN_FILE={path} (and REFHUB_AUTH_TOKEN_FILE) on every node")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """Installed transports: version, availability (with the reason when unavailable)."""
    from .plugin_manager import discover, instantiate

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
                "config_keys": dict(transport.config_keys) if transport is not None else {},
            }
        )
    for b in ps.registry.broken:
        rows.append(
            {"name": b.name, "distribution": b.distribution, "version": "", "abi_version": None, "status": "broken",
             "reason": b.reason, "config_keys": {}}
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
    _out().print(table)



@main.command()
@click.argument("remote")
@click.option("--op", type=click.Choice(["read", "write"], case_sensitive=False), default="write", show_default=True,
              help="READ (remote -> local) or WRITE (local -> remote).")
@click.option("--local-kind", type=click.Choice(["host", "cuda", "npu", "sim"]), default="host", show_default=True,
              help="Memory kind of the local buffer.")
@click.option("--offset", "remote_offset", type=int, default=0, show_default=True, help="Offset in the remote segment.")
@click.option("--length", type=int, default=None, help="Bytes (default: to the end of the remote buffer).")
@click.option("--transports", default=None, help="Comma-separated transports this engine starts (default: all).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Engine config (TOML).")
@click.option("--simdev", is_flag=True, help="Add the simulated device transport (tests).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def explain(remote: str, op: str, local_kind: str, remote_offset: int, length: int | None, transports: str | None,
            config_path: str | None, simdev: bool, as_json: bool) -> None:
    """Which path a transfer to REMOTE (host:port/segment) would take, and the alternatives, priced.

    Starts an engine here, reads the peer's description and asks the planner; nothing moves."""
    from .engine import Engine
    from .errors import TentError

    plugins = None
    if simdev:
        from .simdev import SimDevicePlugin

        plugins = [SimDevicePlugin()]
    try:
        with Engine(config_path, transports=transports.split(",") if transports else None, plugins=plugins) as eng:
            ex = eng.explain(op=op.upper(), local_kind=local_kind, remote=remote, remote_offset=remote_offset,
                             length=length)
    except (TentError, ValueError) as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
    click.echo(json.dumps(ex.as_dict(), indent=2) if as_json else str(ex))


@main.command("new-plugin")
@click.argument("name")
@click.argument("directory", type=click.Path(file_okay=False))
def new_plugin(name: str, directory: str) -> None:
    """Write a transport plugin skeleton NAME into DIRECTORY (a working same-host transport:
    build it with `pip install DIRECTORY`, check it with `python -m tent_core.conformance NAME`)."""
    from .plugin_template import render

    try:
        files = render(name, directory)
    except (ValueError, FileExistsError) as exc:
        raise click.ClickException(str(exc)) from exc
    for f in files:
        click.echo(f"  {f}")
    click.echo(f"plugin {name!r} written to {directory}: pip install {directory} && python -m tent_core.conformance {name}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(as_json: bool) -> None:
    """What this host offers TENT (transports, NICs, RDMA, GPUs, limits) and what to fix."""
    from .doctor import render, report

    rep = report()
    if as_json:
        click.echo(json.dumps(rep.as_dict(), indent=2))
        return
    render(rep, _out())


if __name__ == "__main__":
    main()
