"""The target of the small-request benchmarks (`tent_bench.small`): an engine and the bare limits'
servers in one process, driven over stdin/stdout (JSON lines).

    python -m tent_bench.small_target --size BYTES [--config JSON] [--few N] [--many N] [--seed S]

Prints {"engine", "segment", "pid", "addr", "size", "seed", "bare_tcp_port", "bare_tcp_sleep_port", "transports"} once ready:
segment "bench" holds one engine-allocated buffer of `size` bytes at `addr`, filled with
fill(size, seed); with --few/--many,
segments "few" and "many" hold that many registered 4 KiB buffers. Commands:
    {"cmd": "register", "segment": name} -> {"ok": true, "offset": o}   one more 4 KiB buffer
    {"cmd": "quit"}
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import numpy as np

from tent_core.engine import Engine
from tent_core.testing import pattern

from . import _bare

PAGE = 4096


def fill(n: int, seed: int = 0) -> np.ndarray:
    """The bytes the small benchmarks check: `tent_core.testing.pattern(n, seed)`, one 64-bit word per
    position mixed with the seed (never repeats; a prefix of a longer fill is the same bytes)."""
    return pattern(n, seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.small_target")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--config", default=None, help="JSON engine config")
    ap.add_argument("--few", type=int, default=0, help="4 KiB buffers in segment 'few'")
    ap.add_argument("--many", type=int, default=0, help="4 KiB buffers in segment 'many'")
    ap.add_argument("--seed", type=int, default=0, help="the buffer holds fill(size, seed): a fresh one per target")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cfg = json.loads(args.config) if args.config else None
    spare = 64  # room for buffers registered later ("register")
    with Engine(cfg, host=args.host) as eng:
        buf = eng.allocate(args.size, segment="bench")
        assert buf.array is not None
        buf.array[:] = fill(args.size, args.seed)  # the initiator checks bytes against it before timing
        backing: dict[str, np.ndarray] = {}
        used: dict[str, int] = {}
        for name, n in (("few", args.few), ("many", args.many)):
            if n <= 0:
                continue
            arr = np.zeros((n + spare) * PAGE, np.uint8)  # pre-faulted: a copy never meets a page fault
            arr[:] = 1
            backing[name] = arr
            for i in range(n):
                eng.register(arr[i * PAGE : (i + 1) * PAGE], segment=name)
            used[name] = n
        # the bare server serves the same memory, polling for the next request under the engine's
        # rule (tcp busy_poll_us, busy_poll_adaptive: the same code), under the congestion control
        # the engine gives loopback connections; a second one always sleeps
        tcp = eng.transports.get("tcp")
        spin_us, adaptive = int(getattr(tcp, "busy_poll_us", 0)), int(getattr(tcp, "busy_poll_adaptive", 0))
        _bare.tcp_congestion(str(getattr(tcp, "loopback_congestion", "")))  # the engine's, on loopback
        port = _bare.tcp_serve(args.host, buf.addr, args.size, spin_us, adaptive)
        sleep_port = _bare.tcp_serve(args.host, buf.addr, args.size, 0, 0)
        print(json.dumps({"engine": eng.engine_id, "segment": eng.segment_name("bench"), "pid": os.getpid(),
                          "addr": buf.addr, "size": args.size, "seed": args.seed, "bare_tcp_port": port, "bare_tcp_sleep_port": sleep_port,
                          "transports": sorted(eng.transports)}), flush=True)  # fmt: skip
        for line in sys.stdin:
            msg = json.loads(line)
            if msg.get("cmd") == "quit":
                break
            if msg.get("cmd") == "register":
                name = msg["segment"]
                i = used[name]
                if i >= len(backing[name]) // PAGE:
                    print(json.dumps({"ok": False, "error": "no spare room"}), flush=True)
                    continue
                b = eng.register(backing[name][i * PAGE : (i + 1) * PAGE], segment=name)
                used[name] = i + 1
                print(json.dumps({"ok": True, "offset": b.offset}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
