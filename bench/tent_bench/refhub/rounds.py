"""Round bookkeeping shared by refhub's benchmarks: junk-filling destinations between timed runs and
summarizing interleaved rounds (median and spread).

A local stand-in: the engine-side benchmarks get a shared interleaving helper of their own (issue 14);
this one only needs medians, spreads and the junk fill, so it stays small.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence

import numpy as np


def junk_fill(arrays: Iterable[np.ndarray], seed: int) -> None:
    """Overwrite every destination buffer with a position-dependent pattern that differs per array and
    per round (`seed`), so a timed run that moved nothing leaves bytes no checksum accepts."""
    from tent_core.testing import pattern

    for i, a in enumerate(arrays):
        flat = a.reshape(-1).view(np.uint8)
        flat[:] = pattern(flat.nbytes, seed=(seed << 20) + i + 1)


def summary(samples: Sequence[float], digits: int = 3) -> dict[str, float | int]:
    """Median, min, max and the relative spread (max - min) / median of one series of rounds."""
    if not samples:
        raise ValueError("no samples")
    med = statistics.median(samples)
    return {"median": round(med, digits), "min": round(min(samples), digits), "max": round(max(samples), digits),
            "spread": round((max(samples) - min(samples)) / med, 3) if med else 0.0, "rounds": len(samples)}


def ratio_summary(ours: Sequence[float], theirs: Sequence[float]) -> dict[str, float | int]:
    """Per-round ratios ours/theirs of interleaved rounds (each round pairs one run of each)."""
    if len(ours) != len(theirs):
        raise ValueError("interleaved rounds pair one sample of each")
    return summary([a / b for a, b in zip(ours, theirs, strict=True)])
