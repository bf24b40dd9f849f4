"""A refhub publisher whose tensors live in simulated device memory, in its own process.

Usage: device_worker.py SERVER MODE SIZES SEED [IPC]. Opens an engine with the simulated device
(device IPC off unless IPC=1, so other processes reach its device memory only through its staging),
registers one device tensor per size filled with tent_core.testing.pattern(n, SEED + i), publishes
version 1, prints {"ready": engine_id}, then on a line "mutate" flips one byte of tensor 0 on the
device and answers {"ok": true}; on "quit" (or EOF) it closes.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from refhub import client as C
from tent_core import Engine
from tent_core.simdev import SimArray, SimDevicePlugin
from tent_core.testing import pattern


def main() -> None:
    server, mode, sizes, seed = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4])
    ipc = len(sys.argv) > 5 and sys.argv[5] == "1"
    C.STAGE_SLOT = 1 << 20
    eng = Engine({"transports": {"simdev": {"ipc": ipc}}, "target_staging_chunk_bytes": 1 << 20},
                 transports=["tcp", "simdev"], plugins=[SimDevicePlugin()])
    h = C.open("dm", replica="pub", server=server, mode=mode, engine=eng)
    arrays = []
    for i, n in enumerate(sizes):
        a = SimArray(n)
        a.upload(pattern(n, seed + i))
        arrays.append(a)
        h.register(f"t{i}", a)
    h.publish(1)
    print(json.dumps({"ready": eng.engine_id, "checksum_s": h.stats.get("publish_checksum_s")}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        if cmd == "mutate":  # break the immutability promise, on the device
            b = arrays[0].download(12345, 1)
            arrays[0].upload(np.array([b[0] ^ 0xFF], np.uint8), 12345)
            print(json.dumps({"ok": True}), flush=True)
    h.close()
    eng.close()


if __name__ == "__main__":
    main()
