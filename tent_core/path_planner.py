"""Phase 1b: synthesizing a path when no single transport serves a request.

Pure functions over capability profiles. A synthesized path moves the payload through a
host-memory staging buffer on the initiator: one stage between the local buffer and the
staging buffer (a same-host transport, the local buffer addressed through this engine's
own segment), one stage between the staging buffer and the remote buffer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .resolver import rank_transports
from .types import CapabilityProfile, MemoryKind, OpCode


@dataclass(frozen=True)
class StagedPath:
    """`local_stage` moves local buffer <-> staging (same host); `remote_stage` staging <-> peer."""

    local_stage: str
    remote_stage: str
    # order of the stages for this op: WRITE runs local stage first, READ runs remote first
    op: OpCode

    def describe(self) -> str:
        if self.op == OpCode.WRITE:
            return f"local --{self.local_stage}--> staging --{self.remote_stage}--> remote"
        return f"remote --{self.remote_stage}--> staging --{self.local_stage}--> local"


def plan_staged_path(
    profiles: Mapping[str, CapabilityProfile],
    local_kind: MemoryKind,
    remote_kind: MemoryKind,
    same_host: bool,
    reachable: Iterable[str],
    op: OpCode,
) -> StagedPath | None:
    """A two-stage path through local host staging, or None.

    Only the initiator's side is staged: the remote buffer must be reachable by some
    transport from host memory (`(HOST, remote_kind)`), and the local buffer must be
    reachable from host memory on this host (`(HOST, local_kind)`, same host).
    """
    if local_kind == MemoryKind.HOST:
        return None  # staging on our side cannot help: host memory is already the staging kind
    reach = list(reachable)
    remote = rank_transports(profiles, MemoryKind.HOST, remote_kind, same_host, reach)
    local = rank_transports(profiles, MemoryKind.HOST, local_kind, True, profiles.keys())
    if not remote or not local:
        return None
    return StagedPath(local_stage=local[0], remote_stage=remote[0], op=op)


def chunk_plan(length: int, chunk: int) -> list[tuple[int, int]]:
    """(offset, length) chunks covering [0, length)."""
    if chunk <= 0:
        raise ValueError("chunk must be > 0")
    return [(off, min(chunk, length - off)) for off in range(0, length, chunk)]
