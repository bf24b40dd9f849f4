"""tools/lo_big_tcp.py: a throwaway namespace whose loopback takes big skbs, removed afterwards."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "lo_big_tcp.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and ip")
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=60)


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout


@pytest.mark.parametrize("size", [524280, 0])
def test_runs_the_command_with_lo_up_and_its_gso_limit(size: int) -> None:
    name = f"tentbigtest{os.getpid()}"
    out = _run("--size", str(size), "--name", name, "--", "ip", "-d", "link", "show", "lo")
    if out.returncode and "gso_ipv4_max_size" in out.stderr:
        pytest.skip(f"kernel without BIG TCP for IPv4: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert "state UNKNOWN" in out.stdout or ",UP" in out.stdout
    assert f"gso_max_size {size or 65536}" in out.stdout
    assert name not in _namespaces()


def test_the_command_s_exit_status_comes_back_and_the_namespace_goes() -> None:
    name = f"tentbigfail{os.getpid()}"
    out = _run("--name", name, "--", "sh", "-c", "exit 3")
    assert out.returncode == 3
    assert name not in _namespaces()
