"""ControlClient.send / replies: several requests in flight on one connection, driven by one
thread, each reply matched to its request by id (target staging's chunk copies)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from tent_core.auth import ClusterAuth
from tent_core.errors import PeerUnreachableError
from tent_core.metadata import ControlClient, ControlServer

TOKEN = "pipelined-control-token-0123456789"


@pytest.mark.parametrize("with_auth", [False, True])
def test_replies_in_any_order_are_matched_by_id(with_auth: bool) -> None:
    # "slow" requests are answered only when a "release" names them: replies leave in another
    # order than the requests, as the target's deferred copy replies can
    held: list[Future[dict[str, Any]]] = []

    def handler(msg: dict[str, Any]) -> dict[str, Any] | Future[dict[str, Any]]:
        if msg["op"] == "slow":
            fut: Future[dict[str, Any]] = Future()
            held.append(fut)
            return fut
        held[msg["which"]].set_result({"ok": True, "n": msg["which"]})
        return {"ok": True}

    auth = ClusterAuth.from_token(TOKEN) if with_auth else None
    srv = ControlServer("127.0.0.1", 0, handler, auth=auth)
    c = ControlClient(f"127.0.0.1:{srv.port}", auth=auth)

    def collect(want: set[int]) -> dict[int, dict[str, Any]]:
        got: dict[int, dict[str, Any]] = {}
        for _ in range(100):
            for rep in c.replies(0.1):
                got[rep["id"]] = rep
            if want <= set(got):
                return got
        raise AssertionError(f"replies {sorted(want - set(got))} never came")

    try:
        slow = [c.send({"op": "slow"}, 5.0) for _ in range(3)]
        rel = c.send({"op": "release", "which": 2}, 5.0)
        assert len(set(slow + [rel])) == 4
        got = collect({rel, slow[2]})
        assert got[slow[2]]["n"] == 2 and slow[0] not in got and slow[1] not in got  # the others still held
        rels = [c.send({"op": "release", "which": i}, 5.0) for i in (1, 0)]
        got = collect({*rels, slow[0], slow[1]})
        assert got[slow[0]]["n"] == 0 and got[slow[1]]["n"] == 1
        assert c.replies(0) == []  # nothing else arrives
        assert c.call({"op": "release", "which": 0}, 5.0)["ok"] is False  # answered once: a clear error
    finally:
        c.close()
        srv.close()


def test_replies_without_a_connection_is_empty_and_a_dead_peer_is_unreachable() -> None:
    c = ControlClient("127.0.0.1:1", auth=None)
    try:
        assert c.replies(0.01) == []  # nothing sent yet: no socket
        c.send({"op": "ping"}, 1.0)  # queued by ZeroMQ; no reply will come
        assert c.replies(0.05) == []
    finally:
        c.close()
    with pytest.raises(PeerUnreachableError):  # authentication needs the peer: bounded by the timeout
        ControlClient("127.0.0.1:1", auth=ClusterAuth.from_token(TOKEN)).send({"op": "ping"}, 0.2)
