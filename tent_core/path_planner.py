"""Phase 1b helpers: synthesized paths and their chunking.

Planning a synthesized path is a routing decision and lives in `tent_core.routing` (`Router.plan`,
`StagedPath`); `plan_staged_path` is kept here as the plain-function form of it. `chunk_plan` cuts
a staged request into the chunks the pipeline in `tent_core.staged` moves; `pipeline_chunk` (from
`tent_core.routing`, which prices paths with it) sizes the chunks of a target-staged request.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from .routing import Router, StagedPath, pipeline_chunk
from .types import CapabilityProfile, MemoryKind, OpCode


def plan_staged_path(
    profiles: Mapping[str, CapabilityProfile],
    local_kind: MemoryKind,
    remote_kind: MemoryKind,
    same_host: bool,
    reachable: Collection[str],
    op: OpCode,
) -> StagedPath | None:
    """A two-leg path through local host staging (no policy rules), or None. See `Router.plan_staged`."""
    return Router(profiles).plan_staged(local_kind, remote_kind, same_host, reachable, profiles.keys(), op)


def chunk_plan(length: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) chunks covering [0, length)."""
    if chunk <= 0:
        raise ValueError("chunk must be > 0")
    return [(off, min(chunk, length - off)) for off in range(0, length, chunk)]


def ramped_chunk_plan(length: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) chunks covering [0, length): half a chunk first and last, whole chunks
    between (`chunk_plan` where that leaves fewer than three). A pipeline of large chunks fills
    and drains one chunk's time per stage: a half chunk first puts the first bytes in the next
    stage in half the time (all the chunks in flight share the wire), a half chunk last halves the
    drain, at one chunk more than `chunk_plan`'s."""
    if chunk <= 0:
        raise ValueError("chunk must be > 0")
    half = chunk // 2
    if half == 0 or length <= 2 * chunk:
        return chunk_plan(length, chunk)
    body = [(half + off, ln) for off, ln in chunk_plan(length - 2 * half, chunk)]
    return [(0, half), *body, (length - half, half)]


__all__ = ["StagedPath", "chunk_plan", "pipeline_chunk", "plan_staged_path", "ramped_chunk_plan"]
