"""Phase 1 and the transport half of phase 3: which transports (and, on retry, which rails) serve a request.

One `Router` decides every routing question the engine has, from plain data only: the request's
traits (`RequestTraits`: priority, size, memory kinds, locality, tag), the transports both ends can
use (`reachable`), the transports' capability profiles, the administrator's policy rules
(`tent_core.policy_rules`) and, for retries, the rails' telemetry and health states. No sockets, no
threads, no engine: unit-tested with literals.

The answer for a request is a `Decision`: its memory kinds, the matched rule and the transports that
may serve it, best first, with the rule already applied (denied transports are never in it). Every
later choice for that request derives from the same Decision:

* first choice: the first transport of the Decision that is connected or connects (the caller skips
  transports it found unusable for the peer);
* retry (`next_hop`): another rail of the failed transport (healthy first, then degraded, affinity
  first), within the rule's rails;
* substitution (`next_hop`): the next transport *of the same Decision*: same memory kinds as the
  failed slice, same rule, so `deny_transports` and `transports` hold on failover too;
* synthesized paths (`plan`): a `StagedPath` through host staging on the initiator, or a
  `TargetStagedPath` through the *target's* host staging (the target engine copies between its
  staging slots and its device memory; `tent_core.target_staging`), or both at once. Each leg
  carries its own Decision (the rule of the original request, the transports the planner chose
  first), so legs never re-resolve or lose the request's tag; or a `MappedPath`: a WRITE from a
  file sent straight from a read-only mapping of it (`tent_core.mapped`), where the file transport
  reads through the page cache and the wire copies its sends in the kernel (both declared in
  their CapabilityProfile), the staged path its fallback;
* choosing among them (`candidates`, `plan`): every path that can serve the request is priced by
  `path_cost` (a pipeline of stages: per-chunk time of each stage, the slowest bounds the rest) from
  the transports' advertised rates; the cheapest wins, the direct path on a tie. `explain` returns
  the priced candidates and why the others could not serve, for `Engine.explain` / `tent explain`.

A request no transport survives fails at once: `NoPathError` when nothing can serve the kinds,
`PolicyRejectedError` when the rule removed every candidate, each with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import PathCostConfig
from .errors import NoPathError, PolicyRejectedError
from .policy_rules import RequestTraits, Rule, first_match
from .rail_monitor import RailState
from .slice_scheduler import SliceScheduler
from .telemetry import RailTelemetry
from .types import CapabilityProfile, MemoryKind, OpCode


def rank_transports(
    profiles: Mapping[str, CapabilityProfile],
    local_kind: MemoryKind,
    remote_kind: MemoryKind,
    same_host: bool,
    reachable: Iterable[str],
    allowed: Iterable[str] | None = None,
) -> list[str]:
    """Transports that can serve (local kind, remote kind, locality), best (lowest rank) first.

    `reachable` are the transports both ends offer; `allowed`, when given, further restricts and
    its order wins over the profile rank.
    """
    reach = set(reachable)
    cands = [n for n, p in profiles.items() if n in reach and p.serves(local_kind, remote_kind, same_host)]
    cands.sort(key=lambda n: (profiles[n].rank, n))
    if allowed is not None:
        cands = [n for n in allowed if n in cands]
    return cands


def explain_no_path(
    profiles: Mapping[str, CapabilityProfile],
    local_kind: MemoryKind,
    remote_kind: MemoryKind,
    same_host: bool,
    reachable: Iterable[str],
    excluded: Mapping[str, str] | None = None,
) -> str:
    """A human-readable reason why rank_transports() came back empty. `excluded`: transports left out
    of `reachable` for this buffer alone, with their own reason (Transport.buffer_unreachable)."""
    reach = set(reachable)
    excluded = excluded or {}
    where = "same host" if same_host else "across hosts"
    parts = []
    for name, prof in sorted(profiles.items()):
        if name in excluded:
            parts.append(f"{name}: {excluded[name]}")
        elif name not in reach:
            parts.append(f"{name}: the peer does not offer it or it cannot reach the peer")
        elif not prof.serves(local_kind, remote_kind, same_host):
            parts.append(f"{name}: cannot move {local_kind.value}<->{remote_kind.value} {where}")
    detail = "; ".join(parts) if parts else "no transport is installed and available"
    return f"no transport can move {local_kind.value} <-> {remote_kind.value} memory {where} ({detail})"


@dataclass(frozen=True, eq=False)
class Decision:
    """How one class of requests to one peer is routed. Compared by identity: the engine caches one
    per (peer, kinds, rule) and finds a failed slice's Decision through its batch."""

    local_kind: MemoryKind
    remote_kind: MemoryKind
    transports: tuple[str, ...]  # allowed by the rule, best first; never empty
    rule: Rule | None = None

    @property
    def rails(self) -> frozenset[int] | None:
        """Rail indices the rule pins this flow to (None: any rail)."""
        return None if self.rule is None else self.rule.rails


