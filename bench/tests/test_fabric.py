"""The multi-rail namespace fabric moves real bytes, shapes exactly, and fails like a dead link."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from tent_bench.testbed import Fabric, cleanup_stale, default_prefix, format_rate, parse_fabric_spec, parse_rate
from tent_bench.testbed.fabric import list_namespaces

PORT = 5299

# Accepts on every address; per connection, reads to EOF and prints one JSON line.
SERVER = textwrap.dedent(
    """
    import json, socket, sys, threading, time
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", int(sys.argv[1]))); srv.listen(64)
    print(json.dumps({"ready": True}), flush=True)
    lock = threading.Lock()
    def serve(c):
        n = 0; t0 = t1 = None
        c.settimeout(20)
        try:
            while True:
                b = c.recv(1 << 20)
                if not b: break
                t1 = time.monotonic(); t0 = t0 or t1; n += len(b)
        except OSError as e:
            pass
        with lock:
            print(json.dumps({"local": c.getsockname()[0], "bytes": n, "t0": t0, "t1": t1}), flush=True)
        c.close()
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
    """
)

# Connects to argv[1] (timeout argv[3]), sends for argv[2] seconds, prints a JSON line.
CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    addr, dur, tmo = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
    t = time.monotonic()
    try:
        s = socket.create_connection((addr, int(sys.argv[4])), timeout=tmo)
    except OSError as e:
        print(json.dumps({"error": type(e).__name__, "after": time.monotonic() - t})); sys.exit(0)
    buf = b"x" * (256 << 10); sent = 0; end = time.monotonic() + dur
    try:
        while time.monotonic() < end:
            sent += s.send(buf)
    except OSError as e:
        print(json.dumps({"error": type(e).__name__, "sent": sent})); sys.exit(0)
    s.close()
    print(json.dumps({"sent": sent}))
    """
)

pytestmark = pytest.mark.netns


def _require_fabric() -> None:
    ok, why = Fabric.available()
    if not ok:
        pytest.skip(f"fabric unavailable: {why}")


def test_parse_rates_and_specs():
    assert parse_rate("1gbit") == 10**9 and parse_rate("500mbit") == 5 * 10**8
    assert parse_rate("2.5Gbit") == 25 * 10**8 and parse_rate(1e9) == 10**9
    assert parse_rate("10mbps") == 8 * 10**7  # tc: bps = bytes/s
    assert format_rate(2 * 10**9) == "2gbit" and format_rate(200 * 10**6) == "200mbit"
    assert parse_fabric_spec("4x1gbit") == [10**9] * 4
    assert parse_fabric_spec("2x1gbit+1x500mbit") == [10**9, 10**9, 5 * 10**8]
    for bad in ("", "fast", "1 lightyear", "0x1gbit"):
        with pytest.raises(ValueError):
            parse_fabric_spec(bad)


def test_names_and_addresses_without_root():
    f = Fabric(nodes=3, rails=2, rate="1gbit", prefix="tx")
    assert f.addrs(1) == ["198.18.0.2", "198.18.1.2"] and f.addrs(2) == ["198.18.2.2", "198.18.3.2"]
    assert f.addrs(0) == ["198.18.0.1", "198.18.1.1", "198.18.2.1", "198.18.3.1"]
    assert f.addrs(0, peer=2) == ["198.18.2.1", "198.18.3.1"] and f.peer_addrs(0, 2) == f.addrs(2)
    argv = f.exec_argv(1, ["true"])
    if os.environ.get("TENT_AUTH_TOKEN") or os.environ.get("TENT_AUTH_TOKEN_FILE"):
        assert argv == ["ip", "netns", "exec", "tx-n1", "true"]
    else:  # engines in the namespace bind non-loopback addresses: they get a token file (not the token)
        assert argv[:5] == ["ip", "netns", "exec", "tx-n1", "env"] and argv[-1] == "true"
        path = argv[5].partition("=")[2]
        assert argv[5].startswith("TENT_AUTH_TOKEN_FILE=") and os.stat(path).st_mode & 0o777 == 0o600
        f.close()
        assert not os.path.exists(path)
    assert all(len(lk.if0) <= 15 and len(lk.if1) <= 15 for lk in f.links)
    assert len({lk.if0 for lk in f.links}) == len(f.links)
    spec = Fabric.from_spec("2x1gbit+1x500mbit", prefix="tz")
    assert spec.rails == 3 and spec.rates == [10**9, 10**9, 5 * 10**8]
    big = Fabric(nodes=2, rails=300, prefix="ty")
    assert big.addrs(1)[257] == "198.19.1.2"
    assert default_prefix() != default_prefix()
    with pytest.raises(ValueError):
        Fabric(nodes=2, rails=2, prefix="averyveryverylongprefix")


