"""A/B of two whole trees (tent-core and the plugins) on tcp requests one at a time (not a test).

    python plugins/tcp/tools/small_ab_trees.py --other TREE [--pairs 4] [--rounds 3]
        [--tcp-seconds 0.3] [--config JSON]

TREE is another checkout with its own `make install` (e.g. a detached worktree of main); its
`.venv/bin/python` runs `python -m tent_bench.small --scenarios one_at_a_time --transports tcp`,
and so does this checkout's, whole runs alternating (this, other, other, this, ...), so both see
the same load. Each run times the engine (`submit().wait()` and `run()`) beside its own bare C
loop. Prints, per row and tree, the medians over the runs (lowest-highest run) of engine GB/s,
run() GB/s, bare GB/s, engine x bare and run() x bare, the engine's P50, and this tree's engine
GB/s over the other's, paired run by run (with how many pairs this tree won). Use `small_ab_builds.py`
for two builds of the plugin alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

FIELDS = ("tent_gbps", "run_gbps", "bare_gbps", "ratio", "run_ratio", "tent_p50_us", "run_p50_us", "bare_p50_us")


def _rows(tree: str, rounds: int, seconds: float, config: str | None) -> list[dict[str, Any]]:
    argv = [os.path.join(tree, ".venv", "bin", "python"), "-m", "tent_bench.small", "--scenarios", "one_at_a_time",
            "--transports", "tcp", "--rounds", str(rounds), "--tcp-seconds", str(seconds), "--json"]  # fmt: skip
    if config:
        argv += ["--config", config]
    out = subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=1800, check=True)
    return list(json.loads(out.stdout[out.stdout.index("{") :])["rows"])


def _med(v: list[float]) -> str:
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" if v else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", required=True, help="the other tree (its .venv built by make install)")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tcp-seconds", type=float, default=0.3)
    ap.add_argument("--config", default=None, help="JSON engine config for both trees")
    a = ap.parse_args()
    trees = {"this": os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")),
             "other": os.path.abspath(a.other)}  # fmt: skip
    res: dict[tuple[str, str], list[dict[str, float]]] = {}
    for p in range(a.pairs):
        for name in ("this", "other") if p % 2 == 0 else ("other", "this"):
            for row in _rows(trees[name], a.rounds, a.tcp_seconds, a.config):
                key = f"{row['op']} {row['block'] >> 10}K"
                got = {k: float(row[k]) for k in FIELDS if k in row}
                res.setdefault((key, name), []).append(got)
                print(f"pair {p} {name:5} {key}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    print()
    for key in sorted({k for k, _ in res}):
        for name in ("this", "other"):
            runs = res.get((key, name), [])
            cells = ", ".join(f"{f} {_med([r[f] for r in runs if f in r])}" for f in FIELDS)
            print(f"{key} {name:5}: {cells}")
        this, other = res.get((key, "this"), []), res.get((key, "other"), [])
        for f in ("tent_gbps", "run_gbps"):
            q = [x[f] / y[f] for x, y in zip(this, other, strict=True) if y.get(f)]
            if q:
                print(f"{key} {f} this / other: {_med(q)}, this higher in {sum(v > 1 for v in q)} of {len(q)}")


if __name__ == "__main__":
    sys.exit(main())
