"""A remote engine holding simulated device memory, run as its own process (tests/sim_peers.py).

Segments: "dev" (device memory, READ_WRITE), "devro" (device memory, READ_ONLY), "host" (host
memory, READ_WRITE); each starts filled with tent_core.testing.pattern(size, seed=index).
Commands (JSON lines on stdin, one JSON reply line each):
  {"cmd": "digest", "segment": s, "offset": o, "length": n} -> {"sha": ...}
  {"cmd": "fill", "segment": s, "seed": k}                  -> {"ok": true}
  {"cmd": "stats"}                                           -> {"staging": {...}, "simdev": {...}}
  {"cmd": "quit"}
"""

from __future__ import annotations

import hashlib
import json
import sys

from tent_core import READ_ONLY, READ_WRITE, Engine
from tent_core.simdev import SimArray, SimDevicePlugin, SimStream
from tent_core.testing import pattern


def main() -> None:
    size = int(sys.argv[1])
    cfg = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    transports = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else None
    eng = Engine(cfg, transports=transports, plugins=[SimDevicePlugin()])
    dev, devro = SimArray(size), SimArray(size)
    host = eng.allocate(size, segment="host", perm=READ_WRITE)
    eng.register(dev, segment="dev", perm=READ_WRITE)
    eng.register(devro, segment="devro", perm=READ_ONLY)
    arrays = {"dev": dev, "devro": devro}
    for i, a in enumerate(arrays.values()):
        a.upload(pattern(size, seed=i))
    host.array[:] = pattern(size, seed=2)
    print(json.dumps({"engine": eng.engine_id, "transports": sorted(eng.transports), "size": size}), flush=True)
    stream = SimStream()
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg["cmd"]
        if cmd == "quit":
            break
        if cmd == "stats":
            st = eng.transports["simdev"].stats() if "simdev" in eng.transports else {}
            print(json.dumps({"staging": eng._stager.stats, "simdev": st}), flush=True)
            continue
        seg = msg["segment"]
        if cmd == "digest":
            o, n = msg["offset"], msg["length"]
            data = arrays[seg].download(o, n) if seg in arrays else host.array[o : o + n]
            print(json.dumps({"sha": hashlib.sha256(data.tobytes()).hexdigest()}), flush=True)
        elif cmd == "fill":
            if seg in arrays:
                stream.fill(arrays[seg], msg["seed"])
                stream.synchronize()
            else:
                host.array[:] = pattern(size, seed=msg["seed"])
            print(json.dumps({"ok": True}), flush=True)
    eng.close()


if __name__ == "__main__":
    main()