class _Lines:
    """Bounded-wait reader of a process's JSON stdout lines."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.q.put(json.loads(line))

    def get(self, timeout: float) -> dict:
        return self.q.get(timeout=timeout)


def _client(fab: Fabric, addr: str, dur: float, connect_timeout: float) -> subprocess.Popen:
    argv = [sys.executable, "-c", CLIENT, addr, str(dur), str(connect_timeout), str(PORT)]
    return fab.popen(0, argv, stdout=subprocess.PIPE, text=True)


def _result(p: subprocess.Popen, timeout: float) -> dict:
    out, _ = p.communicate(timeout=timeout)
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def fabric_with_server():
    _require_fabric()
    with Fabric(nodes=2, rails=2, rate="1gbit") as fab:
        server = fab.popen(1, [sys.executable, "-c", SERVER, str(PORT)], stdout=subprocess.PIPE, text=True)
        lines = _Lines(server)
        try:
            assert lines.get(10)["ready"]
            yield fab, lines
        finally:
            server.kill()
            server.wait(10)


def test_rails_move_bytes_and_shape_exactly(fabric_with_server):
    fab, lines = fabric_with_server
    assert fab.rate(0) == 10**9
    fab.set_rate(0, "200mbit")
    fab.degrade(1, 0.1)  # 100 Mbit/s
    assert fab.rate(1) == 10**8
    dur = 1.0
    clients = [_client(fab, addr, dur, 5) for addr in fab.addrs(1)]
    for c in clients:
        assert "sent" in _result(c, 20)
    got = {}
    for _ in clients:
        r = lines.get(20)
        got[r["local"]] = r["bytes"] * 8 / (r["t1"] - r["t0"])
    assert got[fab.addrs(1)[0]] == pytest.approx(200e6, rel=0.2)
    assert got[fab.addrs(1)[1]] == pytest.approx(100e6, rel=0.2)


def test_rail_down_times_out_and_comes_back(fabric_with_server):
    fab, lines = fabric_with_server
    addr = fab.addrs(1)[0]
    ok = _result(_client(fab, addr, 0.1, 5), 20)
    assert ok["sent"] > 0
    assert lines.get(10)["bytes"] == ok["sent"]

    fab.down(0)
    t = time.monotonic()
    r = _result(_client(fab, addr, 0.1, 0.5), 20)
    assert r.get("error") == "TimeoutError" and 0.4 < r["after"] < 5  # silence, not a socket error
    # The other rail is unaffected.
    assert "sent" in _result(_client(fab, fab.addrs(1)[1], 0.1, 2), 20)
    assert lines.get(10)["local"] == fab.addrs(1)[1]

    fab.up(0)
    deadline = t + 10
    while True:  # the link comes back within moments (bounded)
        r = _result(_client(fab, addr, 0.1, 1), 20)
        if "sent" in r or time.monotonic() > deadline:
            break
    assert "sent" in r
    assert lines.get(10)["bytes"] == r["sent"]


def test_teardown_leaves_nothing():
    _require_fabric()
    fab = Fabric(nodes=3, rails=2, rate="500mbit")
    with fab:
        names = [fab.ns(n) for n in range(3)]
        assert set(names) <= set(list_namespaces())
    assert not set(names) & set(list_namespaces())
    # A failure inside the block still tears down.
    with pytest.raises(RuntimeError), Fabric(nodes=2, rails=1) as f2:
        n2 = f2.ns(0)
        raise RuntimeError("boom")
    assert n2 not in list_namespaces()
    # Leftovers of a killed run are found by prefix.
    prefix = default_prefix()
    subprocess.run(["ip", "netns", "add", f"{prefix}-n0"], check=True, timeout=10)
    assert cleanup_stale(prefix) == [f"{prefix}-n0"]
    assert f"{prefix}-n0" not in list_namespaces()
