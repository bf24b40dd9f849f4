"""Target side of the Mooncake-style two-process suite (run as its own process).

Environment, as Mooncake's own suite: TARGET_SERVER_NAME (default 127.0.0.1:12345), MC_METADATA_SERVER
(an etcd address, or P2PHANDSHAKE), PROTOCOL (tcp/rdma). Prints one JSON line when it serves:
{"ready": <server name peers must use>, "engine": <module of TransferEngine>} and serves until its
stdin closes (the test holds the pipe, so the target never outlives it).
"""

from __future__ import annotations

import json
import os
import sys

from mooncake.engine import TransferEngine

BUFFER_BYTES = 64 * 1024 * 1024


def main() -> int:
    name = os.getenv("TARGET_SERVER_NAME", "127.0.0.1:12345")
    metadata = os.getenv("MC_METADATA_SERVER", "127.0.0.1:2379")
    protocol = os.getenv("PROTOCOL", "tcp")
    engine = TransferEngine()
    rc = engine.initialize(name, metadata, protocol, "")
    if rc != 0:
        print(json.dumps({"error": f"initialize returned {rc}"}), flush=True)
        return 1
    if metadata == "P2PHANDSHAKE":
        name = f"{name.rpartition(':')[0] or name}:{engine.get_rpc_port()}"
    addr = engine.get_first_buffer_address(name)
    if addr == 0:  # nothing registered yet: fall back to a managed buffer, as Mooncake's target does
        addr = engine.allocate_managed_buffer(BUFFER_BYTES)
        if addr == 0:
            print(json.dumps({"error": "allocate_managed_buffer failed"}), flush=True)
            return 1
    print(json.dumps({"ready": name, "addr": addr, "engine": TransferEngine.__module__}), flush=True)
    sys.stdin.read()  # serve until the test closes the pipe
    return 0


if __name__ == "__main__":
    sys.exit(main())
