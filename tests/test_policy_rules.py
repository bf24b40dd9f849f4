"""Administrator policy rules: pure matching, then enforced by a real engine over two loopback rails."""

from __future__ import annotations

import pytest
from peers import Peer

from tent_core import READ, Engine, PolicyRejectedError, Priority, Request
from tent_core.errors import InvalidRequestError
from tent_core.policy_rules import RequestTraits, first_match, parse_rules
from tent_core.types import MemoryKind

H, F = MemoryKind.HOST, MemoryKind.FILE

RULES = [
    {"name": "kv-fast", "match": {"priority": "HIGH", "tag": "kv"}, "rails": [0]},
    {"name": "no-tcp-ckpt", "match": {"tag": "checkpoint"}, "deny_transports": ["tcp"]},
    {"name": "big-same-host", "match": {"min_size": 1 << 20, "same_host": True}, "transports": ["tcp", "shm"]},
]


def traits(prio=Priority.MID, size=4096, tag=None, same_host=True, local=H, remote=H):
    return RequestTraits(prio, size, local, remote, same_host, tag)


def test_first_match_wins_and_fields_match():
    rules = parse_rules(RULES)
    assert first_match(rules, traits(Priority.HIGH, tag="kv")).name == "kv-fast"
    assert first_match(rules, traits(Priority.LOW, tag="kv")) is None
    assert first_match(rules, traits(tag="checkpoint")).name == "no-tcp-ckpt"
    assert first_match(rules, traits(size=2 << 20)).name == "big-same-host"
    assert first_match(rules, traits(size=2 << 20, same_host=False)) is None
    r = first_match(rules, traits(size=2 << 20))
    assert r.filter_transports(["shm", "tcp"]) == ["tcp", "shm"]  # the rule's order wins
    assert first_match(rules, traits(tag="checkpoint")).filter_transports(["shm", "tcp"]) == ["shm"]
    assert first_match(rules, traits(Priority.HIGH, tag="kv")).filter_rails([0, 1, 2]) == [0]
    kinds = parse_rules([{"match": {"local_kind": "file", "max_size": 10}}])
    assert first_match(kinds, traits(local=F, size=10)) is not None
    assert first_match(kinds, traits(local=F, size=11)) is None


@pytest.mark.parametrize(
    "bad",
    [
        [{"match": {"colour": "red"}}],
        [{"name": "x", "match": {"priority": "URGENT"}}],
        [{"name": "x", "when": {}}],
        ["not a table"],
        [{"match": {"local_kind": "tape"}}],
    ],
)
def test_bad_rules_are_rejected_with_a_clear_error(bad):
    with pytest.raises(ValueError):
        parse_rules(bad)
    with pytest.raises(InvalidRequestError, match="policy rules"):
        Engine({"rules": bad}, transports=[])


@pytest.fixture(scope="module")
def two_rail_peer():
    p = Peer(size=8 << 20, config={"transports": {"tcp": {"rails": ["127.0.0.1", "127.0.0.2"]}}}, transports=["tcp"])
    yield p
    p.close()


def test_rules_pin_rails_and_deny_transports(two_rail_peer):
    cfg = {"transports": {"tcp": {"rails": ["127.0.0.1", "127.0.0.2"]}}, "rules": RULES}
    with Engine(cfg, transports=["tcp"]) as eng:
        local = eng.allocate(8 << 20)
        seg = two_rail_peer.seg("rw")
        reqs = [Request(READ, local, i << 20, seg, i << 20, 1 << 20, Priority.HIGH, tag="kv") for i in range(8)]
        eng.submit(reqs).wait()
        by_rail = {r["index"]: r["bytes"] for r in eng.rail_stats()}
        assert by_rail[0] >= 8 << 20 and by_rail.get(1, 0) == 0, by_rail
        # untagged large requests spray over both rails
        eng.submit([Request(READ, local, 0, seg, 0, 8 << 20, Priority.MID)] * 4).wait()
        by_rail = {r["index"]: r["bytes"] for r in eng.rail_stats()}
        assert by_rail[1] > 0, by_rail
        with pytest.raises(PolicyRejectedError, match="no-tcp-ckpt"):
            eng.submit([Request(READ, local, 0, seg, 0, 4096, tag="checkpoint")])
    pin_missing = [{"name": "rail-7", "match": {}, "rails": [7]}]
    with Engine({"rules": pin_missing}, transports=["tcp"]) as eng:
        local = eng.allocate(4096)
        with pytest.raises(PolicyRejectedError, match="rail-7"):
            eng.submit([Request(READ, local, 0, two_rail_peer.seg("rw"), 0, 4096)])
