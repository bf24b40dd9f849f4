from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


class Peer:
    """A remote engine in its own process (tests/peer_process.py)."""

    def __init__(self, size: int = 8 << 20, config: dict[str, Any] | None = None, transports: list[str] | None = None,
                 env: dict[str, str] | None = None, preexec_fn: Any = None, stderr: Any = None,
                 port: int = 0) -> None:  # fmt: skip
        argv = [sys.executable, str(HERE / "peer_process.py"), str(size), json.dumps(config) if config else "",
                ",".join(transports or []), str(port)]  # fmt: skip
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=preexec_fn, stderr=stderr)
        self.pid = self.proc.pid
        info = json.loads(self._readline(60))
        self.engine_id: str = info["engine"]
        self.transports: list[str] = info["transports"]
        self.size: int = info["size"]

    def _readline(self, timeout: float) -> str:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            self.kill()
            raise RuntimeError("peer process did not answer")
        return out[0]

    def seg(self, name: str) -> str:
        return f"{self.engine_id}/{name}"

    def call(self, **msg: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._readline(30))

    def digest(self, segment: str, offset: int, length: int) -> str:
        return self.call(cmd="digest", segment=segment, offset=offset, length=length)["sha"]

    def stop(self) -> None:
        """SIGSTOP, and wait until the kernel has really stopped the process (delivery is
        asynchronous: a transfer started right after the signal could otherwise still be served)."""
        self.proc.send_signal(signal.SIGSTOP)
        wait_stopped(self.proc.pid)

    def cont(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=10)
            except Exception:
                self.kill()


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Block until process `pid` is in state T (stopped), or raise."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.005)
    raise TimeoutError(f"process {pid} did not stop")


def sha(data: Any) -> str:
    return hashlib.sha256(bytes(data)).hexdigest()


def until(cond: Callable[[], bool], timeout: float, what: str, step: float = 0.01) -> None:
    """Poll `cond` every `step` s until it holds; AssertionError naming `what` after `timeout` s."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(step)
