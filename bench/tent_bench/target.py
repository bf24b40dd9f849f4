"""The target side of `tent bench`: an engine exposing one buffer, until stdin closes."""

from __future__ import annotations

import argparse
import json
import logging
import sys

import numpy as np

from tent_core.engine import Engine
from tent_core.testing import pattern


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.target")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="control port (a restarted target keeps its engine id)")
    ap.add_argument("--segment", default="bench")
    ap.add_argument("--config", default=None, help="JSON engine config")
    ap.add_argument("--pattern", action="store_true", help="fill with a verifiable byte pattern")
    ap.add_argument("--seed", type=int, default=0, help="the pattern's seed (tent_core.testing.pattern)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cfg = json.loads(args.config) if args.config else None
    with Engine(cfg, host=args.host, port=args.port) as eng:
        if args.pattern and args.port:
            # A restartable target (fixed control port): its peers already know the segment's name,
            # so it must not appear before it is filled. Registered host memory serves TCP (the
            # resilience benchmark), not shm's memfd mappings.
            data = np.empty(args.size, np.uint8)
            data[:] = pattern(args.size, args.seed)
            eng.register(data, segment=args.segment)
        else:
            # engine memory, which every transport serves (shm maps it); filled before its name is
            # printed, so no peer can know it earlier
            buf = eng.allocate(args.size, segment=args.segment)
            if args.pattern and buf.array is not None:
                buf.array[:] = pattern(args.size, args.seed)
        print(json.dumps({"segment": eng.segment_name(args.segment), "transports": sorted(eng.transports)}), flush=True)
        sys.stdin.read()  # the parent closes stdin to stop us
    return 0


if __name__ == "__main__":
    sys.exit(main())
