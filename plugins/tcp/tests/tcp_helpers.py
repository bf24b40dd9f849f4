from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


from tent_tcp.native import TcpExecutor  # noqa: E402

from tent_core import _native  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

from tent_core.abi import SLICE_DTYPE  # noqa: E402

FAILURE_DTYPE = np.dtype(SLICE_DTYPE.descr + [("status", "<i4"), ("pad", "<i4")])
assert FAILURE_DTYPE.itemsize == _native.FAILURE_SIZE

READ, WRITE = 0, 1
import tent_core.rails  # noqa: E402,F401  (the core owns the telemetry slots; importing sets them)


def pattern(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class Server:
    """A tcp_server_proc.py process."""

    def __init__(self, ips: Sequence[str] = ("127.0.0.1",), config: str = "") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "tcp_server_proc.py"), ",".join(ips), config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = self._readline(30.0)
        self.ips = list(ips)
        self.ports: list[int] = hello["ports"]
        self.regions: dict[str, tuple[int, int, int]] = {k: tuple(v) for k, v in hello["regions"].items()}

    def _readline(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError("server did not answer")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"server exited (rc={self.proc.poll()})")
        return json.loads(line)

    def cmd(self, timeout: float = 30.0, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._readline(timeout)

    def sha(self, region: str, off: int, n: int) -> str:
        return self.cmd(cmd="sha", region=region, off=off, len=n)["sha"]

    def addr(self, region: str) -> int:
        return self.regions[region][0]

    def signal(self, sig: int) -> None:
        """Send `sig`; for SIGSTOP, return once the process is stopped (bounded): the signal is
        asynchronous, and a server still running for a moment answers what a test means to hang."""
        self.proc.send_signal(sig)
        if sig != signal.SIGSTOP:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{self.proc.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return
            time.sleep(0.005)
        raise TimeoutError("the server process did not stop")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)
                self.cmd(timeout=5.0, cmd="exit")
                self.proc.wait(5.0)
            except Exception:
                self.proc.kill()
                self.proc.wait(5.0)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


@dataclass
class Result:
    done: bool
    error: int
    elapsed: float
    retryable: list[int] = field(default_factory=list)  # statuses that went to the failure queue


def run(
    ex: TcpExecutor,
    slices: Sequence[tuple[int, int, int, int, int, int]],
    timeout: float = 20.0,
    cancel_first: bool = False,
    stat_index: int = 0,
    inline: bool = False,
    hints: int = 0,
) -> Result:
    """Submit (opcode, local, remote, length, peer, rail) slices as one batch and wait.

    Retryable failures are finalized like the core does after its retries: fail_slice(status).
    `stat_index`: a rail's (`RAILS.acquire(...).stat_index`) to count the slices on its row; the
    default (0, no rail's generation) counts them nowhere.
    `inline`: through the executor's submit_inline (the core's path for small requests);
    `hints`: TENT_HINT_* flags for every slice (tent_core.abi.HINT_SMALL: parts of small requests).
    """
    b, t0 = submit(ex, slices, cancel_first=cancel_first, stat_index=stat_index, inline=inline, hints=hints)
    return wait_result(b, t0, timeout)


def submit(
    ex: TcpExecutor,
    slices: Sequence[tuple[int, int, int, int, int, int]],
    cancel_first: bool = False,
    stat_index: int = 0,
    inline: bool = False,
    hints: int = 0,
) -> tuple[Any, float]:
    """`run` without the wait: the batch and its submit time, for tests that act while it runs."""
    arr = np.zeros(len(slices), SLICE_DTYPE)
    for i, (op, local, remote, length, peer, rail) in enumerate(slices):
        arr[i] = (local, remote, length, peer, 0, 0, op, rail, stat_index, hints)
    b = _native.Batch(len(slices))
    if cancel_first:
        b.cancel()
    t0 = time.monotonic()
    rc = _native.submit(ex.ops, ex.handle, b, arr, inline)
    assert rc == 0, rc
    return b, t0


def wait_result(b: Any, t0: float, timeout: float = 20.0) -> Result:
    """Wait for batch `b` like run() does (finalizing retryable failures)."""
    retryable: list[int] = []
    done = False
    while time.monotonic() - t0 < timeout:
        if b.wait(0.05):
            done = True
            break
        for rec in np.frombuffer(_native.pop_failures(), FAILURE_DTYPE):
            if int(rec["token"]) == b.token:
                retryable.append(int(rec["status"]))
                b.fail_slice(int(rec["status"]))
    return Result(done, int(b.error), time.monotonic() - t0, retryable)


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(("127.0.0.1",), "slice_timeout_ms=1000")
    yield s
    s.close()


@pytest.fixture
def client() -> Iterator[TcpExecutor]:
    ex = TcpExecutor({"threads": 4, "conns_per_rail": 2, "slice_timeout_ms": 1000, "connect_timeout_ms": 500})
    yield ex
    ex.close()


def connect(ex: TcpExecutor, srv: Server) -> int:
    return ex.add_peer([""] * len(srv.ports), srv.ips, srv.ports)


def engine_pair(monkeypatch: pytest.MonkeyPatch, engine: dict[str, Any] | None = None,
                **tcp: Any) -> Iterator[tuple[Any, Any]]:
    """Two engines of this process with only the tcp transport (`engine`: engine config, `tcp`: the
    transport's knobs); skips when tcp did not start; both closed after."""
    from tent_core.engine import Engine

    monkeypatch.setenv("TENT_PLUGINS", "tcp")
    cfg: dict[str, Any] = {**(engine or {}), "transports": {"tcp": tcp}}
    a, b = Engine(cfg), Engine(cfg)
    try:
        if "tcp" not in b.transports:
            pytest.skip("engine did not start the tcp transport")
        yield a, b
    finally:
        b.close()
        a.close()


def recv_upto(c: Any, n: int) -> bytes:
    """n bytes from socket `c`, or fewer if the peer closes first."""
    out = b""
    while len(out) < n:
        chunk = c.recv(n - len(out))
        if not chunk:
            break
        out += chunk
    return out
