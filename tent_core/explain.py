"""Why a request takes the path it takes: `Engine.explain` and `tent explain`.

`explain_request` resolves the remote range like submit does (the peer, its buffer and memory kind,
same host or not), asks the engine's Router for every candidate path priced for this request's size
(`Router.candidates`) and reports them with the plan submit would use (the plan cached for the
class of the request). Nothing moves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .policy_rules import RequestTraits
from .request import Request
from .routing import Candidate, describe_path, path_kind
from .types import MemoryKind, OpCode, Priority


@dataclass
class PathExplanation:
    op: str
    local_kind: str
    remote: str
    remote_kind: str
    same_host: bool
    length: int
    chosen: str  # path kind: direct, initiator-staged, target-staged, both-staged
    route: str  # the chosen path, leg by leg
    rule: str | None
    candidates: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "local_kind": self.local_kind, "remote": self.remote, "remote_kind": self.remote_kind,
            "same_host": self.same_host, "length": self.length, "chosen": self.chosen, "route": self.route,
            "rule": self.rule, "candidates": self.candidates,
        }

    def __str__(self) -> str:
        where = "same host" if self.same_host else "another host"
        lines = [
            f"{self.op} {self.length} bytes: local {self.local_kind} <-> {self.remote} ({self.remote_kind}, {where})",
            f"chosen: {self.chosen}: {self.route}" + (f"  [rule {self.rule}]" if self.rule else ""),
            "candidates:",
        ]
        for c in self.candidates:
            if c["viable"]:
                stages = ", ".join(f"{s['name']} {s['gbps']:.3g} GB/s" for s in c["stages"])
                lines.append(f"  {c['kind']:<17} {c['cost_ms']:9.3f} ms  {c['route']}  ({stages}; chunk {c['chunk']})")
            else:
                lines.append(f"  {c['kind']:<17} {'-':>9}     {c['reason']}")
        return "\n".join(lines)


def _candidate_row(c: Candidate) -> dict[str, Any]:
    row: dict[str, Any] = {"kind": c.kind, "viable": c.viable, "reason": c.reason}
    if c.viable:
        assert c.path is not None
        row.update(
            cost_ms=c.cost_s * 1e3 if math.isfinite(c.cost_s) else None,
            route=describe_path(c.path),
            chunk=c.chunk,
            stages=[{"name": n, "gbps": bw / 1e9, "per_chunk_s": fixed} for n, bw, fixed in c.stages],
        )
    return row


def explain_request(engine: Any, request: Request | None = None, *, op: OpCode | str | None = None,
                    local_kind: MemoryKind | str | None = None, remote: str | None = None, remote_offset: int = 0,
                    length: int | None = None, priority: Priority = Priority.MID, tag: str | None = None) -> PathExplanation:
    """See `Engine.explain`."""
    if request is not None:
        op, remote, remote_offset, length = request.op, request.remote, request.remote_offset, request.length
        local_kind, priority, tag = request.local.kind, request.priority, request.tag
    if remote is None or op is None:
        raise ValueError("explain needs a Request, or op= and remote=")
    op = OpCode[op.upper()] if isinstance(op, str) else OpCode(op)
    lk = MemoryKind(local_kind) if local_kind is not None else MemoryKind.HOST
    peers, router = engine.peers, engine.router
    peer, seg = peers.resolve(remote, engine.config.control_timeout_s)
    n = length if length is not None else 1
    pieces = peers.map_remote(peer, seg, remote_offset, max(1, n), op)
    rbuf = pieces[0][0]
    if length is None:
        n = rbuf.offset + rbuf.length - remote_offset
    traits = RequestTraits(Priority(priority), n, lk, rbuf.kind, peer.same_host, tag)
    rule = router.match(traits)
    local_reachable = peers.get(engine.engine_id).reachable if lk != MemoryKind.HOST else ()
    chosen = peers.plan(peer, traits, op, rule, rbuf.hidden, rbuf.unreachable)
    reachable = tuple(t for t in peer.reachable if t not in rbuf.hidden)
    cands = router.candidates(traits, reachable, local_reachable, op, rule, peer.info.staging, nbytes=n,
                              excluded=rbuf.unreachable)
    return PathExplanation(
        op=op.name, local_kind=lk.value, remote=remote, remote_kind=rbuf.kind.value, same_host=peer.same_host,
        length=n, chosen=path_kind(chosen), route=describe_path(chosen), rule=rule.name if rule else None,
        candidates=[_candidate_row(c) for c in cands],
    )


__all__ = ["PathExplanation", "explain_request"]
