"""The Router as a pure policy: first choice, rules, retries, substitution and staged plans from literals."""

from __future__ import annotations

import pytest

from tent_core.config import SchedulerConfig
from tent_core.errors import NoPathError, PolicyRejectedError
from tent_core.policy_rules import RequestTraits, parse_rules
from tent_core.rail_monitor import RailState
from tent_core.routing import Decision, Hop, RetryLimits, Router, StagedPath
from tent_core.telemetry import RailTelemetry
from tent_core.types import CapabilityProfile, MemoryKind, OpCode, Priority

H, C, F = MemoryKind.HOST, MemoryKind.CUDA, MemoryKind.FILE
OK, DEG, PAUSED = RailState.HEALTHY, RailState.DEGRADED, RailState.PAUSED

PROFILES = {
    "shm": CapabilityProfile(frozenset({(H, H)}), same_host=True, cross_host=False, rank=10),
    "tcp": CapabilityProfile(frozenset({(H, H)}), same_host=True, cross_host=True, rank=50),
    "rdma": CapabilityProfile(frozenset({(H, H), (H, C)}), same_host=True, cross_host=True, rank=30),
    "gds": CapabilityProfile(frozenset({(H, F)}), same_host=True, cross_host=False, rank=20),
    "nvlink": CapabilityProfile(frozenset({(C, C), (H, C), (C, H)}), same_host=True, cross_host=False, rank=5),
}
ALL = tuple(PROFILES)


def traits(local=H, remote=H, same_host=True, tag=None, prio=Priority.MID, size=1 << 20):
    return RequestTraits(prio, size, local, remote, same_host, tag)


def rails(n):
    cfg = SchedulerConfig()
    return [RailTelemetry(i, 0.0, 1.0, config=cfg) for i in range(n)]


def test_first_choice_orders_by_rank_and_the_rule_restricts():
    r = Router(PROFILES)
    d = r.decide(traits(), ALL)
    assert d.transports == ("shm", "rdma", "tcp") and d.rule is None and (d.local_kind, d.remote_kind) == (H, H)
    assert r.decide(traits(same_host=False), ALL).transports == ("rdma", "tcp")
    assert r.decide(traits(), ("tcp",)).transports == ("tcp",)  # the peer offers only tcp
    ruled = Router(PROFILES, parse_rules([{"name": "k", "match": {"tag": "kv"}, "transports": ["tcp", "shm"], "rails": [1]}]))
    d = ruled.decide(traits(tag="kv"), ALL)
    assert d.transports == ("tcp", "shm") and d.rule is not None and d.rails == frozenset({1})
    assert ruled.decide(traits(), ALL).transports == ("shm", "rdma", "tcp")
    with pytest.raises(NoPathError, match="file"):
        r.decide(traits(F, F), ALL)
    deny = Router(PROFILES, parse_rules([{"name": "nope", "match": {}, "deny_transports": ["shm", "rdma", "tcp"]}]))
    with pytest.raises(PolicyRejectedError, match="nope"):
        deny.decide(traits(), ALL)


def test_retry_prefers_another_healthy_rail_then_degraded_then_the_same_one():
    r = Router(PROFILES, limits=RetryLimits(8, 3))
    d = r.decide(traits(), ALL)
    assert r.next_hop(d, "shm", rails(3), [OK, OK, OK], 0, 1) == Hop("shm", 1)
    assert r.next_hop(d, "shm", rails(3), [DEG, PAUSED, DEG], 0, 1) == Hop("shm", 2)  # the failed rail is degraded by now
    # a single rail is retried itself within half the budget, then the transport is substituted
    assert r.next_hop(d, "shm", rails(1), [OK], 0, 4) == Hop("shm", 0)
    assert r.next_hop(d, "shm", rails(1), [OK], 0, 5) == Hop("rdma", None)
    # past the whole budget: give up
    assert r.next_hop(d, "shm", rails(3), [OK, OK, OK], 0, 9) is None


def test_substitution_stays_within_the_failed_slices_kinds():
    """Regression: substitution used to take a replacement from any kind pair the peer had seen,
    e.g. a file transport for a host<->host slice."""
    r = Router(PROFILES)
    host = r.decide(traits(H, H), ALL)
    r.decide(traits(H, F), ALL)  # another kind pair the peer serves: must not leak into `host`
    hops = []
    unusable: set[str] = set()
    while (hop := r.next_hop(host, "shm", [], [], -1, 5, unusable)) is not None:
        hops.append(hop.transport)
        unusable.add(hop.transport)
    assert hops == ["rdma", "tcp"]  # never gds, never nvlink
    assert all(PROFILES[t].serves(H, H, True) for t in hops)


def test_substitution_obeys_the_matched_rule():
    """Regression: failover re-routed without the rule, so deny_transports did not hold."""
    r = Router(PROFILES, parse_rules([{"name": "no-tcp-ckpt", "match": {"tag": "ckpt"}, "deny_transports": ["tcp", "rdma"]}]))
    d = r.decide(traits(tag="ckpt"), ALL)
    assert d.transports == ("shm",)
    assert r.next_hop(d, "shm", rails(1), [OK], 0, 5) is None  # nothing allowed is left: fail, never tcp
    pinned = Router(PROFILES, parse_rules([{"name": "pin", "match": {"tag": "kv"}, "rails": [0]}]))
    d = pinned.decide(traits(tag="kv"), ALL)
    assert pinned.allowed_rails(d, [0, 1, 2]) == [0]
    # the flow is pinned to rail 0 of its transport: retried there, never elsewhere
    assert pinned.next_hop(d, "shm", rails(1), [OK], 0, 2) == Hop("shm", 0)
    assert pinned.next_hop(d, "shm", rails(1), [OK], 0, 5) is None


def test_staged_plan_applies_the_rule_to_both_legs_and_binds_its_choices():
    r = Router(PROFILES)
    p = r.plan(traits(F, H, same_host=False), ALL, ALL, OpCode.WRITE)
    assert isinstance(p, StagedPath) and (p.local_stage, p.remote_stage) == ("gds", "rdma")
    assert p.remote_leg.transports == ("rdma", "tcp") and p.local_leg.transports == ("gds",)
    assert (p.remote_leg.local_kind, p.remote_leg.remote_kind) == (H, H)
    assert (p.local_leg.local_kind, p.local_leg.remote_kind) == (H, F)
    assert p.remote_leg is p.remote_leg  # one Decision per leg: recovery finds it by identity
    ruled = Router(PROFILES, parse_rules([{"name": "files", "match": {"local_kind": "file"}, "transports": ["gds", "tcp"]}]))
    p = ruled.plan(traits(F, H, same_host=False), ALL, ALL, OpCode.WRITE)
    assert isinstance(p, StagedPath) and p.remote_stage == "tcp" and p.remote_leg.transports == ("tcp",)
    assert p.rule is not None and p.remote_leg.rule is p.rule
    deny = Router(PROFILES, parse_rules([{"name": "no-gds", "match": {"local_kind": "file"}, "deny_transports": ["gds"]}]))
    with pytest.raises(PolicyRejectedError, match="no-gds"):
        deny.plan(traits(F, H), ALL, ALL, OpCode.WRITE)
    # a direct path wins over staging; nothing at all is a clear error
    assert isinstance(r.plan(traits(H, F), ALL, ALL, OpCode.READ), Decision)
    with pytest.raises(NoPathError, match="no staged path"):
        r.plan(traits(F, F, same_host=False), ALL, ALL, OpCode.READ)
