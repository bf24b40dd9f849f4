"""Transport control messages (``{"op": "transport", "transport": name, "body": ...}``): the engine
routes them to its transport of that name over the authenticated control plane (RDMA's QP
handshake uses it). Unknown or malformed ones get an error reply; the port keeps serving; a caller
without the cluster secret never reaches a transport."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from peers import Peer

from tent_core.auth import AuthError, ClusterAuth
from tent_core.metadata import ControlClient

TOKEN = "transport-control-token-0123456789ab"


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer(size=1 << 16, env=dict(os.environ, TENT_AUTH_TOKEN=TOKEN))
    yield p
    p.close()


def test_transport_messages_are_routed_by_name_and_refused_cleanly(peer: Peer) -> None:
    c = ControlClient(peer.engine_id, auth=ClusterAuth.from_token(TOKEN))
    try:
        r = c.call({"op": "transport", "transport": "no-such-fabric", "body": {}}, 10)
        assert not r["ok"] and "no transport 'no-such-fabric'" in r["error"], r
        r = c.call({"op": "transport", "transport": ["not", "a", "name"], "body": {}}, 10)
        assert not r["ok"], r
        r = c.call({"op": "transport", "transport": "tcp", "body": {"kind": "connect"}}, 10)
        assert not r["ok"] and "takes no control messages" in r["error"], r
        assert c.call({"op": "ping"}, 10)["ok"]  # still serving
    finally:
        c.close()


def test_transport_messages_need_the_cluster_secret(peer: Peer) -> None:
    c = ControlClient(peer.engine_id, auth=ClusterAuth.from_token("wrong-token-0123456789abcdef"))
    try:
        with pytest.raises(AuthError):
            c.call({"op": "transport", "transport": "tcp", "body": {}}, 10)
    finally:
        c.close()
