"""`tent new-plugin NAME DIR`: the skeleton builds, installs, is listed by `tent plugins`, passes
the conformance kit and its own tests; removed again, it is gone from `tent plugins`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tent_core.plugin_template import check_name

pytestmark = pytest.mark.slow


def _run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]


def _plugins(env: dict[str, str], cwd: Path) -> dict[str, dict[str, object]]:
    out = _run([sys.executable, "-m", "tent_core.cli", "plugins", "--json"], env=env, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return {r["name"]: r for r in json.loads(out.stdout)}


def test_generated_plugin_builds_installs_and_conforms(tmp_path: Path) -> None:
    name, src, site = "skel_cma", tmp_path / "tent-skel-cma", tmp_path / "site"
    out = _run([sys.executable, "-m", "tent_core.cli", "new-plugin", name, str(src)])
    assert out.returncode == 0, out.stderr
    assert (src / "csrc" / f"{name}_executor.c").is_file() and (src / "tent_skel_cma" / "transport.py").is_file()
    if shutil.which("ruff") or (Path(sys.executable).parent / "ruff").exists():
        ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
        lint = _run([ruff, "check", "--no-cache", "--config", str(Path(__file__).parents[1] / "pyproject.toml"), str(src)])
        assert lint.returncode == 0, lint.stdout
    # build and install it (into its own folder: this venv stays as it was)
    out = _run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", "--target",
                str(site), str(src)], cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert list((site / "tent_skel_cma").glob("_executor*.so"))
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    row = _plugins(env, tmp_path)[name]
    assert row["status"] == "available" and row["distribution"] == "tent-skel-cma", row
    kit = _run([sys.executable, "-m", "tent_core.conformance", name, "--json"], env=env, cwd=tmp_path)
    report = json.loads(kit.stdout)
    failed = [f"{c['name']}: {c['detail']}" for c in report["checks"] if c["status"] == "failed"]
    assert kit.returncode == 0 and not failed, failed
    passed = {c["name"] for c in report["checks"] if c["status"] == "passed"}
    assert {"read_write_exact", "bounds", "permission", "concurrent", "exactly_once_on_close"} <= passed, report
    # its own tests, run from outside its source folder (whose package has no compiled executor)
    own = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(src), str(src / "tests")],
               env=env, cwd=tmp_path)  # fmt: skip
    assert own.returncode == 0 and "3 passed" in own.stdout, own.stdout + own.stderr
    shutil.rmtree(site)  # uninstalled: gone from discovery
    assert name not in _plugins(env, tmp_path)


def test_bad_names_and_occupied_directories(tmp_path: Path) -> None:
    for bad in ("Tcp", "9lives", "with-dash", "class", "x" * 40, "trailing_"):
        with pytest.raises(ValueError):
            check_name(bad)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    out = _run([sys.executable, "-m", "tent_core.cli", "new-plugin", "fine", str(tmp_path / "full")])
    assert out.returncode != 0 and "not an empty directory" in out.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    out = _run([sys.executable, "-m", "tent_core.cli", "new-plugin", "Bad-Name", str(tmp_path / "new")])
    assert out.returncode != 0 and "lowercase identifier" in out.stderr and not (tmp_path / "new").exists()
