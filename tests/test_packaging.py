"""Packaging: the tent-core wheel ships the plugin SDK (headers, build helper), and every plugin's
sdist builds and installs from a folder outside this repository, with no network.

How: tent-core's sources are copied out of the repo and built into a wheel. A fresh venv gets
that wheel (not the repo's editable install) plus setuptools, and nothing else: no numpy, no
pyzmq. Each plugin's folder is copied out too, turned into an sdist by that venv, and pip
installs the sdist there without build isolation while checking its declared build
requirements (``--check-build-dependencies``). So a plugin builds only if its sdist carries
all its sources, its setup.py needs nothing but ``tent_core.build`` from the installed wheel
(headers included), and it declares what it needs. Finally the installed plugins are loaded
from that venv and listed by ``tent plugins``.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = sorted(p.parent for p in (ROOT / "plugins").glob("*/pyproject.toml"))
BUILD_ARTIFACTS = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info", "build", ".pytest_cache")
HEADERS = sorted(p.name for p in (ROOT / "tent_core" / "include" / "tent").glob("*.h"))

pytestmark = pytest.mark.slow


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args])


def _site_packages(venv: Path) -> Path:
    return Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))


def _link_distribution(name: str, into: Path) -> None:
    """Make the installed distribution `name` importable from `into` (symlinks, no copy)."""
    dist = md.distribution(name)
    top = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    for entry in sorted(top):
        if entry.endswith(".pth"):
            continue
        src = Path(str(dist.locate_file(entry)))
        if src.exists() and not (into / entry).exists():
            (into / entry).symlink_to(src)


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("outside-repo")
    assert ROOT not in tmp.parents
    # tent-core: its sources, copied out of the repo, built into a wheel
    src = tmp / "src" / "tent-core"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "tent_core", src / "tent_core", ignore=BUILD_ARTIFACTS)
    wheels = tmp / "wheels"
    _pip("wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(wheels), str(src))
    (wheel,) = wheels.glob("tent_core-*.whl")
    # a venv with that wheel and setuptools only
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    tools = tmp / "buildtools"
    tools.mkdir()
    _link_distribution("setuptools", tools)
    site = _site_packages(venv)
    (site / "buildtools.pth").write_text(f"{tools}\n")
    py = venv / "bin" / "python"
    _pip("--python", str(py), "install", "--no-index", "--no-deps", str(wheel))
    return {"tmp": tmp, "wheel": wheel, "venv": venv, "py": py, "site": site}


def test_core_wheel_ships_the_plugin_sdk(outside: dict[str, Path]) -> None:
    names = set(zipfile.ZipFile(outside["wheel"]).namelist())
    assert HEADERS and "executor_abi.h" in HEADERS
    for h in HEADERS:
        assert f"tent_core/include/tent/{h}" in names
    assert "tent_core/build.py" in names and "tent_core/py.typed" in names
    assert "tent_core/templates/plugin/csrc/executor.c.tmpl" in names  # `tent new-plugin` works from the wheel
    assert "tent_core/conformance/__main__.py" in names
    assert not [n for n in names if n.endswith(".c")], "C sources do not belong in the wheel"


def test_build_helper_imports_without_the_runtime(outside: dict[str, Path]) -> None:
    """The build environment has no numpy/pyzmq: tent_core.build must not need them."""
    probe = (
        "import sys, tent_core.build as b; import os; "
        "assert os.path.isfile(os.path.join(b.get_include(), 'tent', 'executor_abi.h')); "
        "print(sorted(m for m in ('numpy', 'zmq', 'msgpack', 'tent_core._native') if m in sys.modules)); "
        "print(b.__file__)"
    )
    out = _run([str(outside["py"]), "-c", probe], cwd=outside["tmp"]).stdout.split("\n")
    assert out[0] == "[]"
    assert Path(out[1]).is_relative_to(outside["site"])


@pytest.mark.parametrize("plugin", PLUGINS, ids=[p.name for p in PLUGINS])
def test_plugin_sdist_builds_outside_the_repo(outside: dict[str, Path], plugin: Path) -> None:
    meta = tomllib.loads((plugin / "pyproject.toml").read_text())
    requires = " ".join(meta["build-system"]["requires"])
    assert "tent-core" in requires, f"{plugin.name}: tent-core missing from [build-system] requires"
    assert isinstance(meta["project"]["license"], str), "SPDX license string"
    src = outside["tmp"] / "src" / plugin.name
    shutil.copytree(plugin, src, ignore=BUILD_ARTIFACTS)
    sdists = outside["tmp"] / "sdists"
    script = f"from setuptools import build_meta as b; print(b.build_sdist({str(sdists)!r}))"
    name = _run([str(outside["py"]), "-c", script], cwd=src).stdout.strip().splitlines()[-1]
    sdist = sdists / name
    shutil.rmtree(src)  # nothing may reach back into the copied folder either
    _pip("--python", str(outside["py"]), "install", "--no-index", "--no-deps", "--no-build-isolation",
         "--check-build-dependencies", str(sdist))  # fmt: skip
    package = meta["tool"]["setuptools"]["packages"][0]
    installed = outside["site"] / package
    assert list(installed.glob("_executor*.so")), f"{package}: no compiled executor installed"
    # load it from there (numpy & co. from this venv), and list it with `tent plugins`
    env = dict(os.environ, PYTHONPATH=str(outside["site"]))
    where = _run([sys.executable, "-c", f"import tent_core, {package}; print(tent_core.__file__); print({package}.__file__)"],
                 env=env, cwd=outside["tmp"]).stdout.split()  # fmt: skip
    assert all(Path(p).is_relative_to(outside["site"]) for p in where), where
    rows = json.loads(_run([sys.executable, "-m", "tent_core.cli", "plugins", "--json"], env=env, cwd=outside["tmp"]).stdout)
    (entry_point,) = meta["project"]["entry-points"]["tent_core.transports"]
    row = next(r for r in rows if r["name"] == entry_point)
    assert row["status"] in ("available", "unavailable"), row  # loaded and probed, not broken
