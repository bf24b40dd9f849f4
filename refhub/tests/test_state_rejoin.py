"""A replica the server dropped after missed heartbeats comes back: what the server tells the client
(its handles are unknown, under the same epoch) and what the client's re-registration and
re-publication lead to, on the pure state machine (the client side: test_e2e's SIGSTOP test)."""

from __future__ import annotations

from typing import Any

from refhub.protocol import E_UNKNOWN_HANDLE
from refhub.state import ServerState

HB = 2.0
CKS = [0x1234, 0x5678]  # the publisher's per-tensor checksums of version 1
REF = {"seg": "127.0.0.1:1/rh1-1", "progress": 0, "items": [["w", 64, 1 << 20]], "total": 1 << 20, "pack": []}


class Client:
    """One connection: its client id (the ownership credential it keeps across reconnects)."""

    def __init__(self, s: ServerState, name: str) -> None:
        self.s, self.name, self.cid, self.rid = s, name, name.encode().ljust(16, b"."), 0

    def send(self, now: float, **msg: Any) -> list[tuple[Any, dict]]:
        self.rid += 1
        return self.s.handle(self.name, {"rid": self.rid, "cid": self.cid, **msg}, now)

    def call(self, now: float, **msg: Any) -> dict:
        out = [r for c, r in self.send(now, **msg) if c == self.name and r.get("rid") == self.rid]
        assert len(out) == 1, out
        return out[0]

    def open(self, now: float, replica: str, shard: int = 0, num_shards: int = 1) -> int:
        rep = self.call(now, op="open", model="m", replica=replica, shard=shard, num_shards=num_shards)
        assert rep["ok"], rep
        return int(rep["h"])


def dropped_publisher(s: ServerState) -> tuple[Client, int]:
    """"trainer" published v1, then went silent past the heartbeat timeout: the server dropped it."""
    t = Client(s, "trainer")
    h = t.open(0.0, "trainer")
    assert t.call(0.1, op="publish", h=h, version=1, ref=REF, checksum=CKS)["ok"]
    assert s._list(s.models["m"])["latest"] == 1
    s.tick(0.1 + HB / 2)
    assert "m" in s.models  # not yet
    s.tick(0.2 + HB)
    assert "m" not in s.models and h not in s.handles  # its only replica gone: the model too
    return t, h


def test_the_dropped_client_learns_it_on_its_next_heartbeat_under_the_same_epoch() -> None:
    s = ServerState(hb_timeout=HB, epoch="e1")
    t, h = dropped_publisher(s)
    rep = t.call(10.0, op="hb", hs=[h])
    # "unknown" under the epoch the client knows: dropped, not a restarted server (which changes epoch)
    assert rep["ok"] and rep["unknown"] == [h] and rep["epoch"] == "e1"
    rep = t.call(10.1, op="publish", h=h, version=1, ref=REF, checksum=CKS)
    assert not rep["ok"] and rep["err"] == E_UNKNOWN_HANDLE


def test_re_registered_and_re_published_replica_serves_readers_with_the_same_checksums() -> None:
    s = ServerState(hb_timeout=HB, epoch="e1")
    t, _ = dropped_publisher(s)
    r = Client(s, "rollout")
    hr = r.open(10.0, "rollout")
    # a reader now waits: nobody holds version 1
    assert [x for c, x in r.send(10.1, op="replicate", h=hr, version=1, ref=REF) if c == "rollout"] == []
    h2 = t.open(10.2, "trainer")
    out = t.send(10.3, op="publish", h=h2, version=1, ref=REF, checksum=CKS)
    mine = [x for c, x in out if c == "trainer"]
    assert mine and mine[0]["ok"], out
    # the waiting reader is released to the re-published replica, with the original checksums
    (go,) = [x for c, x in out if c == "rollout"]
    assert go["ok"] and go["version"] == 1 and go["src"]["replica"] == "trainer", go
    assert go["src"]["ref"] == REF and go["checksum"] == CKS, go
    assert r.call(10.4, op="replicate_done", h=hr, ok=True)["ok"]
    lst = s._list(s.models["m"])
    assert lst["latest"] == 1 and s.models["m"].checksums[(1, 0)] == CKS
    s.check_invariants()


def test_every_shard_of_a_dropped_replica_comes_back_through_the_barrier() -> None:
    """Two shards in two processes: the server drops the whole replica; the first shard to publish
    again waits for the other to re-register (same as a fresh start), then both are served."""
    s = ServerState(hb_timeout=HB, epoch="e1", barrier_timeout=30.0)
    a, b = Client(s, "shard0"), Client(s, "shard1")
    ha, hb = a.open(0.0, "t", 0, 2), b.open(0.0, "t", 1, 2)
    for c, h, shard in ((a, ha, 0), (b, hb, 1)):
        assert c.call(0.1, op="publish", h=h, version=3, ref=REF, checksum=[shard])["ok"]
    s.handle("shard1", {"op": "hb", "rid": 0, "cid": b.cid, "hs": [hb]}, 2.0)  # shard1 alive, shard0 paused
    s.tick(0.2 + HB)
    assert ha not in s.handles and hb not in s.handles  # the whole replica is dropped
    for c, h in ((a, ha), (b, hb)):
        assert c.call(3.0, op="hb", hs=[h])["unknown"] == [h]
    ha2 = a.open(3.1, "t", 0, 2)
    assert a.send(3.2, op="publish", h=ha2, version=3, ref=REF, checksum=[0]) == []  # held at the barrier
    out = b.send(3.3, op="open", model="m", replica="t", shard=1, num_shards=2)
    hb2 = next(x["h"] for c, x in out if c == "shard1")
    assert any(c == "shard0" and x.get("ok") for c, x in out), out  # shard0's publish answered
    assert b.call(3.4, op="publish", h=hb2, version=3, ref=REF, checksum=[1])["ok"]
    m = s.models["m"]
    assert s._list(m)["latest"] == 3 and m.checksums[(3, 0)] == [0] and m.checksums[(3, 1)] == [1]
    s.check_invariants()
