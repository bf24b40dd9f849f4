"""A/B of two builds on the small-request scenarios (not a test).

    python plugins/tcp/tools/small_ab_builds.py --other DIR [--rounds 4] [--budget 16M]
        [--scenarios one_at_a_time,batches] [--transports tcp] [--tcp-seconds S] [--config JSON]
    python plugins/tcp/tools/small_ab_builds.py --tree --other TREE ...

DIR holds another build of the tcp plugin alone (a directory with a `tent_tcp` package inside,
e.g. main's plugins/tcp built with `python setup.py build_ext --inplace`); it is put first on
PYTHONPATH of both the initiator and the target processes. With `--tree`, TREE is another whole
checkout (tent-core and the plugins, e.g. a detached worktree of main) with its own `make install`:
its `.venv/bin/python` runs the bench instead. Each round runs `python -m tent_bench.small` once
with this checkout and once with the other (the order flipping every round), so both see the same
load; every row carries the engine's GB/s (`submit().wait()`, and `run()` where the scenario times
it) and its bare C loop taken beside it in the same process. Prints per round and the medians
(with the lowest and highest round) per build, and the engine's GB/s and P50 latency this build /
the other, paired by round (on a loaded host the GB/s, a mean, follows the stalls; the P50 less).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

FIELDS = ("tent_gbps", "run_gbps", "bare_gbps", "python_gbps", "ratio", "run_ratio", "python_ratio", "run_python_ratio", "tent_p50_us", "run_p50_us", "bare_p50_us")


def _rows(a: argparse.Namespace, other: bool) -> list[dict[str, Any]]:
    env, python, cwd = dict(os.environ), sys.executable, None
    if other and a.tree:
        cwd = os.path.abspath(a.other)
        python = os.path.join(cwd, ".venv", "bin", "python")
    elif other:
        path = os.path.abspath(a.other)
        env["PYTHONPATH"] = path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [python, "-m", "tent_bench.small", "--scenarios", a.scenarios, "--transports", a.transports, "--rounds", "1",
            "--budget", a.budget, "--json"]  # fmt: skip
    if a.tcp_seconds:
        argv += ["--tcp-seconds", str(a.tcp_seconds)]
    if a.config:
        argv += ["--config", a.config]
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800, check=True)
    return list(json.loads(out.stdout[out.stdout.index("{") :])["rows"])


def _key(row: dict[str, Any]) -> str:
    what = f"{row['batch']}x{row['block'] >> 10}K" if row.get("batch", 1) > 1 else f"{row['block'] >> 10}K"
    return f"{row['scenario']} {row['op']} {what}"


def _med(v: list[float]) -> str:
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", required=True, help="the other build: a tent_tcp package's directory, or with --tree a checkout")
    ap.add_argument("--tree", action="store_true", help="--other is a whole checkout with its own .venv")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budget", default="16M")
    ap.add_argument("--scenarios", default="one_at_a_time,batches")
    ap.add_argument("--transports", default="tcp", help="passed to tent_bench.small (e.g. shm)")
    ap.add_argument("--tcp-seconds", type=float, default=None, help="passed to tent_bench.small")
    ap.add_argument("--config", default=None, help="JSON engine config for both builds")
    a = ap.parse_args()
    res: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(a.rounds):
        for name in ("this", "other") if r % 2 == 0 else ("other", "this"):
            for row in _rows(a, name == "other"):
                got = {k: float(row[k]) for k in FIELDS if k in row}
                res.setdefault((_key(row), name), []).append(got)
                print(f"round {r} {name:5} {_key(row)}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    for key in sorted({k for k, _ in res}):  # this / other, round by round (both in the same window)
        this, other = res.get((key, "this"), []), res.get((key, "other"), [])
        for f in ("tent_gbps", "run_gbps", "tent_p50_us", "run_p50_us"):  # P50: below 1 is this build faster
            paired = [x[f] / y[f] for x, y in zip(this, other, strict=False) if y.get(f) and f in x]
            if paired:
                print(f"this/other {key} {f}: {_med(paired)}, {sum(p > 1 for p in paired)} of {len(paired)} rounds above 1")
    for (key, name), rows in sorted(res.items()):
        print(f"median {key} {name}: " + ", ".join(f"{k} {_med([x[k] for x in rows if k in x])}" for k in rows[0]))


if __name__ == "__main__":
    main()