@dataclass(frozen=True)
class StagedPath:
    """A synthesized two-leg path through a host staging buffer on the initiator.

    `local_stage` moves local buffer <-> staging (same host, the local buffer addressed through
    this engine's own segment); `remote_stage` moves staging <-> peer. WRITE runs the local leg
    first, READ the remote one. `local_order` / `remote_order` are each leg's transports, the
    chosen stage first (then fallbacks for substitution), and `rule` the original request's rule:
    the legs are routed with them and are never resolved again.
    """

    local_stage: str
    remote_stage: str
    op: OpCode
    local_order: tuple[str, ...] = ()
    remote_order: tuple[str, ...] = ()
    rule: Rule | None = None
    local_kind: MemoryKind = MemoryKind.HOST
    remote_kind: MemoryKind = MemoryKind.HOST
    _legs: dict[str, Decision] = field(default_factory=dict, compare=False, repr=False)

    def describe(self) -> str:
        if self.op == OpCode.WRITE:
            return f"local --{self.local_stage}--> staging --{self.remote_stage}--> remote"
        return f"remote --{self.remote_stage}--> staging --{self.local_stage}--> local"

    @property
    def local_leg(self) -> Decision:
        """Routing of the local leg: staging (host) <-> the local buffer, seen as our own segment."""
        leg = self._legs.get("local")
        if leg is None:
            leg = self._legs["local"] = Decision(
                MemoryKind.HOST, self.local_kind, self.local_order or (self.local_stage,), self.rule
            )
        return leg

    @property
    def remote_leg(self) -> Decision:
        """Routing of the remote leg: staging (host) <-> the peer's buffer."""
        leg = self._legs.get("remote")
        if leg is None:
            leg = self._legs["remote"] = Decision(
                MemoryKind.HOST, self.remote_kind, self.remote_order or (self.remote_stage,), self.rule
            )
        return leg


def path_cost(nbytes: int, chunk: int, stages: Sequence[tuple[float, float]]) -> float:
    """Seconds to move `nbytes` through a pipeline of `stages` ((bytes/s, seconds per chunk) each),
    in chunks of `chunk` bytes: the first chunk passes every stage, each later one adds the slowest
    stage's time (stages overlap). A direct path is one stage with chunk = nbytes."""
    if not stages:
        return 0.0
    n = max(1, math.ceil(nbytes / chunk)) if chunk > 0 else 1
    c = min(chunk, nbytes) if chunk > 0 else nbytes
    per = [c / max(bw, 1.0) + fixed for bw, fixed in stages]
    return sum(per) + (n - 1) * max(per)


