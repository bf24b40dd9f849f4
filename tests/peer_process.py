"""A remote engine for tests: run as a separate process, driven over stdin/stdout (JSON lines).

Segments: "rw" (read-write, pattern-filled), "ro" (read-only, pattern-filled),
"user" (a registered numpy array, not engine-allocated).
Commands: {"cmd": "digest", "segment": s, "offset": o, "length": n} -> {"sha": ...}
          {"cmd": "fill", "segment": s, "seed": k}  -> {"ok": true}
          {"cmd": "register_twice"} -> one array registered twice: segments "dual_rw" (READ_WRITE)
                                       and "dual_ro" (READ_ONLY), pattern seed 9
          {"cmd": "unregister", "segment": s}  -> {"ok": true, "secs": seconds unregister took}
          {"cmd": "allocate", "n": k}   -> k more engine allocations work? {"ok": bool, "error": ...}
          {"cmd": "zmq"}                -> a new ZeroMQ socket can be made and bound? {"ok": bool, ...}
          {"cmd": "stats"}              -> {"threads": n, "fds": n, "tcp": server stats (if any)}
          {"cmd": "quit"}
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

import numpy as np

from tent_core import READ_ONLY, READ_WRITE, Engine
from tent_core.testing import pattern


def _register_twice(eng: Engine, bufs: dict[str, Any], msg: dict[str, Any], size: int) -> dict[str, Any]:
    arr = pattern(size, seed=9)
    bufs["_dual"] = arr
    bufs["dual_rw"] = eng.register(arr, segment="dual_rw", perm=READ_WRITE)
    bufs["dual_ro"] = eng.register(arr, segment="dual_ro", perm=READ_ONLY)
    return {"ok": True}


def _unregister(eng: Engine, bufs: dict[str, Any], msg: dict[str, Any], size: int) -> dict[str, Any]:
    t0 = time.monotonic()
    eng.unregister(bufs.pop(msg["segment"]))
    return {"ok": True, "secs": time.monotonic() - t0}


def _allocate(eng: Engine, bufs: dict[str, Any], msg: dict[str, Any], size: int) -> dict[str, Any]:
    made = []
    try:
        for _ in range(int(msg.get("n", 1))):
            made.append(eng.allocate(4096, segment="probe-alloc"))
        return {"ok": True}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        for b in made:
            eng.unregister(b)


def _zmq(eng: Engine, bufs: dict[str, Any], msg: dict[str, Any], size: int) -> dict[str, Any]:
    import zmq

    try:
        s = zmq.Context.instance().socket(zmq.ROUTER)
        s.bind_to_random_port("tcp://127.0.0.1")
        s.close(0)
        return {"ok": True}
    except Exception as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


def _stats(eng: Engine, bufs: dict[str, Any], msg: dict[str, Any], size: int) -> dict[str, Any]:
    with open("/proc/self/status") as f:
        threads = int(f.read().split("Threads:")[1].split()[0])
    out: dict[str, Any] = {"threads": threads, "fds": len(os.listdir("/proc/self/fd"))}
    tcp = eng.transports.get("tcp")
    if tcp is not None:
        out["tcp"] = tcp.native.server_stats()  # type: ignore[attr-defined]
        out["log"] = tcp.native.log_stats()  # type: ignore[attr-defined]
    return out


EXTRA = {"register_twice": _register_twice, "unregister": _unregister, "allocate": _allocate, "zmq": _zmq,
         "stats": _stats}


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 8 << 20
    cfg = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] else None
    transports = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[3] else None
    port = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] else 0  # a restarted peer keeps its engine id
    eng = Engine(cfg, port=port, transports=transports)
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
        if msg["cmd"] in EXTRA:
            print(json.dumps(EXTRA[msg["cmd"]](eng, bufs, msg, size)), flush=True)
            continue
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
