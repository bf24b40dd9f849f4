"""A real etcd server for tests (Debian package etcd-server), on free loopback ports in a temp dir."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    def __init__(self, client_port: int | None = None) -> None:
        binary = shutil.which("etcd")
        if binary is None:
            pytest.skip("etcd is not installed (Debian package etcd-server; scripts/system-deps.sh installs it as root)")
        self.dir = Path(tempfile.mkdtemp(prefix="tent-etcd-"))
        self.port = client_port or _free_port()
        peer = _free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.url = f"etcd://{self.endpoint}"
        self.log = open(self.dir / "etcd.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                binary,
                "--name", "tent-test",
                "--data-dir", str(self.dir / "data"),
                "--listen-client-urls", f"http://{self.endpoint}",
                "--advertise-client-urls", f"http://{self.endpoint}",
                "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                "--initial-cluster", f"tent-test=http://127.0.0.1:{peer}",
                "--log-outputs", "stderr",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.endpoint}/version", timeout=1) as r:
                    json.loads(r.read())
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"etcd did not start; log: {(self.dir / 'etcd.log').read_text()[-2000:]}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
