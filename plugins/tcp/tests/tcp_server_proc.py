"""A TCP executor serving registered regions, run as a separate process by the tests.

    python tcp_server_proc.py IP[,IP...] [key=value;...]

Prints one JSON line {"ports": [...], "regions": {name: [addr, len, perm]}} and then answers
JSON commands on stdin, one per line:
    {"cmd": "sha", "region": name, "off": int, "len": int}   -> {"sha": hex}
    {"cmd": "fill", "region": name, "seed": int}              -> {"ok": true}
    {"cmd": "unregister", "region": name}                     -> {"ok": bool}  (its first registration)
    {"cmd": "register", "region": name, "perm": p}            -> {"id": int}   (one more registration)
    {"cmd": "unregister_id", "id": int[, "timeout_s": t]}     -> {"ok": bool, "secs": float}
    {"cmd": "stats"}                                          -> server_stats(), log_stats(), qos_yields()
    {"cmd": "poke", "region": name, "off": int, "value": int} -> {"ok": true}  (a u64 store: a progress word)
    {"cmd": "exit"}
Region contents after start / "fill": pattern(seed, len) (see pattern()).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from tent_tcp.native import TcpExecutor  # noqa: E402

REGIONS = {"rw": (16 << 20, 3, 1), "ro": (1 << 20, 1, 2), "wo": (1 << 20, 2, 3), "none": (4096, 0, 4)}


def pattern(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def name_unregister(ex: TcpExecutor, rids: dict[str, int], name: str) -> bool:
    rid = rids.pop(name, None)
    return rid is not None and ex.unregister_region(rid)


def main() -> None:
    ips = sys.argv[1].split(",")
    cfg = dict(kv.split("=", 1) for kv in sys.argv[2].split(";") if kv) if len(sys.argv) > 2 else {}
    ex = TcpExecutor(cfg)
    ports = [ex.listen(ip, 0) for ip in ips]
    bufs: dict[str, np.ndarray] = {}
    info = {}
    rids: dict[str, int] = {}
    for name, (size, perm, seed) in REGIONS.items():
        a = pattern(seed, size)
        bufs[name] = a
        rids[name] = ex.register_region(a.ctypes.data, a.nbytes, perm)
        info[name] = [a.ctypes.data, a.nbytes, perm]
    print(json.dumps({"ports": ports, "regions": info, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        cmd = req["cmd"]
        if cmd == "exit":
            break
        a = bufs[req.get("region", "rw")]
        if cmd == "sha":
            off, n = req["off"], req["len"]
            out = {"sha": hashlib.sha256(a[off : off + n].tobytes()).hexdigest()}
        elif cmd == "fill":
            a[:] = pattern(req["seed"], a.nbytes)
            out = {"ok": True}
        elif cmd == "unregister":
            t0 = time.monotonic()
            out = {"ok": name_unregister(ex, rids, req["region"]), "secs": time.monotonic() - t0}
        elif cmd == "register":
            out = {"id": ex.register_region(a.ctypes.data, a.nbytes, int(req["perm"]))}
        elif cmd == "unregister_id":
            t0 = time.monotonic()
            ok = ex.unregister_region(int(req["id"]), req.get("timeout_s"))
            out = {"ok": ok, "secs": time.monotonic() - t0}
        elif cmd == "poke":
            a[req["off"] : req["off"] + 8].view(np.uint64)[0] = int(req["value"])
            out = {"ok": True}
        elif cmd == "stats":
            out = {**ex.server_stats(), "log": ex.log_stats(), "qos_yields": ex.qos_yields()}
        else:
            out = {"error": f"unknown command {cmd}"}
        print(json.dumps(out), flush=True)
    ex.close()


if __name__ == "__main__":
    main()
