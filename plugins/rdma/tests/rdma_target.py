"""A target engine for the RDMA tests (its own process): segments filled with pattern64, JSON-line commands.

Commands on stdin, one reply line each on stdout:
  {"op": "sha", "seg", "off", "len"}       sha256 of the segment's bytes
  {"op": "check", "seg", "seed"}           does the segment hold pattern64(seed) exactly?
  {"op": "fill", "seg", "seed"}            refill it
  {"op": "reregister", "seg", "perm"}      unregister and register the same memory again (new keys)
  {"op": "passive"}                        how many QPs this engine holds for initiators
  {"op": "quit"}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rdma_helpers import pattern64  # noqa: E402

from tent_core.engine import Engine  # noqa: E402
from tent_core.types import Permission  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--segments", required=True)
    ap.add_argument("--config", default="{}")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if os.environ.get("TENT_TEST_VERBOSE") else logging.WARNING, stream=sys.stderr)
    specs = json.loads(args.segments)
    with Engine(json.loads(args.config), host=args.host, port=args.port, transports=["rdma"]) as eng:
        bufs = {}
        arrays = {}
        for s in specs:
            perm = Permission(int(s.get("perm", 3)))
            b = eng.allocate(int(s["size"]), segment=s["name"], perm=perm)
            b.array[:] = pattern64(int(s["size"]), int(s.get("seed", 0)))
            bufs[s["name"]] = b
            arrays[s["name"]] = b.array
        hello = {
            "engine_id": eng.engine_id,
            "pid": os.getpid(),
            "segments": {n: {"addr": b.addr, "length": b.length} for n, b in bufs.items()},
        }
        print(json.dumps(hello), flush=True)
        for line in sys.stdin:
            req = json.loads(line)
            op = req.get("op")
            reply: dict = {"ok": True}
            try:
                if op == "quit":
                    print(json.dumps(reply), flush=True)
                    break
                b = bufs.get(req.get("seg", ""))
                if op == "sha":
                    off, n = int(req["off"]), int(req["len"])
                    reply["sha"] = hashlib.sha256(b.array[off : off + n].tobytes()).hexdigest()
                elif op == "check":
                    reply["equal"] = bool((b.array == pattern64(b.length, int(req["seed"]))).all())
                elif op == "fill":
                    b.array[:] = pattern64(b.length, int(req["seed"]))
                elif op == "reregister":
                    eng.unregister(b)  # owned memory is freed: register a fresh buffer instead
                    nb = eng.allocate(b.length, segment=req["seg"], perm=Permission(int(req["perm"])))
                    nb.array[:] = pattern64(nb.length, 0)
                    bufs[req["seg"]] = nb
                    reply["addr"] = nb.addr
                elif op == "passive":
                    reply["qps"] = eng.transports["rdma"].passive_qps()
                else:
                    reply = {"ok": False, "error": f"unknown op {op!r}"}
            except Exception as exc:  # the test sees the reason
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