def pipeline_chunk(length: int, max_chunk: int, min_chunk: int, chunks: int, align: int = 1 << 20) -> int:
    """The chunk a staged pipeline cuts a `length`-byte request into: about `chunks` chunks (the
    pipeline's fill and drain, one chunk's time per stage, stay a small part of the transfer), rounded
    up to `align`, but never below `min_chunk` (every chunk costs a control exchange and a submit per
    leg on both ends, ~0.5 ms of CPU per chunk measured on a 2-core host) nor above `max_chunk` (the
    staging slot). A `max_chunk` under `min_chunk` wins: the slot bounds every chunk."""
    if max_chunk <= 0 or min_chunk <= 0 or chunks <= 0 or align <= 0:
        raise ValueError("max_chunk, min_chunk, chunks and align must be > 0")
    want = -(-max(length, 1) // chunks)
    want = -(-want // align) * align
    return min(max_chunk, max(min_chunk, want))


@dataclass(frozen=True)
class TargetStagedPath:
    """A path through the target's host staging: the target engine copies between its staging slots
    and its device memory (`remote_kind`), and the wire leg moves bytes between the initiator and
    those slots. When the local buffer is device memory the initiator stages too (`local_order`
    set): local device <-> local staging <-> wire <-> target staging <-> target device.

    `wire_kind` is the local end of the wire leg (HOST when the initiator stages), `wire_order` its
    transports to the peer (kinds wire_kind <-> host), `chunk` the target's staging chunk."""

    op: OpCode
    local_kind: MemoryKind
    remote_kind: MemoryKind
    wire_kind: MemoryKind
    wire_order: tuple[str, ...]
    local_order: tuple[str, ...] = ()
    chunk: int = 0
    rule: Rule | None = None
    _legs: dict[str, Decision] = field(default_factory=dict, compare=False, repr=False)

    @property
    def local_staged(self) -> bool:
        return bool(self.local_order)

    def describe(self) -> str:
        wire = self.wire_order[0]
        remote = f"target staging --target copy--> remote {self.remote_kind.value}"
        if self.op == OpCode.WRITE:
            head = f"local {self.local_kind.value}"
            if self.local_staged:
                head += f" --{self.local_order[0]}--> staging"
            return f"{head} --{wire}--> {remote}"
        tail = f"local {self.local_kind.value}"
        if self.local_staged:
            tail = f"staging --{self.local_order[0]}--> " + tail
        return f"remote {self.remote_kind.value} --target copy--> target staging --{wire}--> {tail}"

    @property
    def wire_leg(self) -> Decision:
        leg = self._legs.get("wire")
        if leg is None:
            leg = self._legs["wire"] = Decision(self.wire_kind, MemoryKind.HOST, self.wire_order, self.rule)
        return leg

    @property
    def local_leg(self) -> Decision:
        """Routing of the local leg (staging <-> the local buffer, seen as our own segment)."""
        leg = self._legs.get("local")
        if leg is None:
            leg = self._legs["local"] = Decision(MemoryKind.HOST, self.local_kind, self.local_order, self.rule)
        return leg


@dataclass(frozen=True)
class MappedPath:
    """A WRITE from a local file sent straight from a read-only shared mapping of it
    (`tent_core.mapped`): the file's range is mapped, exposed to the wire transport as host memory and
    sent in one request per mapping window; no staging copy. Planned only where the file transport
    reads through the page cache (the mapping shows what it would read) and the wire transports copy
    their sends in the kernel (a page truncated away fails the send instead of the process).

    `wire_order` are the wire's transports (host <-> `remote_kind`), best first; `file_stage` the
    file transport the staged path would read with (the one whose page-cache reads the mapping
    stands in for); `fallback` that staged path, taken when the file cannot be mapped."""

    op: OpCode
    file_stage: str
    wire_order: tuple[str, ...]
    remote_kind: MemoryKind = MemoryKind.HOST
    rule: Rule | None = None
    fallback: StagedPath | None = None
    _legs: dict[str, Decision] = field(default_factory=dict, compare=False, repr=False)

    def describe(self) -> str:
        return f"local file --mmap (read-only)--> mapping --{self.wire_order[0]}--> remote {self.remote_kind.value}"

    @property
    def wire_leg(self) -> Decision:
        """Routing of the one leg: the mapping (host memory) -> the peer's buffer."""
        leg = self._legs.get("wire")
        if leg is None:
            leg = self._legs["wire"] = Decision(MemoryKind.HOST, self.remote_kind, self.wire_order, self.rule)
        return leg


Path = Decision | StagedPath | TargetStagedPath | MappedPath

# also the order that breaks a tie of cost (direct first)
PATH_KINDS = ("direct", "mapped", "initiator-staged", "target-staged", "both-staged")


def path_kind(path: Path) -> str:
    if isinstance(path, Decision):
        return "direct"
    if isinstance(path, StagedPath):
        return "initiator-staged"
    if isinstance(path, MappedPath):
        return "mapped"
    return "both-staged" if path.local_staged else "target-staged"


def describe_path(path: Path) -> str:
    if isinstance(path, Decision):
        return f"local {path.local_kind.value} --{path.transports[0]}--> remote {path.remote_kind.value}"
    return path.describe()


@dataclass(frozen=True)
class Candidate:
    """One way to serve a request: `path` with its estimated `cost_s` and `stages` ((name, bytes/s,
    seconds per chunk) each), or None with the `reason` it cannot serve."""

    kind: str
    path: Path | None
    cost_s: float = math.inf
    reason: str = ""
    stages: tuple[tuple[str, float, float], ...] = ()
    chunk: int = 0

    @property
    def viable(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class Hop:
    """Where a failed slice goes next: `rail` is a position in the rails the caller passed for
    `transport` (a retry on the same transport); None means another transport (a substitution):
    the caller connects it and picks a rail."""

    transport: str
    rail: int | None


@dataclass(frozen=True)
class RetryLimits:
    max_retries_per_slice: int = 8
    max_transport_failovers: int = 3


class Router:
    """The engine's one routing policy; see the module docstring. Immutable after construction
    (profiles and rules), so one instance is shared by every thread of an engine."""

    def __init__(
        self,
        profiles: Mapping[str, CapabilityProfile],
        rules: Sequence[Rule] = (),
        limits: RetryLimits | None = None,
        cost: PathCostConfig | None = None,
        staging_chunk: int = 4 << 20,
        target_chunking: tuple[int, int] = (4 << 20, 8),
        staging_chunking: tuple[int, int] | None = None,
        mapped: bool = True,
    ) -> None:
        self.profiles = dict(profiles)
        self.rules = tuple(rules)
        self.limits = limits or RetryLimits()
        self.cost = cost or PathCostConfig()
        self.staging_chunk = staging_chunk  # the initiator's own staging buffer: its largest chunk
        # (smallest chunk, chunks per request) of an initiator-staged request; by default every
        # chunk is a whole buffer
        self.staging_chunking = staging_chunking or (staging_chunk, 8)
        # (smallest chunk, chunks per request) of a target-staged request (path_planner.pipeline_chunk)
        self.target_chunking = target_chunking
        self.mapped = mapped  # plan MappedPaths (EngineConfig.mapped_paths)
        self._ranked: dict[tuple[MemoryKind, MemoryKind, bool, frozenset[str]], tuple[str, ...]] = {}

    # ---- first choice ----------------------------------------------------------------------

    def match(self, traits: RequestTraits) -> Rule | None:
        """The administrator rule deciding for `traits` (first match), or None."""
        return first_match(self.rules, traits) if self.rules else None

    def ranked(
        self, local_kind: MemoryKind, remote_kind: MemoryKind, same_host: bool, reachable: Collection[str]
    ) -> tuple[str, ...]:
        """Transports able to serve the kinds, best first, before any rule."""
        key = (local_kind, remote_kind, same_host, frozenset(reachable))
        out = self._ranked.get(key)
        if out is None:
            out = self._ranked[key] = tuple(rank_transports(self.profiles, local_kind, remote_kind, same_host, key[3]))
        return out

    def decide(self, traits: RequestTraits, reachable: Collection[str], rule: Rule | None | bool = True,
               excluded: Mapping[str, str] | None = None) -> Decision:
        """The Decision for a direct path. `rule` True matches the rules against `traits`; pass a
        Rule (or None) when the caller already matched. `excluded`: transports kept out of
        `reachable` for the remote buffer alone, with the reason (only for the error text). Raises
        NoPathError / PolicyRejectedError."""
        if rule is True:
            rule = self.match(traits)
        order = self.ranked(traits.local_kind, traits.remote_kind, traits.same_host, reachable)
        if not order:
            raise NoPathError(
                explain_no_path(self.profiles, traits.local_kind, traits.remote_kind, traits.same_host, reachable,
                                excluded)
            )
        return Decision(traits.local_kind, traits.remote_kind, self._apply_rule(order, rule), rule or None)

    @staticmethod
    def _apply_rule(order: Sequence[str], rule: Rule | None | bool) -> tuple[str, ...]:
        if not isinstance(rule, Rule):
            return tuple(order)
        allowed = rule.filter_transports(order)
        if not allowed:
            raise PolicyRejectedError(
                f"policy rule {rule.name!r} allows none of the transports that could serve this request ({', '.join(order)})"
            )
        return tuple(allowed)

    def plan(
        self,
        traits: RequestTraits,
        reachable: Collection[str],
        local_reachable: Collection[str],
        op: OpCode,
        rule: Rule | None | bool = True,
        remote_staging: Mapping[str, Any] | None = None,
        excluded: Mapping[str, str] | None = None,
    ) -> Path:
        """The cheapest path that serves the request (see `candidates`): a direct Decision, a
        StagedPath through host staging here, a TargetStagedPath through the peer's staging (and
        maybe ours). NoPathError with every candidate's reason when none can serve;
        PolicyRejectedError when the rule removed every transport of every candidate. `excluded`:
        transports the caller kept out of `reachable` for this remote buffer, with their reasons."""
        if rule is True:
            rule = self.match(traits)
        cands = self.candidates(traits, reachable, local_reachable, op, rule, remote_staging, excluded=excluded)
        viable = [c for c in cands if c.viable]
        if not viable:
            policy = [c for c in cands if c.reason.startswith("policy: ")]
            if policy:  # something could have served it, but the rule forbids it
                raise PolicyRejectedError(policy[0].reason[len("policy: "):])
            lk, rk, same = traits.local_kind, traits.remote_kind, traits.same_host
            raise NoPathError(
                explain_no_path(self.profiles, lk, rk, same, reachable, excluded)
                + "; no staged path either ("
                + "; ".join(f"{c.kind}: {c.reason}" for c in cands if c.kind != "direct")
                + ")"
            )
        best = min(viable, key=lambda c: (c.cost_s, PATH_KINDS.index(c.kind)))
        return best.path  # type: ignore[return-value]

    def _rate(self, transport: str, same_host: bool) -> float:
        gbps = self.profiles[transport].bandwidth_gbps if transport in self.profiles else 0.0
        if gbps <= 0:
            gbps = self.cost.same_host_gbps if same_host else self.cost.cross_host_gbps
        return gbps * 1e9

    def candidates(
        self,
        traits: RequestTraits,
        reachable: Collection[str],
        local_reachable: Collection[str],
        op: OpCode,
        rule: Rule | None | bool = True,
        remote_staging: Mapping[str, Any] | None = None,
        nbytes: int | None = None,
        excluded: Mapping[str, str] | None = None,
    ) -> list[Candidate]:
        """Every way to serve the request, priced for `nbytes` (default: the cost model's reference
        size), in the order direct, initiator-staged, mapped, target-staged, both-staged. Pure: the peer's
        staging offer (`remote_staging`: kinds, chunk, per-kind rates) comes in as data."""
        if rule is True:
            rule = self.match(traits)
        rule = rule if isinstance(rule, Rule) else None
        lk, rk, same = traits.local_kind, traits.remote_kind, traits.same_host
        size = max(1, nbytes if nbytes is not None else self.cost.reference_bytes)
        ov, rtt = self.cost.leg_overhead_s, self.cost.control_rtt_s
        out: list[Candidate] = []

        def priced(kind: str, make: Any, stages: list[tuple[str, float, float]], chunk: int) -> Candidate:
            try:
                path = make()
            except PolicyRejectedError as exc:
                return Candidate(kind, None, reason=f"policy: {exc}")
            cost = path_cost(size, chunk, [(bw, fixed) for _, bw, fixed in stages])
            return Candidate(kind, path, cost, "", tuple(stages), chunk)

        # direct
        order = self.ranked(lk, rk, same, reachable)
        if order:
            out.append(priced("direct", lambda: self.decide(traits, reachable, rule),
                              [(order[0], self._rate(order[0], same), ov)], size))
        else:
            out.append(Candidate("direct", None, reason=explain_no_path(self.profiles, lk, rk, same, reachable, excluded)))

        # initiator-staged (the existing synthesized path)
        if lk == MemoryKind.HOST:
            out.append(Candidate("initiator-staged", None, reason="n/a: local memory is host memory already"))
        else:
            remote = self.ranked(MemoryKind.HOST, rk, same, reachable)
            local = self.ranked(MemoryKind.HOST, lk, True, local_reachable)
            if not remote or not local:
                why = (f"no local transport moves host<->{lk.value}" if not local
                       else f"no transport moves host<->{rk.value} to the peer")
                out.append(Candidate("initiator-staged", None, reason=why))
            else:
                chunk = pipeline_chunk(size, self.staging_chunk, *self.staging_chunking)  # as staged.py cuts it
                out.append(priced(
                    "initiator-staged",
                    lambda: StagedPath(self._apply_rule(local, rule)[0], self._apply_rule(remote, rule)[0], op,
                                       self._apply_rule(local, rule), self._apply_rule(remote, rule), rule, lk, rk),
                    [(f"{local[0]} (local copy)", self._rate(local[0], True), ov),
                     (remote[0], self._rate(remote[0], same), ov)],
                    chunk,
                ))

        out.append(self._mapped_candidate(traits, reachable, local_reachable, op, rule, out, priced, size))

        # target-staged and both-staged
        offer = remote_staging or {}
        kinds = {str(k) for k in offer.get("kinds", ())}
        tchunk = int(offer.get("chunk", 0) or 0)  # the slot: the largest chunk
        trate = float((offer.get("gbps") or {}).get(rk.value, 0) or 0) * 1e9 or self.cost.same_host_gbps * 1e9
        if rk == MemoryKind.HOST:
            na = "n/a: remote memory is host memory already"
            out += [Candidate("target-staged", None, reason=na), Candidate("both-staged", None, reason=na)]
            return out
        if rk.value not in kinds or tchunk <= 0:
            why = "the peer offers no staging" if not kinds else f"the peer does not stage {rk.value} memory"
            out += [Candidate("target-staged", None, reason=why), Candidate("both-staged", None, reason=why)]
            return out
        target_stage = ("target copy", trate, ov + rtt)
        # priced with the chunks the pipeline will cut `size` into; the path carries the slot (its largest
        # chunk): it is kept for every later request of its class, whatever their sizes
        tprice = pipeline_chunk(size, tchunk, *self.target_chunking)
        wire = self.ranked(lk, MemoryKind.HOST, same, reachable)
        if wire:
            out.append(priced(
                "target-staged",
                lambda: TargetStagedPath(op, lk, rk, lk, self._apply_rule(wire, rule), (), tchunk, rule),
                [(wire[0], self._rate(wire[0], same), ov), target_stage],
                tprice,
            ))
        else:
            out.append(Candidate("target-staged", None, reason=f"no transport moves {lk.value}<->host to the peer"))
        if lk == MemoryKind.HOST:
            out.append(Candidate("both-staged", None, reason="n/a: local memory is host memory already"))
            return out
        hwire = self.ranked(MemoryKind.HOST, MemoryKind.HOST, same, reachable)
        local = self.ranked(MemoryKind.HOST, lk, True, local_reachable)
        if not hwire or not local:
            why = (f"no local transport moves host<->{lk.value}" if not local
                   else "no transport moves host<->host to the peer")
            out.append(Candidate("both-staged", None, reason=why))
        else:
            chunk = min(tchunk, self.staging_chunk)
            out.append(priced(
                "both-staged",
                lambda: TargetStagedPath(op, lk, rk, MemoryKind.HOST, self._apply_rule(hwire, rule),
                                         self._apply_rule(local, rule), chunk, rule),
                [(f"{local[0]} (local copy)", self._rate(local[0], True), ov),
                 (hwire[0], self._rate(hwire[0], same), ov), target_stage],
                min(tprice, self.staging_chunk),
            ))
        return out

    def mapped_block(self, traits: RequestTraits, reachable: Collection[str], local_reachable: Collection[str],
                     op: OpCode, rule: Rule | None) -> tuple[str, tuple[str, ...], tuple[str, ...]] | str:
        """(file transport, its order after the rule, wire transports after the rule) of a mapped
        path for the request, or why there is none. See `MappedPath`."""
        lk, rk, same = traits.local_kind, traits.remote_kind, traits.same_host
        if not self.mapped:
            return "off (mapped_paths = false)"
        if lk != MemoryKind.FILE:
            return f"n/a: local memory is {lk.value}, not a file"
        if op != OpCode.WRITE:
            # a READ would land in a writable shared mapping: written back by the kernel when it
            # pleases, past the file transport, with no error reported to the request
            return "n/a: only a WRITE (file -> remote) is sent from a mapping; a READ into the file is staged"
        files = self.ranked(MemoryKind.HOST, MemoryKind.FILE, True, local_reachable)
        if not files:
            return "no local transport reads the file"
        files = self._apply_rule(files, rule)
        if not self.profiles[files[0]].page_cache_files:
            return f"{files[0]} does not read the file through the page cache (e.g. O_DIRECT): a mapping would not stand in for it"
        wire = self.ranked(MemoryKind.HOST, rk, same, reachable)
        if not wire:
            return f"no transport moves host<->{rk.value} to the peer"
        safe = tuple(t for t in wire if self.profiles[t].kernel_copy_sends)
        if not safe:
            return (f"no transport to the peer copies its sends in the kernel ({', '.join(wire)} may copy a mapped "
                    "page in user space, where a truncated file would kill the process)")
        return files[0], files, self._apply_rule(safe, rule)

    def _mapped_candidate(self, traits: RequestTraits, reachable: Collection[str], local_reachable: Collection[str],
                          op: OpCode, rule: Rule | None, so_far: Sequence[Candidate], priced: Any, size: int) -> Candidate:
        try:
            block = self.mapped_block(traits, reachable, local_reachable, op, rule)
        except PolicyRejectedError as exc:
            return Candidate("mapped", None, reason=f"policy: {exc}")
        if isinstance(block, str):
            return Candidate("mapped", None, reason=block)
        file_stage, _, wire = block
        staged = next((c.path for c in so_far if c.kind == "initiator-staged" and c.viable), None)
        return priced(
            "mapped",
            lambda: MappedPath(op, file_stage, wire, traits.remote_kind, rule,
                               staged if isinstance(staged, StagedPath) else None),
            [(wire[0], self._rate(wire[0], traits.same_host), self.cost.leg_overhead_s)],
            size,
        )

    def plan_staged(
        self,
        local_kind: MemoryKind,
        remote_kind: MemoryKind,
        same_host: bool,
        reachable: Collection[str],
        local_reachable: Collection[str],
        op: OpCode,
        rule: Rule | None = None,
    ) -> StagedPath | None:
        """The staged path, or None when staging cannot help. The rule applies to both legs (they
        serve the original request); PolicyRejectedError when it leaves a leg without a transport."""
        if local_kind == MemoryKind.HOST:
            return None  # host memory is already the staging kind
        remote = self.ranked(MemoryKind.HOST, remote_kind, same_host, reachable)
        local = self.ranked(MemoryKind.HOST, local_kind, True, local_reachable)
        if not remote or not local:
            return None
        remote = self._apply_rule(remote, rule)
        local = self._apply_rule(local, rule)
        return StagedPath(local[0], remote[0], op, local, remote, rule, local_kind, remote_kind)

    # ---- rails --------------------------------------------------------------------------------

    @staticmethod
    def allowed_rails(decision: Decision, indices: Sequence[int]) -> list[int]:
        """Positions in `indices` (a transport's rail indices) the Decision's rule admits."""
        pin = decision.rails
        if pin is None:
            return list(range(len(indices)))
        return [i for i, idx in enumerate(indices) if idx in pin]

    # ---- failures -----------------------------------------------------------------------------

    def next_hop(
        self,
        decision: Decision,
        failed_transport: str,
        rails: Sequence[RailTelemetry],
        states: Sequence[RailState],
        failed_pos: int,
        attempt: int,
        unusable: Collection[str] = (),
    ) -> Hop | None:
        """Where a slice that failed (retryably) on `failed_transport` goes for attempt `attempt`.

        `rails`/`states` are the failed transport's rails that the Decision's rule admits (empty if
        the transport has no route any more) and `failed_pos` the failed rail's position among them
        (-1 if it is not among them). `unusable` are transports the caller found dead for this peer.

        Order (paper 4.3): another rail of the same transport, healthy before degraded, affinity
        first; the failed rail itself again only when it is the transport's only rail and within
        half the retry budget; then the next transport of the Decision (same kinds, same rule). A
        rule that pins rails pins the flow to this transport too. None: give up.
        """
        lim = self.limits
        if attempt > lim.max_retries_per_slice:
            return None
        if rails:
            pos = SliceScheduler.pick_retry_rail(rails, failed_pos, states, ())
            if pos is not None and (pos != failed_pos or len(rails) == 1):
                if pos != failed_pos or attempt <= lim.max_retries_per_slice // 2:
                    return Hop(failed_transport, pos)
            if decision.rails is not None:
                return None  # policy pins this flow to these rails of this transport
            if attempt > lim.max_transport_failovers + 1 and len(rails) > 1:
                return None
        for name in decision.transports:
            if name != failed_transport and name not in unusable:
                return Hop(name, None)
        return None


__all__ = [
    "PATH_KINDS",
    "Candidate",
    "Decision",
    "Hop",
    "MappedPath",
    "Path",
    "TargetStagedPath",
    "describe_path",
    "path_cost",
    "path_kind",
    "RequestTraits",
    "RetryLimits",
    "Router",
    "StagedPath",
    "explain_no_path",
    "rank_transports",
]
