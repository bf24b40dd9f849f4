"""Phase 1: which transports may serve a request. Pure functions over plain data."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .types import CapabilityProfile, MemoryKind


def rank_transports(
    profiles: Mapping[str, CapabilityProfile],
    local_kind: MemoryKind,
    remote_kind: MemoryKind,
    same_host: bool,
    reachable: Iterable[str],
    allowed: Iterable[str] | None = None,
) -> list[str]:
    """Transports that can serve (local kind, remote kind, locality), best first.

    `reachable` are the transports both ends offer; `allowed` (policy rules) further
    restricts and, when given as a sequence, its order wins over the profile rank.
    """
    reach = set(reachable)
    cands = [n for n, p in profiles.items() if n in reach and p.serves(local_kind, remote_kind, same_host)]
    cands.sort(key=lambda n: (profiles[n].rank, n))
    if allowed is not None:
        order = list(allowed)
        cands = [n for n in order if n in cands]
    return cands


def explain_no_path(
    profiles: Mapping[str, CapabilityProfile],
    local_kind: MemoryKind,
    remote_kind: MemoryKind,
    same_host: bool,
    reachable: Iterable[str],
) -> str:
    """A human-readable reason why rank_transports() came back empty."""
    reach = set(reachable)
    where = "same host" if same_host else "across hosts"
    parts = []
    for name, prof in sorted(profiles.items()):
        if name not in reach:
            parts.append(f"{name}: peer does not offer it")
        elif not prof.serves(local_kind, remote_kind, same_host):
            parts.append(f"{name}: cannot move {local_kind.value}<->{remote_kind.value} {where}")
    detail = "; ".join(parts) if parts else "no transport is installed and available"
    return f"no transport can move {local_kind.value} <-> {remote_kind.value} memory {where} ({detail})"
