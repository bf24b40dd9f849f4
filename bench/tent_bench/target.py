"""The target side of `tent bench`: an engine exposing one buffer, until stdin closes."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tent_core.engine import Engine

from .runner import pattern


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.target")
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--segment", default="bench")
    ap.add_argument("--config", default=None, help="JSON engine config")
    ap.add_argument("--pattern", action="store_true", help="fill with a verifiable byte pattern")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cfg = json.loads(args.config) if args.config else None
    with Engine(cfg, host=args.host) as eng:
        buf = eng.allocate(args.size, segment=args.segment)
        if args.pattern and buf.array is not None:
            buf.array[:] = pattern(args.size)
        print(json.dumps({"segment": eng.segment_name(args.segment), "transports": sorted(eng.transports)}), flush=True)
        sys.stdin.read()  # the parent closes stdin to stop us
    return 0


if __name__ == "__main__":
    sys.exit(main())
