"""The etcd-backed metadata directory, against a real etcd server (skipped when etcd is missing)."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
from etcd_server import EtcdServer
from peers import Peer

from tent_core import Engine, errors
from tent_core.directory import DirectoryError, EtcdDirectory, NameTakenError, parse_etcd_endpoints

TTL = 2  # seconds: a killed engine must vanish within a few of these


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    srv = EtcdServer()
    yield srv
    srv.stop()


def _cfg(etcd: EtcdServer, name: str, prefix: str) -> dict:
    return {"directory": {"url": etcd.url, "name": name, "lease_ttl_s": TTL, "prefix": prefix}}


def _wait_for(pred, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.1)
    return pred()


def test_parse_endpoints() -> None:
    assert parse_etcd_endpoints("127.0.0.1:2379") == ["http://127.0.0.1:2379"]
    assert parse_etcd_endpoints("etcd://a:1,b:2") == ["http://a:1", "http://b:2"]
    assert parse_etcd_endpoints("etcd://a:1;http://b:2/") == ["http://a:1", "http://b:2"]
    for bad in ("", "etcd://", "etcd://nohost", "https://a:1"):
        with pytest.raises(DirectoryError):
            parse_etcd_endpoints(bad)


def test_unreachable_etcd_is_a_clear_error() -> None:
    with pytest.raises(DirectoryError, match="cannot reach etcd"):
        Engine({"directory": {"url": "etcd://127.0.0.1:1", "name": "127.0.0.1:5", "timeout_s": 0.5}})


def test_two_engines_find_each_other_only_through_etcd(etcd: EtcdServer) -> None:
    prefix = "t-two/"
    peer = Peer(size=1 << 20, config=_cfg(etcd, "127.0.0.1:12345", prefix))
    local = Engine(_cfg(etcd, "127.0.0.1:12347", prefix))
    try:
        assert peer.engine_id == "127.0.0.1:12345"
        d = EtcdDirectory(etcd.url, prefix=prefix)
        rec = d.lookup("127.0.0.1:12345")
        assert rec is not None
        # the name is not where the peer listens: only the directory knows its control endpoint
        assert rec["engine"]["control"] != "127.0.0.1:12345"
        assert rec["engine"]["transports"]["tcp"]["rails"], "rails are published with the engine"
        assert {"rw", "ro", "user"} <= set(rec["segments"])
        assert set(d.names()) == {"127.0.0.1:12345", "127.0.0.1:12347"}
        d.close()

        dst = local.allocate(1 << 20)
        local.read(dst, "127.0.0.1:12345/rw", timeout=10)
        assert hashlib.sha256(dst.array.tobytes()).hexdigest() == peer.digest("rw", 0, 1 << 20)
        dst.array[:] = np.random.default_rng(42).integers(0, 256, 1 << 20, dtype=np.uint8)
        local.write(dst, "127.0.0.1:12345/rw", timeout=10)
        assert peer.digest("rw", 0, 1 << 20) == hashlib.sha256(dst.array.tobytes()).hexdigest()
        # memory registered after the first lookup is found through the directory too
        late = local.allocate(4096, segment="late")
        late.array[:] = 9
        got = [b for b in local.peer_buffers(local.engine_id) if b["segment"] == "late"]
        assert got and got[0]["length"] == 4096
    finally:
        local.close()
        peer.close()


def test_killed_engine_disappears_and_its_name_can_be_taken_again(etcd: EtcdServer) -> None:
    prefix = "t-kill/"
    name = "127.0.0.1:12355"
    d = EtcdDirectory(etcd.url, prefix=prefix)
    peer = Peer(size=1 << 16, config=_cfg(etcd, name, prefix))
    try:
        assert name in d.names()
        # a second live engine cannot take the name
        with pytest.raises(NameTakenError):
            Engine(_cfg(etcd, name, prefix))
        peer.kill()
        peer.proc.wait(10)
        t0 = time.monotonic()
        assert _wait_for(lambda: name not in d.names(), TTL * 5 + 5), "a SIGKILLed engine stayed in etcd"
        gone_after = time.monotonic() - t0
        assert d.lookup(name) is None
        reader = Engine(_cfg(etcd, "127.0.0.1:12356", prefix))
        try:
            dst = reader.allocate(4096)
            t1 = time.monotonic()
            with pytest.raises(errors.PeerUnreachableError, match="no engine named"):
                reader.read(dst, f"{name}/rw", timeout=5)
            assert time.monotonic() - t1 < 3, "an unknown name must fail at once, not at a timeout"
        finally:
            reader.close()
        print(f"killed engine gone from etcd after {gone_after:.1f}s (lease ttl {TTL}s)")
    finally:
        peer.close()
        d.close()


def test_restarted_engine_replaces_its_stale_record_at_once(etcd: EtcdServer) -> None:
    prefix = "t-restart/"
    name = "127.0.0.1:12365"
    first = Peer(size=1 << 16, config={"directory": {"url": etcd.url, "name": name, "lease_ttl_s": 30, "prefix": prefix}})
    first.kill()
    first.proc.wait(10)
    # the old lease lives 30 s more, but its engine does not answer: the name is free
    second = Peer(size=1 << 16, config=_cfg(etcd, name, prefix))
    local = Engine(_cfg(etcd, "127.0.0.1:12366", prefix))
    try:
        dst = local.allocate(1 << 16)
        local.read(dst, f"{name}/ro", timeout=10)
        assert hashlib.sha256(dst.array.tobytes()).hexdigest() == second.digest("ro", 0, 1 << 16)
    finally:
        local.close()
        second.close()
        first.close()


def test_lost_lease_is_regranted_and_entries_republished(etcd: EtcdServer) -> None:
    prefix = "t-lease/"
    name = "127.0.0.1:12375"
    eng = Engine(_cfg(etcd, name, prefix))
    d = EtcdDirectory(etcd.url, prefix=prefix)
    try:
        lease = eng.peers.directory.directory._lease  # type: ignore[union-attr]
        req = urllib.request.Request(
            f"http://{etcd.endpoint}/v3/lease/revoke", data=json.dumps({"ID": lease}).encode(), method="POST"
        )
        urllib.request.urlopen(req, timeout=5).read()
        assert d.lookup(name) is None
        assert _wait_for(lambda: d.lookup(name) is not None, TTL * 3), "entries were not re-published"
        assert "_tent_probe" in d.lookup(name)["segments"]  # type: ignore[index]
    finally:
        eng.close()
    assert d.lookup(name) is None, "close() revokes the lease: the engine leaves at once"
    d.close()


def test_a_refused_engine_leaves_no_keepalive_behind(etcd: EtcdServer) -> None:
    import threading

    prefix = "t-leak/"
    name = "127.0.0.1:12385"
    holder = Engine(_cfg(etcd, name, prefix))
    try:
        before = sum(t.name == "tent-etcd-lease" for t in threading.enumerate())
        for _ in range(3):
            with pytest.raises(NameTakenError):
                Engine(_cfg(etcd, name, prefix))
        assert sum(t.name == "tent-etcd-lease" for t in threading.enumerate()) == before
    finally:
        holder.close()


def test_register_fails_whole_when_the_directory_cannot_publish() -> None:
    """etcd gone: a registration peers could never find is refused and leaves nothing behind; an
    unregistration still releases the memory (the stale entry only names a range the engine refuses)."""
    own = EtcdServer()
    eng = None
    try:
        eng = Engine({"directory": {"url": own.url, "name": "127.0.0.1:12391", "lease_ttl_s": TTL, "timeout_s": 0.5}})
        kept = eng.allocate(4096, segment="kept")
        own.stop()
        with pytest.raises(errors.TentError, match="could not publish segment 'late'"):
            eng.register(np.zeros(4096, np.uint8), segment="late")
        assert "late" not in eng.describe()["segments"]
        eng.unregister(kept)  # logged, not raised
        assert not kept.registered and "kept" not in eng.describe()["segments"]
    finally:
        if eng is not None:
            eng.close()
        own.stop()
