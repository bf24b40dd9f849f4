"""CPU accounting shared by the staged-path benchmarks (`tent bench-staging`, `tent bench --path`).

A staged path runs its stages at once on the same cores; each stage measured alone had them to
itself. Where both stages are CPU work (loopback TCP, page-cache and staging copies), the staged
path cannot beat the cores divided by the CPU its stages cost together: `staged_cpu_bound_limit`
computes that bound from each stage's time and CPU (both processes) for the same bytes.
"""

from __future__ import annotations

import os


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` (every thread), from /proc; None where there is
    no /proc entry to read (another OS, the process gone). Resolution: one clock tick."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: fields count from the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (IndexError, ValueError):
        return None


def staged_cpu_bound_limit(t_wire: float, t_copy: float, cpu_wire: float, cpu_copy: float, cores: int) -> float:
    """staged / slower stage at best where both stages run on the same cores: each stage alone had
    them to itself (its time t, the CPU seconds both processes spent in it), the staged path pays
    both stages' CPU for the same bytes, so it runs no faster than cores / (cpu_wire + cpu_copy)
    per transfer, nor than its slower stage. 1.0 where the CPU is not what limits (a shaped wire,
    a slow device copy). Any consistent units (seconds per transfer, per GiB...)."""
    slower = max(t_wire, t_copy)
    if slower <= 0:
        return 1.0
    t_cpu = (cpu_wire + cpu_copy) / max(1, cores)
    return round(min(1.0, slower / max(slower, t_cpu)), 3)


def limit_shortfall(t_staged: float, cpu_staged: float, cpu_wire: float, cpu_copy: float, cores: int) -> dict[str, float]:
    """Why a CPU-bound staged path runs below `staged_cpu_bound_limit`: that limit assumes the
    staged path spends exactly its stages' CPU and keeps every core busy, so where the limit is
    below 1, staged / slower stage = limit x `cpu` x `cores_busy`, with `cpu` the stages' CPU over
    the staged path's (below 1: it pays more than its stages) and `cores_busy` the share of the cores
    its two processes kept busy (below 1: the cores idled, or other processes had them)."""
    busy = cpu_staged / t_staged if t_staged > 0 else 0.0
    return {"cpu": round((cpu_wire + cpu_copy) / cpu_staged, 3) if cpu_staged > 0 else 1.0,
            "cores_busy": round(busy / max(1, cores), 3)}


__all__ = ["cores", "limit_shortfall", "process_cpu_s", "staged_cpu_bound_limit"]
