"""Shared by the RDMA tests: a never-repeating byte pattern, a target engine process, device checks."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from typing import Any

from tent_rdma.testbed import VM_ENGINE_CONFIG, pattern64  # noqa: F401  (re-exported for the tests)

HERE = os.path.dirname(os.path.abspath(__file__))

def rdma_engine(config: dict[str, Any], **kw: Any) -> Any:
    """An engine with only the rdma plugin loaded (imports are slow in emulated guests)."""
    from tent_core.engine import Engine

    old = os.environ.get("TENT_PLUGINS")
    os.environ["TENT_PLUGINS"] = "rdma"
    try:
        return Engine(config, transports=["rdma"], **kw)
    finally:
        if old is None:
            del os.environ["TENT_PLUGINS"]
        else:
            os.environ["TENT_PLUGINS"] = old


def rdma_ports_active() -> list[str]:
    """Names of RDMA devices with an ACTIVE port (sysfs)."""
    base = "/sys/class/infiniband"
    out = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    for n in names:
        try:
            with open(f"{base}/{n}/ports/1/state") as f:
                if "ACTIVE" in f.read():
                    out.append(n)
        except OSError:
            pass
    return out


def rdma_skip_reason() -> str:
    """Why the device tests cannot run here ("" when an RDMA port is ACTIVE): the transport's own
    probe, as `tent plugins` reports it."""
    if rdma_ports_active():
        return ""
    from tent_rdma.transport import RdmaTransport

    avail = RdmaTransport().probe()
    why = avail.reason if not avail.available else "no ACTIVE RDMA port"
    return f"unavailable: {why} (the VM suite runs these inside scripts/rdma-vm.sh)"


class Target:
    """rdma_target.py in its own process: an engine exposing segments, driven by JSON lines."""

    def __init__(self, segments: list[dict[str, Any]], host: str = "127.0.0.1", port: int = 0,
                 config: dict[str, Any] | None = None, timeout: float = 600.0, wait: bool = True) -> None:
        argv = [sys.executable, os.path.join(HERE, "rdma_target.py"), "--host", host, "--port", str(port),
                "--segments", json.dumps(segments), "--config", json.dumps(config or VM_ENGINE_CONFIG)]
        # only the rdma plugin is imported: under an emulated CPU every import counts
        env = dict(os.environ, TENT_PLUGINS="rdma")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self._timeout = timeout
        self.engine_id = ""
        self.pid = self.proc.pid
        self.segments: dict[str, dict[str, int]] = {}
        if wait:
            self.wait_ready()

    def wait_ready(self) -> Target:
        """Wait for the target's hello (starting several at once overlaps their slow imports)."""
        if not self.engine_id:
            hello = self._readline(self._timeout)
            self.engine_id = hello["engine_id"]
            self.segments = hello["segments"]
        return self

    def _readline(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError("rdma target did not answer")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"rdma target exited (rc={self.proc.poll()})")
        return json.loads(line)

    def cmd(self, timeout: float = 120.0, **req: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        reply = self._readline(timeout)
        if not reply.get("ok"):
            raise RuntimeError(f"target refused {req}: {reply}")
        return reply

    def name(self, seg: str) -> str:
        return f"{self.engine_id}/{seg}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.cmd(op="quit", timeout=30)
            except Exception:
                pass
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
