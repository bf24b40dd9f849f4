"""Small tcp requests one at a time through the engine (issue 17's loop): every `submit().wait()`
and `run()` moves the right bytes, and the connection they ride stays pooled and reused from
request to request (the inline submit checks pooled connections against the core's submit stamp,
and a waiter gives its connection back stamped with the end of its wait: a stamp in the wrong
unit or order would drop a live connection as stale, and the next request would reconnect). Two
real engines on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from tcp_helpers import engine_pair

from tent_core import READ, WRITE, Request
from tent_core.engine import Engine
from tent_core.testing import pattern


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine]]:
    yield from engine_pair(monkeypatch)


def _counters(eng: Engine, peer: Engine) -> dict[str, int]:
    tcp = eng.transports["tcp"]
    link = tcp._peers[peer.engine_id][1]  # the peer's link (tools and tests read its counters)
    out = {"connects": 0, "slices": 0, "errors": 0}
    for r in link.rails:
        c = tcp.native.rail_counters(link.handle, r.index)
        for k in out:
            out[k] += int(c[k])
    return out


@pytest.mark.parametrize("form", ["wait", "run"])
def test_small_requests_one_at_a_time_reuse_one_connection(pair: tuple[Engine, Engine], form: str) -> None:
    a, b = pair  # a: the target's buffer; b: submits one request at a time
    block, n = 64 << 10, 150
    src = a.allocate(n * block)
    want = pattern(n * block, 23)
    src.array[:] = want
    dst = b.allocate(block)
    remote = f"{a.engine_id}/default"
    go = (lambda r: b.submit(r).wait()) if form == "wait" else b.run
    go([Request(READ, dst, 0, remote, src.offset, block)])  # the plan is cached, a connection is up
    before = _counters(b, a)
    for i in range(n):  # each READ a different piece: a stale or misplaced copy shows
        dst.array[:block] = 0
        go([Request(READ, dst, 0, remote, src.offset + i * block, block)])
        assert np.array_equal(dst.array[:block], want[i * block : (i + 1) * block]), i
    back = pattern(n * block, 29)
    for i in range(n):
        dst.array[:block] = back[i * block : (i + 1) * block]
        go([Request(WRITE, dst, 0, remote, src.offset + i * block, block)])
    assert np.array_equal(src.array[: n * block], back)
    after = _counters(b, a)
    assert after["slices"] - before["slices"] == 2 * n and after["errors"] == before["errors"]
    assert after["connects"] == before["connects"]  # the pooled connection, never dropped as stale
