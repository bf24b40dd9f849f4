"""The `tent` command line, run as a user would (separate processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def tent(*args: str, timeout: float = 240, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tent_core.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)  # fmt: skip


def _plugin_rows(table: str) -> dict[str, list[str]]:
    """name -> [distribution, version, status, reason (first line)] from the `tent plugins` table."""
    rows = {}
    for ln in table.splitlines():
        cells = [c.strip() for c in ln.strip().strip("│").split("│")]
        if len(cells) == 5 and cells[0] and cells[0] != "name":
            rows[cells[0]] = cells[1:]
    return rows


def test_plugins_table():
    from importlib.metadata import version

    from tent_core.plugin_manager import discover, instantiate

    out = tent("plugins")
    assert out.returncode == 0, out.stderr
    rows = _plugin_rows(out.stdout)
    # one row per installed transport, each with its distribution, version and the probe's verdict
    entries = discover().registry.entries
    assert set(rows) == set(entries), (rows, sorted(entries))
    assert rows["tcp"][:3] == ["tent-tcp", version("tent-tcp"), "available"]
    for name, (_, _, status, reason) in rows.items():
        avail = instantiate(entries[name])[1]
        assert status == ("available" if avail.available else "unavailable"), (name, status)
        assert avail.available or reason, f"{name} is unavailable without a reason"


def _contributor(tmp_path: Path, name: str, target: str, module: str = "") -> dict[str, str]:
    """A distribution on PYTHONPATH that contributes `tent NAME` through the entry-point group."""
    dist = tmp_path / "tent_extra-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tent-extra\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[tent_core.cli]\n{name} = {target}\n")
    if module:
        (tmp_path / "tent_extra_cli.py").write_text(module)
    return dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def test_subcommands_come_from_entry_points(tmp_path):
    env = _contributor(tmp_path, "hello", "tent_extra_cli:hello", (
        "import click\n\n@click.command()\n@click.argument('who')\n"
        "def hello(who):\n    'Say hello.'\n    click.echo(f'hello {who}')\n"))  # fmt: skip
    helptext = tent("--help", env=env)
    assert helptext.returncode == 0 and "hello" in helptext.stdout and "bench" in helptext.stdout
    out = tent("hello", "world", env=env)
    assert out.returncode == 0 and out.stdout.strip() == "hello world"


def test_a_broken_contributor_breaks_only_its_command(tmp_path):
    env = _contributor(tmp_path, "broken", "no_such_module_here:cmd")
    helptext = tent("--help", env=env)
    assert helptext.returncode == 0 and "broken" in helptext.stdout and "unavailable" in helptext.stdout
    out = tent("broken", env=env)
    assert out.returncode != 0 and "tent-extra" in out.stderr and "ModuleNotFoundError" in out.stderr
    assert tent("plugins", env=env).returncode == 0
