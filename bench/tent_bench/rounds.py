"""Engine and baselines interleaved over rounds, reported as medians with their spread.

Every engine benchmark that compares with a peer or a physical limit goes through this module:
one round runs every contender once (the engine, then each baseline), the order rotating from
round to round so neither side always runs on a warmer or quieter machine; ratios are computed
within each round (engine and baseline measured minutes apart are not compared) and the report
gives the median over the rounds and the min-max of every figure.

Pure functions over plain rows (dicts with "engine", "op", "block_size", "batch_size" and
metrics), so the arithmetic is tested without running anything.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

Row = dict[str, Any]
# A contender measures once per call; it gets the round number (a fresh seed per round is its business).
Contender = Callable[[int], list[Row]]

POINT = ("op", "block_size", "batch_size")
METRICS = ("gbps", "gbit", "avg_us", "p50_us", "p99_us")


class ContenderSkipped(RuntimeError):
    """A contender that cannot run here (e.g. a peer not installed): dropped from every round."""


def round_order(names: Sequence[str], r: int) -> list[str]:
    """Round r runs the contenders rotated by r: A B C, B C A, C A B, ... (two: A B, B A, A B)."""
    k = r % len(names) if names else 0
    return list(names[k:]) + list(names[:k])


def run_rounds(contenders: Sequence[tuple[str, Contender]], rounds: int,
               skipped: Callable[[str, str], None] | None = None) -> list[Row]:  # fmt: skip
    """Run every contender once per round in rotating order; rows tagged with "round".

    A contender raising ContenderSkipped is reported through `skipped(name, reason)` and left out
    of this and later rounds; any other exception propagates (a broken measurement is not data)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    table = dict(contenders)
    if len(table) != len(contenders):
        raise ValueError("contender names must be unique")
    active = [name for name, _ in contenders]
    rows: list[Row] = []
    for r in range(rounds):
        for name in round_order(active, r):
            if name not in active:
                continue
            try:
                got = table[name](r)
            except ContenderSkipped as exc:
                active.remove(name)
                if skipped:
                    skipped(name, str(exc))
                continue
            for row in got:
                rows.append({**row, "round": r})
    return rows


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    if not values:
        raise ValueError("no values")
    return float(statistics.median(values)), float(min(values)), float(max(values))


def _key(row: Row, fields: Sequence[str]) -> tuple[Any, ...]:
    return tuple(row.get(f) for f in fields)


def summarize(rows: Sequence[Row], ours: str = "tent", group: Sequence[str] = ("engine", "transport", *POINT),
              metrics: Sequence[str] = METRICS, digits: int = 4, same_transport: bool = False) -> list[Row]:  # fmt: skip
    """One row per (engine, transport, point): every metric the median over the rounds, with
    `<metric>_min`, `<metric>_max` and `<metric>_rounds`; for each of our rows, `x_<baseline>` is the
    median of the per-round ratios ours / baseline (same point, same round) with its min-max, and
    `p99_vs_<baseline>` likewise for P99. A baseline row matches ours by point (its transport is
    its own: socket, cma...) or, with `same_transport`, by transport and point (two settings of the
    same engine). Row order follows first appearance."""
    groups: dict[tuple[Any, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(_key(row, group), []).append(row)
    out: list[Row] = []
    for members in groups.values():
        first = members[0]
        agg: Row = {k: v for k, v in first.items() if k not in metrics and k != "round" and not k.startswith("x_")
                    and not k.startswith("p99_vs_")}  # fmt: skip
        agg["rounds"] = len(members)
        for m in metrics:
            vals = [float(r[m]) for r in members if r.get(m) is not None]
            if not vals:
                continue
            med, lo, hi = spread(vals)
            agg[m], agg[f"{m}_min"], agg[f"{m}_max"] = round(med, digits), round(lo, digits), round(hi, digits)
            agg[f"{m}_rounds"] = [round(v, digits + 3) for v in vals]
        out.append(agg)
    _add_round_ratios(rows, out, ours, group, same_transport)
    return out


def per_round_ratios(rows: Sequence[Row], ours: str, baseline: str, metric: str = "gbps",
                     point: Sequence[str] = POINT, same_transport: bool = False) -> dict[tuple[Any, ...], list[float]]:  # fmt: skip
    """(transport of ours, *point) -> [ours / baseline in round r, for every round where both ran]."""
    match = ("transport", *point) if same_transport else tuple(point)
    base = {(r["round"], *_key(r, match)): r for r in rows if r.get("engine") == baseline}
    ratios: dict[tuple[Any, ...], list[float]] = {}
    for r in rows:
        if r.get("engine") != ours:
            continue
        b = base.get((r["round"], *_key(r, match)))
        if b is None or not b.get(metric) or r.get(metric) is None:
            continue
        ratios.setdefault((r.get("transport"), *_key(r, point)), []).append(float(r[metric]) / float(b[metric]))
    return ratios


def _add_round_ratios(rows: Sequence[Row], out: list[Row], ours: str, group: Sequence[str], same_transport: bool) -> None:
    baselines = sorted({r["engine"] for r in rows if r.get("engine") not in (None, ours)})
    point = [f for f in group if f not in ("engine", "transport")]
    for b in baselines:
        for metric, prefix in (("gbps", "x_"), ("p99_us", "p99_vs_")):
            ratios = per_round_ratios(rows, ours, b, metric, point, same_transport)
            for agg in out:
                if agg.get("engine") != ours:
                    continue
                vals = ratios.get((agg.get("transport"), *_key(agg, point)))
                if not vals:
                    continue
                med, lo, hi = spread(vals)
                agg[f"{prefix}{b}"] = round(med, 3)
                agg[f"{prefix}{b}_min"], agg[f"{prefix}{b}_max"] = round(lo, 3), round(hi, 3)
