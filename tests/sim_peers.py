"""A remote engine with simulated device memory in its own process (tests/sim_peer.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from peers import HERE, Peer


class SimPeer(Peer):
    def __init__(self, size: int = 8 << 20, config: dict[str, Any] | None = None, transports: list[str] | None = None) -> None:
        argv = [sys.executable, str(HERE / "sim_peer.py"), str(size), json.dumps(config) if config else "",
                ",".join(transports or [])]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        info = json.loads(self._readline(60))
        self.engine_id: str = info["engine"]
        self.transports: list[str] = info["transports"]
        self.size: int = info["size"]

    def stats(self) -> dict[str, Any]:
        return self.call(cmd="stats")
