"""The staged path's CPU-bound limit (`tent_bench.staging.staged_cpu_bound_limit`): a pure function."""

from __future__ import annotations

import pytest
from tent_bench.staging import staged_cpu_bound_limit


def test_loopback_wire_and_copy_sharing_two_cores():
    # wire alone: 1 s, both processes kept 2 cores busy (2 CPU s); copy alone 0.5 s on one core:
    # staged pays 2.5 CPU s on 2 cores -> 1.25 s at best against the slower stage's 1 s
    assert staged_cpu_bound_limit(1.0, 0.5, 2.0, 0.5, cores=2) == pytest.approx(0.8)


def test_a_shaped_wire_leaves_the_cpu_idle():
    assert staged_cpu_bound_limit(4.0, 0.1, 0.6, 0.1, cores=2) == 1.0


def test_a_slow_copy_stage_is_the_limit_not_the_cpu():
    assert staged_cpu_bound_limit(0.2, 3.0, 0.4, 0.3, cores=2) == 1.0


def test_one_core_and_degenerate_times():
    assert staged_cpu_bound_limit(1.0, 1.0, 1.0, 1.0, cores=1) == pytest.approx(0.5)
    assert staged_cpu_bound_limit(0.0, 0.0, 0.0, 0.0, cores=2) == 1.0
    assert staged_cpu_bound_limit(1.0, 1.0, 1.0, 1.0, cores=0) == pytest.approx(0.5)  # cores clamped to 1
