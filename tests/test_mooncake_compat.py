"""Mooncake's Python API on TENT, run as Mooncake runs its own suite: a real etcd, a target process
named 127.0.0.1:12345, an initiator process running a unittest suite, both importing
`mooncake.engine` (resolved to TENT's facade by compat/mooncake-shim on their PYTHONPATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from etcd_server import EtcdServer

ROOT = Path(__file__).resolve().parent.parent
SUITE = Path(__file__).resolve().parent / "mooncake_suite"
SHIM = ROOT / "compat" / "mooncake-shim"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    srv = EtcdServer()
    yield srv
    srv.stop()


def shim_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SHIM), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


class Target:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(SUITE / "target.py")], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        line: list[str] = []
        t = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        t.join(90)
        if not line or not line[0]:
            self.close()
            raise RuntimeError("target did not start")
        self.info = json.loads(line[0])
        if "error" in self.info:
            self.close()
            raise RuntimeError(f"target failed: {self.info['error']}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
                self.proc.wait(15)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait(10)


def run_initiator(env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SUITE / "initiator.py")], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_shim_is_off_unless_put_on_the_path() -> None:
    """Without the shim, `mooncake` is either absent or the real Mooncake: never us by accident."""
    out = subprocess.run(
        [sys.executable, "-c", "import importlib.util as u; s = u.find_spec('mooncake'); print(s.origin if s else None)"],
        capture_output=True, text=True, timeout=60,
    )
    assert str(SHIM) not in out.stdout
    out = subprocess.run(
        [sys.executable, "-c", "from mooncake.engine import TransferEngine as T; print(T.__module__)"],
        capture_output=True, text=True, timeout=60, env=shim_env(),
    )
    assert out.stdout.strip() == "tent_core.compat.mooncake", out.stderr


def test_mooncake_suite_over_etcd(etcd: EtcdServer) -> None:
    env = shim_env(
        MC_METADATA_SERVER=etcd.endpoint,  # bare host:port, as Mooncake's suite passes it (= etcd)
        TARGET_SERVER_NAME="127.0.0.1:12345",
        INITIATOR_SERVER_NAME="127.0.0.1:12347",
        PROTOCOL="tcp",
        CIRCLE="2000",
    )
    target = Target(env)
    try:
        assert target.info["ready"] == "127.0.0.1:12345"
        assert target.info["engine"] == "tent_core.compat.mooncake"
        res = run_initiator(env)
    finally:
        target.close()
    print(res.stdout[-3000:], res.stderr[-6000:])
    assert res.returncode == 0, res.stderr[-6000:]
    assert "2000 random write/read round trips verified" in res.stdout
    assert "OK" in res.stderr.splitlines()[-1]


def test_mooncake_suite_p2p_handshake() -> None:
    env = shim_env(MC_METADATA_SERVER="P2PHANDSHAKE", TARGET_SERVER_NAME="127.0.0.1", INITIATOR_SERVER_NAME="127.0.0.1",
                   PROTOCOL="rdma", CIRCLE="300")
    target = Target(env)
    try:
        env["TARGET_SERVER_NAME"] = target.info["ready"]  # host:<rpc port>, as Mooncake names P2P segments
        res = run_initiator(env)
    finally:
        target.close()
    assert res.returncode == 0, res.stderr[-6000:]
    assert "300 random write/read round trips verified" in res.stdout


def _real_mooncake_reason() -> str | None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        p = subprocess.run(
            [sys.executable, "-c", "from mooncake.engine import TransferEngine as T; print(T.__module__)"],
            capture_output=True, text=True, timeout=60, env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if p.returncode != 0:
        return "the real Mooncake is not installed (make bench-deps installs mooncake-transfer-engine-non-cuda)"
    if p.stdout.strip() != "mooncake.engine":
        return f"`mooncake` resolves to {p.stdout.strip()}, not the real Mooncake"
    return None


def test_same_suite_against_real_mooncake(etcd: EtcdServer) -> None:
    """The suite itself is checked against the engine it imitates (when that is installed)."""
    reason = _real_mooncake_reason()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MC_METADATA_SERVER=etcd.endpoint, TARGET_SERVER_NAME="127.0.0.1:12345", INITIATOR_SERVER_NAME="127.0.0.1:12347",
               PROTOCOL="tcp", CIRCLE="1000", MC_FORCE_TCP="1", MC_LOG_LEVEL="ERROR", GLOG_minloglevel="2")
    target = Target(env)
    try:
        assert target.info["engine"] == "mooncake.engine"
        res = run_initiator(env)
    finally:
        target.close()
    assert res.returncode == 0, res.stderr[-6000:]
    assert "1000 random write/read round trips verified" in res.stdout


def test_shim_distribution_builds(tmp_path: Path) -> None:
    """The opt-in distribution packages exactly the `mooncake` stand-in (built, not installed)."""
    import shutil
    import zipfile

    src = tmp_path / "src"  # build from a copy: setuptools writes build/ and egg-info next to the sources
    shutil.copytree(SHIM, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = tmp_path.glob("tent_mooncake_shim-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "mooncake/engine.py" in names and "mooncake/__init__.py" in names
    meta = next(n for n in names if n.endswith("METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "Name: tent-mooncake-shim" in text and "Requires-Dist: tent-core" in text
