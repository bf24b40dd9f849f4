"""A replica process paused past the heartbeat timeout (SIGSTOP) is dropped by the reference server;
resumed (SIGCONT), it re-registers and publishes again what it holds, and readers pull from it.
Real processes: the reference server, the publisher and a reader (tests/e2e_worker.py)."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from refhub.client import query
from test_e2e import Worker, procs, start_server  # noqa: F401  (procs: the fixture)

pytest.importorskip("tent_core.engine")

HB_TIMEOUT = 3.0  # the pause below is several times longer; live workers beat every 0.2 s
WAIT_S = 90.0  # every wait is for an event; this only bounds a broken run on a loaded machine


def listing(addr: str) -> dict[str, Any]:
    return query(addr, {"op": "list", "model": "m"}, timeout=5.0)


def wait_for(what: str, cond: Callable[[], bool], timeout: float = WAIT_S) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_paused_publisher_is_dropped_then_rejoins_and_serves_readers(procs) -> None:  # noqa: F811
    srv, addr = start_server(hb_timeout=HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer")
    procs.append(t)
    assert t.cmd("fill 1")["ok"] and t.cmd("publish 1")["ok"]
    before = t.cmd("state")
    assert before["state"] == "published" and before["version"] == 1
    assert listing(addr)["latest"] == 1

    t.p.send_signal(signal.SIGSTOP)
    try:
        # the server drops the silent replica (its only holder: the model and version go with it)
        wait_for("the server to drop the paused replica", lambda: listing(addr).get("latest") is None)
    finally:
        t.p.send_signal(signal.SIGCONT)

    # resumed: told "unknown" on its next heartbeat, it re-registers and publishes v1 again
    wait_for("the replica to publish again", lambda: listing(addr).get("latest") == 1)
    after = t.cmd("state")
    assert after["state"] == "published" and after["version"] == 1, after
    # re-registered because the server dropped it, not after a (false) failover: its own pause is not
    # taken for the server's silence
    assert after["h"] != before["h"] and after["failovers"] == before["failovers"], (before, after)

    r = Worker(addr, "rollout")
    procs.append(r)
    rep = r.cmd("replicate 1", timeout=120)
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep  # verified against the publisher's checksums
    assert rep["stats"]["sources"][0][0] == "trainer", rep["stats"]
    # the publication is the application's again: it can unpublish and publish the next version
    assert t.cmd("unpublish", 60)["ok"] and t.cmd("fill 2")["ok"] and t.cmd("publish 2")["ok"]
    rep = r.cmd("update", timeout=120)
    assert rep["ok"] and rep["v"] == 2 and rep["data_ok"], rep
    for w in (t, r):
        assert w.cmd("exit")["ok"]


def test_paused_reader_copy_rejoins_as_a_source(procs) -> None:  # noqa: F811
    """A replicated copy is a publication too: a reader paused past the timeout comes back holding
    the version, and a later reader can pull from it once the original publisher is gone."""
    srv, addr = start_server(hb_timeout=HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer")
    procs.append(t)
    assert t.cmd("fill 1")["ok"] and t.cmd("publish 1")["ok"]
    r = Worker(addr, "rolloutA")
    procs.append(r)
    rep = r.cmd("replicate 1", timeout=120)
    assert rep["ok"] and rep["data_ok"], rep
    wait_for("two replicas of v1", lambda: listing(addr)["versions"].get(1, {}).get("replicas") == 2)

    r.p.send_signal(signal.SIGSTOP)
    try:
        wait_for("the server to drop the paused reader", lambda: listing(addr)["versions"][1]["replicas"] == 1)
    finally:
        r.p.send_signal(signal.SIGCONT)
    wait_for("the reader's copy to be published again", lambda: listing(addr)["versions"][1]["replicas"] == 2)
    t.kill()  # only the rejoined copy is left
    wait_for("the server to drop the killed publisher", lambda: listing(addr)["versions"][1]["replicas"] == 1)
    r2 = Worker(addr, "rolloutB")
    procs.append(r2)
    rep = r2.cmd("replicate 1", timeout=120)
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    assert rep["stats"]["sources"][0][0] == "rolloutA", rep["stats"]
    for w in (r, r2):
        assert w.cmd("exit")["ok"]
