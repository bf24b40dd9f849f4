"""Plugin discovery: entry points, broken plugins, ABI checks, `tent plugins`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tent_core.errors import PluginABIError
from tent_core.executor import ExecutorLibrary
from tent_core.plugin_manager import discover


def _fake_dist(root: Path, dist: str, ep_name: str, module: str, source: str) -> None:
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[tent_core.transports]\n{ep_name} = {module}\n")


@pytest.fixture
def broken_plugins(tmp_path: Path) -> Path:
    _fake_dist(tmp_path, "tent-broken", "broken", "tent_broken_mod", "raise ImportError('libfabric.so.1: cannot open shared object file')\n")
    _fake_dist(
        tmp_path,
        "tent-oldabi",
        "oldabi",
        "tent_oldabi_mod",
        """
        from tent_core.plugin_spec import hookimpl

        @hookimpl
        def tent_register_transports(registry):
            registry.add("oldabi", object, abi_version=999, version="0.1")
        """,
    )
    return tmp_path


def _env(extra: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{extra}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def test_tent_plugins_lists_broken_and_available(broken_plugins: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tent_core.cli", "plugins", "--json"],
        env=_env(broken_plugins), capture_output=True, text=True, timeout=60, check=True,
    )
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["tcp"]["status"] == "available" and rows["tcp"]["distribution"] == "tent-tcp"
    assert rows["shm"]["status"] == "available"
    assert rows["broken"]["status"] == "broken" and "libfabric" in rows["broken"]["reason"]
    assert rows["oldabi"]["status"] == "broken" and "ABI" in rows["oldabi"]["reason"]


def test_engine_still_works_with_a_broken_plugin_installed(broken_plugins: Path) -> None:
    code = textwrap.dedent(
        """
        import numpy as np
        from tent_core import Engine
        with Engine() as a, Engine(transports=["tcp"]) as b:
            src = a.allocate(1 << 20, segment="s"); src.array[:] = 7
            dst = b.allocate(1 << 20)
            b.read(dst, a.segment_name("s"))
            assert (dst.array == 7).all()
            print(sorted(b.transports), [x.name for x in b.plugins.registry.broken])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], env=_env(broken_plugins), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "['tcp']" in out.stdout and "broken" in out.stdout and "oldabi" in out.stdout


def test_disabled_plugins_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENT_DISABLED_PLUGINS", "shm")
    assert "shm" not in discover().registry.entries
    monkeypatch.delenv("TENT_DISABLED_PLUGINS")
    monkeypatch.setenv("TENT_PLUGINS", "shm")
    assert set(discover().registry.entries) == {"shm"}


def test_executor_abi_is_checked(tmp_path: Path) -> None:
    src = tmp_path / "bad.c"
    src.write_text(
        '#include "tent/executor_abi.h"\n'
        "static tent_executor_ops_t ops = {TENT_EXECUTOR_ABI_VERSION + 1, sizeof(tent_executor_ops_t), \"bad\", 0, 0, 0};\n"
        "const tent_executor_ops_t *tent_executor_ops(void) { return &ops; }\n"
    )
    from tent_core.executor import get_include

    lib = tmp_path / "libbad.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-I", get_include(), str(src), "-o", str(lib)], check=True)
    with pytest.raises(PluginABIError, match="ABI version"):
        ExecutorLibrary(str(lib))
    nosym = tmp_path / "libnosym.so"
    (tmp_path / "n.c").write_text("int x;\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "n.c"), "-o", str(nosym)], check=True)
    with pytest.raises(PluginABIError, match="no tent_executor_ops"):
        ExecutorLibrary(str(nosym))
