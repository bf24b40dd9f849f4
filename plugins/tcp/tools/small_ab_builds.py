"""A/B of two builds of the tcp plugin on the small-request scenarios (not a test).

    python plugins/tcp/tools/small_ab_builds.py --other DIR [--rounds 4] [--budget 16M]
        [--scenarios one_at_a_time,batches]

DIR holds another build of the plugin (a directory with a `tent_tcp` package inside, e.g. main's
plugins/tcp built with `python setup.py build_ext --inplace`); it is put first on PYTHONPATH of
both the initiator and the target processes. Each round runs `python -m tent_bench.small` once
with this checkout's plugin and once with DIR's (the order flipping every round), so both see the
same load; every row carries the engine's GB/s and its bare C loop taken beside it in the same
process. Prints per round and the medians (with the lowest and highest round) of engine GB/s,
bare GB/s and engine / bare, per build, and the engine's GB/s this build / the other, paired by
round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any


def _rows(scenarios: str, budget: str, pythonpath: str | None) -> list[dict[str, Any]]:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = subprocess.run(
        [sys.executable, "-m", "tent_bench.small", "--scenarios", scenarios, "--transports", "tcp", "--rounds", "1",
         "--budget", budget, "--json"],
        env=env, capture_output=True, text=True, timeout=1800, check=True,
    )  # fmt: skip
    return list(json.loads(out.stdout[out.stdout.index("{") :])["rows"])


def _key(row: dict[str, Any]) -> str:
    what = f"{row['batch']}x{row['block'] >> 10}K" if row.get("batch", 1) > 1 else f"{row['block'] >> 10}K"
    return f"{row['scenario']} {row['op']} {what}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", required=True, help="directory holding the other build's tent_tcp package")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--budget", default="16M")
    ap.add_argument("--scenarios", default="one_at_a_time,batches")
    a = ap.parse_args()
    builds = {"this": None, "other": os.path.abspath(a.other)}
    res: dict[tuple[str, str], list[dict[str, float]]] = {}
    for r in range(a.rounds):
        for name in list(builds) if r % 2 == 0 else list(builds)[::-1]:
            for row in _rows(a.scenarios, a.budget, builds[name]):
                got = {k: float(row[k]) for k in ("tent_gbps", "bare_gbps", "ratio", "tent_p50_us") if k in row}
                res.setdefault((_key(row), name), []).append(got)
                print(f"round {r} {name:5} {_key(row)}: " + ", ".join(f"{k} {v:.2f}" for k, v in got.items()), flush=True)
    for key in sorted({k for k, _ in res}):  # this / other, round by round (both in the same window)
        this, other = res.get((key, "this"), []), res.get((key, "other"), [])
        paired = sorted(x["tent_gbps"] / y["tent_gbps"] for x, y in zip(this, other, strict=False) if y["tent_gbps"] > 0)
        if paired:
            print(f"this/other {key}: GB/s ratio median {statistics.median(paired):.2f} ({paired[0]:.2f}-{paired[-1]:.2f}), "
                  f"{sum(p > 1 for p in paired)} of {len(paired)} rounds above 1")  # fmt: skip
    for (key, name), rows in sorted(res.items()):
        parts = []
        for k in rows[0]:
            v = sorted(x[k] for x in rows)
            parts.append(f"{k} {statistics.median(v):.2f} ({v[0]:.2f}-{v[-1]:.2f})")
        print(f"median {key} {name}: " + ", ".join(parts))


if __name__ == "__main__":
    main()
