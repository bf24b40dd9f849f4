"""``python -m tent_core.conformance NAME [--json]``: see :mod:`tent_core.conformance`."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from .kit import CHECKS, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tent_core.conformance",
        description="Run the transport contract against an installed transport plugin.",
    )
    ap.add_argument("name", help="the transport's name, as `tent plugins` lists it")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--config", default="{}", metavar="JSON", help="the transport's config section, e.g. '{\"threads\": 4}'")
    ap.add_argument("--check", action="append", choices=list(CHECKS), help="run only this check (repeatable)")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="log progress to stderr")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        config = json.loads(args.config)
        if not isinstance(config, dict):
            raise ValueError("--config must be a JSON object")
        report = run(args.name, config, args.check)
    except (LookupError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        width = max(map(len, CHECKS))
        print(f"conformance of transport {report.transport!r} ({report.kind_pair or 'not run'})")
        for c in report.checks:
            print(f"  {c.status.upper():7} {c.name:{width}}  {c.seconds:6.2f} s  {c.detail}")
        print(f"{report.count('passed')} passed, {report.count('failed')} failed, {report.count('skipped')} skipped"
              + (f" ({report.reason})" if report.reason else ""))  # fmt: skip
    return 0 if report.count("failed") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
