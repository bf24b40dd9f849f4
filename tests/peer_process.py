"""A remote engine for tests: run as a separate process, driven over stdin/stdout (JSON lines).

Segments: "rw" (read-write, pattern-filled), "ro" (read-only, pattern-filled),
"user" (a registered numpy array, not engine-allocated).
Commands: {"cmd": "digest", "segment": s, "offset": o, "length": n} -> {"sha": ...}
          {"cmd": "fill", "segment": s, "seed": k}  -> {"ok": true}
          {"cmd": "quit"}
"""

from __future__ import annotations

import hashlib
import json
import sys

import numpy as np

from tent_core import READ_ONLY, READ_WRITE, Engine
from tent_core.testing import pattern


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 8 << 20
    cfg = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    transports = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else None
    eng = Engine(cfg, transports=transports)
    bufs = {
        "rw": eng.allocate(size, segment="rw", perm=READ_WRITE),
        "ro": eng.allocate(size, segment="ro", perm=READ_ONLY),
    }
    user = np.zeros(size, np.uint8)
    bufs["user"] = eng.register(user, segment="user")
    for i, b in enumerate(bufs.values()):
        b.array[:] = pattern(size, seed=i)
    print(json.dumps({"engine": eng.engine_id, "transports": sorted(eng.transports), "size": size}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "quit":
            break
        b = bufs[msg["segment"]]
        if msg["cmd"] == "digest":
            o, n = msg["offset"], msg["length"]
            print(json.dumps({"sha": hashlib.sha256(b.array[o : o + n].tobytes()).hexdigest()}), flush=True)
        elif msg["cmd"] == "fill":
            b.array[:] = pattern(size, seed=msg["seed"])
            print(json.dumps({"ok": True}), flush=True)
    eng.close()


if __name__ == "__main__":
    main()
