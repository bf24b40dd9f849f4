"""The staged paths' CPU accounting (`tent_bench.cpu`): the CPU-bound limit (a pure function) and
reading a process's CPU seconds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from tent_bench import staging
from tent_bench.cpu import limit_shortfall, process_cpu_s, staged_cpu_bound_limit


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


def test_the_shortfall_splits_the_gap_to_the_limit_into_cpu_and_idle_cores():
    # wire alone 1 s on 2 CPU s, copy 0.5 CPU s: limit 0.8 (1.25 s). The staged path took 1.6 s and
    # 2.7 CPU s: 2.5 / 2.7 of its CPU is its stages', and it kept 2.7 / 1.6 of the 2 cores busy
    t_wire, t_copy, cpu_wire, cpu_copy, t_staged, cpu_staged = 1.0, 0.5, 2.0, 0.5, 1.6, 2.7
    limit = staged_cpu_bound_limit(t_wire, t_copy, cpu_wire, cpu_copy, cores=2)
    short = limit_shortfall(t_staged, cpu_staged, cpu_wire, cpu_copy, cores=2)
    assert short == pytest.approx({"cpu": 0.926, "cores_busy": 0.844}, abs=1e-3)
    assert limit * short["cpu"] * short["cores_busy"] == pytest.approx(max(t_wire, t_copy) / t_staged, rel=2e-3)


def test_a_staged_path_at_its_limit_has_no_shortfall():
    short = limit_shortfall(1.25, 2.5, 2.0, 0.5, cores=2)
    assert short == {"cpu": 1.0, "cores_busy": 1.0}
    assert limit_shortfall(0.0, 0.0, 1.0, 1.0, cores=2) == {"cpu": 1.0, "cores_busy": 0.0}  # nothing measured


def test_bench_staging_uses_the_shared_limit():
    assert staging.staged_cpu_bound_limit is staged_cpu_bound_limit


def test_process_cpu_s_reads_another_process_and_nothing_for_a_gone_one():
    # a child that burns CPU until its own clock says 0.3 s, then waits for stdin to close
    code = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('ok', flush=True)\nsys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ok"
        got = process_cpu_s(proc.pid)
        assert got is not None and got >= 0.25  # its 0.3 s, read at clock-tick resolution
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
    assert process_cpu_s(proc.pid) is None  # reaped: no /proc entry
    assert process_cpu_s(os.getpid()) is not None
