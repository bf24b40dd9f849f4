"""Connections to a loopback peer take the congestion control of `loopback_congestion` (the first
name the kernel accepts; "" = the host's), on both sides; the bytes of a batch of small READs and
WRITEs over them are unchanged. The congestion control of each socket is read from the kernel
(`ss -ti`), not from the executor. Connections to other peers keep the host's choice: that is
checked in a network namespace of our own, between two addresses of 198.18.0.0/15 on its
loopback device (not 127/8)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from tcp_helpers import engine_pair

from tent_core import READ, WRITE, Request
from tent_core.engine import Engine
from tent_core.testing import pattern

KiB = 1024
N, BLOCK = 16, 64 * KiB

pytestmark = pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")


def _host_cc() -> str:
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


def _accepted(name: str) -> bool:
    """Whether the kernel lets this process give a socket congestion control `name`."""
    with socket.socket() as s:
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
        except OSError:
            return False
        return True


def _ccs(port: int) -> list[str]:
    """The congestion control of every established socket with `port` at either end (both sides
    of each connection), as the kernel reports it."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} or dport = :{port} )"],
                         capture_output=True, text=True, timeout=10, check=True).stdout  # fmt: skip
    lines = [ln for ln in out.splitlines() if ln.strip()]
    # one line per socket (addresses), then its info line (starting with the congestion control)
    return [info.split()[0] for info in lines[1::2]]


def _move_bytes(a: Engine, b: Engine, seed: int) -> None:
    """A batch of 16 x 64 KiB WRITEs, then READs of it back, from b to a's buffer; bytes checked."""
    n = N * BLOCK
    remote = a.allocate(n, segment="cc")
    remote.array[:] = 0
    local = b.allocate(n, segment="cc-local")
    local.array[:] = pattern(n, seed)
    seg = a.segment_name("cc")
    b.submit([Request(WRITE, local, i * BLOCK, seg, i * BLOCK, BLOCK) for i in range(N)], deadline=30).wait(30)
    assert bytes(remote.array) == bytes(local.array)
    remote.array[:] = pattern(n, seed + 1)
    b.submit([Request(READ, local, i * BLOCK, seg, i * BLOCK, BLOCK) for i in range(N)], deadline=30).wait(30)
    assert bytes(local.array) == bytes(remote.array)


def _port(e: Engine) -> int:
    return int(e.transports["tcp"].local_descriptor()["rails"][0]["port"])


@pytest.fixture
def pair_default(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine]]:
    yield from engine_pair(monkeypatch)


def test_loopback_connections_take_the_first_accepted_name_by_default(pair_default: tuple[Engine, Engine]) -> None:
    a, b = pair_default
    _move_bytes(a, b, 71)
    want = "cubic" if _accepted("cubic") else "reno"
    got = _ccs(_port(a))
    assert len(got) >= 2, got  # both sides of at least one connection
    assert set(got) == {want}


@pytest.mark.parametrize("knob, want", [("reno", "reno"), ("nosuchcc,reno", "reno"), ("", None)])
def test_loopback_congestion_names_and_off(monkeypatch: pytest.MonkeyPatch, knob: str, want: str | None) -> None:
    """A name the kernel does not know is skipped; "" leaves the host's congestion control."""
    for a, b in engine_pair(monkeypatch, loopback_congestion=knob):
        _move_bytes(a, b, 72)
        got = _ccs(_port(a))
        assert len(got) >= 2, got
        assert set(got) == {want or _host_cc()}


@pytest.mark.parametrize("bad", ["Bad!", "reno,", "a,b,c,d,e", "x" * 16])
def test_malformed_loopback_congestion_is_refused_at_start(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    """The transport does not start, and says which knob was wrong."""
    monkeypatch.setenv("TENT_PLUGINS", "tcp")
    with Engine({"transports": {"tcp": {"loopback_congestion": bad}}}) as e:
        assert "tcp" not in e.transports
        reason = e.availability["tcp"].reason
        assert "loopback_congestion" in reason and repr(bad) in reason


# --- a peer that is not loopback: in a network namespace of our own -----------------------------

_NETNS_SCRIPT = r"""
import json, subprocess, sys
sys.path.insert(0, sys.argv[1])
from test_tcp_loopback_cc import _ccs, _host_cc, _move_bytes, _port
from tent_core.engine import Engine
cfg = lambda ip: {"transports": {"tcp": {"rails": ip, "loopback_congestion": "reno"}}}
with Engine(cfg("198.18.0.1")) as a, Engine(cfg("198.18.0.2")) as b:
    _move_bytes(a, b, 73)
    print(json.dumps({"ccs": _ccs(_port(a)), "default": _host_cc()}))
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns() -> Iterator[str]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and ip (iproute2) for a network namespace")
    name = f"tentcc-{uuid.uuid4().hex[:8]}"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace: {exc.stderr!r}")
    try:
        _ip("-n", name, "link", "set", "lo", "up")
        for ip in ("198.18.0.1/32", "198.18.0.2/32"):
            _ip("-n", name, "addr", "add", ip, "dev", "lo")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


def test_other_peers_keep_the_hosts_congestion_control(netns: str) -> None:
    env: dict[str, Any] = {**os.environ, "TENT_PLUGINS": "tcp", "TENT_AUTH_TOKEN": "cc-test-token-" + "x" * 32}
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", _NETNS_SCRIPT, here],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["default"] == "reno":
        pytest.skip("the namespace's default congestion control is reno, the knob's: nothing to tell apart")
    assert len(res["ccs"]) >= 2, res
    assert set(res["ccs"]) == {res["default"]}  # the namespace's own default (a per-namespace sysctl)
