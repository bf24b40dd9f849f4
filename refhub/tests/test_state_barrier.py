"""The per-replica barrier (a backup server after failover): a shard's requests wait until every
shard of its replica has registered, so all shards get answers from the same replica state."""

from __future__ import annotations

from refhub.state import ServerState


def _open(s: ServerState, client: str, shard: int, now: float, rid: int) -> int:
    out = s.handle(client, {"op": "open", "rid": rid, "model": "m", "replica": "r0", "shard": shard, "num_shards": 2}, now)
    (c, rep), = out
    assert c == client and rep["ok"]
    return rep["h"]


def test_requests_wait_for_every_shard_then_all_are_answered():
    s = ServerState(barrier_timeout=30.0)
    h0 = _open(s, "c0", 0, 0.0, 1)
    assert s.handle("c0", {"op": "list", "rid": 2, "h": h0}, 0.1) == []  # held at the barrier
    h1 = _open_with_flush(s, "c1", 1, 0.2, 3)
    answered = {c: r for c, r in h1}
    assert answered["c0"]["rid"] == 2 and answered["c0"]["ok"]  # released when shard 1 arrived
    # after the barrier, requests are answered at once
    (c, rep), = s.handle("c0", {"op": "list", "rid": 4, "h": h0}, 0.3)
    assert rep["ok"] and rep["rid"] == 4


def _open_with_flush(s: ServerState, client: str, shard: int, now: float, rid: int):
    out = s.handle(client, {"op": "open", "rid": rid, "model": "m", "replica": "r0", "shard": shard, "num_shards": 2}, now)
    assert any(c == client and r.get("h") for c, r in out)
    return out


def test_barrier_times_out_with_an_error_not_a_hang():
    s = ServerState(barrier_timeout=5.0)
    h0 = _open(s, "c0", 0, 0.0, 1)
    assert s.handle("c0", {"op": "list", "rid": 2, "h": h0}, 1.0) == []
    assert [r for _, r in s.tick(4.0) if r.get("rid") == 2] == []
    (c, rep), = [(c, r) for c, r in s.tick(5.5) if r.get("rid") == 2]
    assert c == "c0" and not rep["ok"] and "shards" in rep["msg"]
