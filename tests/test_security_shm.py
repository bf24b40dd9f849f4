"""Attack suite, same-host transport: live engines in their own processes, real abstract sockets,
real memfds, an attacker of another uid (a forked child as `nobody`).

Each attack from issue 13 is refused with a clear error while a legitimate engine keeps working:
- another uid takes the shm secret from describe and asks for a memfd: refused (SO_PEERCRED);
- a peer allowed to map a READ_ONLY buffer re-opens its fd read-write through /proc, writes,
  maps it writable, upgrades a read-only mapping, shrinks it: every write path fails (seals);
- process_vm (CMA) to a target that did not enable it, or of another uid: not used;
- a hostile describe naming a third engine's socket/pid (confused deputy): no same-host path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from peers import Peer, sha
from security_tools import NOBODY, as_user, attack_memfd

from tent_core import READ, WRITE, Engine
from tent_core.errors import NoPathError, PeerUnreachableError, TentError
from tent_core.metadata import ControlClient, ControlServer
from tent_core.testing import pattern

SIZE = 1 << 20
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to become another uid)")


def describe(engine_id: str) -> dict[str, Any]:
    c = ControlClient(engine_id, auth=None)
    try:
        return c.call({"op": "describe"}, 10)
    finally:
        c.close()


def buffer_addr(desc: dict[str, Any], segment: str) -> int:
    return int(desc["segments"][segment][0]["addr"])


@pytest.fixture(scope="module")
def target() -> Iterator[Peer]:
    """A target engine with default settings (no token: loopback only), and `nobody` allowed to map."""
    p = Peer(size=SIZE)
    yield p
    p.close()


@pytest.fixture(scope="module")
def target_allowing_nobody() -> Iterator[Peer]:
    p = Peer(size=SIZE, config={"transports": {"shm": {"allow_uids": [NOBODY]}}})
    yield p
    p.close()


def _legit_read(target: Peer, segment: str = "ro") -> None:
    with Engine(transports=["shm"]) as eng:
        buf = eng.allocate(SIZE)
        eng.read(buf, target.seg(segment), SIZE, timeout=10)
        assert sha(buf.array) == target.digest(segment, 0, SIZE)
        assert eng.transports["shm"].link_mode(next(iter(eng.transports["shm"]._by_handle))) == "memfd"


@root_only
def test_another_uid_is_refused_the_memfd_even_with_the_secret(target: Peer) -> None:
    desc = describe(target.engine_id)  # no token configured: describe is open (loopback only)
    shm = desc["transports"]["shm"]
    before = target.digest("ro", 0, SIZE)
    res = as_user(NOBODY, attack_memfd, shm["sock"], shm["secret"].encode().hex(), buffer_addr(desc, "ro"))
    assert "uid 65534 may not map" in res["attach"], res
    assert target.digest("ro", 0, SIZE) == before
    _legit_read(target)  # and the target keeps serving legitimate peers


@root_only
def test_allowed_other_uid_cannot_write_a_read_only_buffer(target_allowing_nobody: Peer) -> None:
    t = target_allowing_nobody
    desc = describe(t.engine_id)
    shm = desc["transports"]["shm"]
    before = {s: t.digest(s, 0, SIZE) for s in ("ro", "rw")}
    res = as_user(NOBODY, attack_memfd, shm["sock"], shm["secret"].encode().hex(), buffer_addr(desc, "ro"))
    assert res["attach"] == "ok" and res["got_fd"] and res["writable"] is False, res
    assert res["write"] == "EBADF"  # an O_RDONLY fd
    assert res["mmap_rw"] in ("EACCES", "EPERM") and res["mprotect_rw"] in ("EACCES", "EPERM")
    assert res["ftruncate"] in ("EINVAL", "EBADF", "EPERM")
    assert res["reopen_rw"] == "EACCES"  # the memfd is mode 0600: another uid cannot re-open it at all
    # a READ_WRITE buffer is writable by design, but no peer can shrink it under its owner (SIGBUS)
    res_rw = as_user(NOBODY, attack_memfd, shm["sock"], shm["secret"].encode().hex(), buffer_addr(desc, "rw"))
    assert res_rw["got_fd"] and res_rw["writable"] is True and res_rw["ftruncate"] == "EPERM", res_rw
    assert {s: t.digest(s, 0, SIZE) for s in ("ro",)} == {"ro": before["ro"]}
    # the owner still writes its own read-only buffer (its mapping predates the seal)
    t.call(cmd="fill", segment="ro", seed=42)
    assert t.digest("ro", 0, SIZE) == sha(pattern(SIZE, seed=42))
    t.call(cmd="fill", segment="ro", seed=1)
    _legit_read(t)


def test_same_uid_reopen_through_proc_cannot_write_a_read_only_buffer(target: Peer) -> None:
    desc = describe(target.engine_id)
    shm = desc["transports"]["shm"]
    before = target.digest("ro", 0, SIZE)
    res = attack_memfd(shm["sock"], shm["secret"].encode().hex(), buffer_addr(desc, "ro"))
    assert res["got_fd"] and res["writable"] is False, res
    # the re-open itself may work for the owner's uid (or root): every write through it must not
    assert res["write"] == "EBADF" and res["mmap_rw"] in ("EACCES", "EPERM") and res["mprotect_rw"] in ("EACCES", "EPERM")
    if res["reopen_rw"] == "ok":
        assert res["reopened_write"] == "EPERM" and res["reopened_mmap_rw"] == "EPERM"
        assert res["reopened_ftruncate"] == "EPERM"
    assert target.digest("ro", 0, SIZE) == before


def test_wrong_secret_gets_nothing(target: Peer) -> None:
    desc = describe(target.engine_id)
    res = attack_memfd(desc["transports"]["shm"]["sock"], b"not-the-secret".hex(), buffer_addr(desc, "ro"))
    assert "wrong auth token" in res["attach"] or "failed to prove" in res["attach"], res


def test_process_vm_is_opt_in_on_both_sides(target: Peer) -> None:
    # the target runs the default mode (memfd): an initiator that wants CMA does not get it
    with Engine({"transports": {"shm": {"mode": "cma"}}}, transports=["shm"]) as eng:
        buf = eng.allocate(SIZE)
        with pytest.raises((PeerUnreachableError, NoPathError)):
            eng.read(buf, target.seg("ro"), SIZE, timeout=10)
    with Engine({"transports": {"shm": {"mode": "auto"}}}, transports=["shm"]) as eng:
        buf = eng.allocate(SIZE)
        eng.read(buf, target.seg("ro"), SIZE, timeout=10)
        tr = eng.transports["shm"]
        assert [tr.link_mode(h) for h in tr._by_handle] == ["memfd"]
        # and the peer's own (non-memfd) array is out of reach: only CMA could touch it
        with pytest.raises((PeerUnreachableError, NoPathError)):
            eng.read(buf, target.seg("user"), 4096, timeout=10)
    # both sides opt in (same uid): CMA is used
    p = Peer(size=SIZE, config={"transports": {"shm": {"mode": "auto"}}})
    try:
        with Engine({"transports": {"shm": {"mode": "cma"}}}, transports=["shm"]) as eng:
            buf = eng.allocate(SIZE)
            eng.read(buf, p.seg("user"), SIZE, timeout=10)
            assert sha(buf.array) == p.digest("user", 0, SIZE)
    finally:
        p.close()


class _HostileDescribe:
    """A control endpoint that answers describe with another engine's shm details (or a spoofed pid)."""

    def __init__(self, victim: dict[str, Any], **shm_overrides: Any) -> None:
        self.victim = victim
        self.overrides = shm_overrides
        self.server = ControlServer("127.0.0.1", 0, self.handle, auth=None)
        self.engine_id = f"127.0.0.1:{self.server.port}"

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        d = dict(self.victim)
        d["engine_id"] = self.engine_id
        d["transports"] = {"shm": {**self.victim["transports"]["shm"], **self.overrides}}
        return d

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("spoof", ["third_engine", "pid_of_another_process"])
def test_confused_deputy_through_a_hostile_describe_is_refused(target: Peer, spoof: str) -> None:
    victim = describe(target.engine_id)
    before = target.digest("rw", 0, SIZE)
    overrides = {} if spoof == "third_engine" else {"pid": os.getppid()}
    hostile = _HostileDescribe(victim, **overrides)
    try:
        with Engine(transports=["shm"]) as eng:
            buf = eng.allocate(SIZE)
            buf.array[:] = 0x41
            with pytest.raises(TentError) as err:
                eng.write(buf, f"{hostile.engine_id}/rw", SIZE, timeout=10)
            assert isinstance(err.value, (PeerUnreachableError, NoPathError)), err.value
        assert target.digest("rw", 0, SIZE) == before  # the third engine's memory is untouched
    finally:
        hostile.close()
    # the initiator's reason names the mismatch (logged by the shm transport's connect)
    with Engine(transports=["shm"]) as eng:
        tr = eng.transports["shm"]
        from tent_core.types import PeerInfo

        hostile = _HostileDescribe(victim, **overrides)
        try:
            info = PeerInfo(hostile.engine_id, victim["host_id"], int(victim["pid"]), hostile.handle({})["transports"])
            with pytest.raises(PeerUnreachableError, match="refusing the same-host path"):
                tr.connect(info, [])
        finally:
            hostile.close()
    _legit_read(target, "rw")


def test_memfd_without_sealing_is_not_shared() -> None:
    """A memfd that cannot be sealed is never handed out (no fd a peer could shrink or write)."""
    from tent_shm.plugin import seal_memfd

    fd = os.memfd_create("unsealable", os.MFD_CLOEXEC)  # no MFD_ALLOW_SEALING
    try:
        assert "MFD_ALLOW_SEALING" in (seal_memfd(fd, writable=False) or "")
    finally:
        os.close(fd)
    fd = os.memfd_create("sealable", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 4096)
        assert seal_memfd(fd, writable=False) is None
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
    finally:
        os.close(fd)


def test_token_mode_shm_uses_the_cluster_key_and_advertises_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "shm-cluster-token-0123456789abcdef"
    env = dict(os.environ, TENT_AUTH_TOKEN=token)
    p = Peer(size=SIZE, env=env)
    try:
        monkeypatch.setenv("TENT_AUTH_TOKEN", token)
        with Engine(transports=["shm"]) as eng:
            c = ControlClient(p.engine_id)
            desc = c.call({"op": "describe"}, 10)
            c.close()
            assert "secret" not in desc["transports"]["shm"]
            buf = eng.allocate(SIZE)
            eng.read(buf, p.seg("ro"), SIZE, timeout=10)
            assert sha(buf.array) == p.digest("ro", 0, SIZE)
            buf.array[:] = pattern(SIZE, seed=9)
            eng.write(buf, p.seg("rw"), SIZE, timeout=10)
            assert p.digest("rw", 0, SIZE) == sha(buf.array)
            # a same-host process without the token: the fd server refuses it whatever it guesses
            res = attack_memfd(desc["transports"]["shm"]["sock"], b"guess".hex(), buffer_addr(desc, "rw"))
            assert "failed to prove" in res["attach"] or "wrong auth token" in res["attach"], res
    finally:
        p.close()


def test_reading_and_writing_still_work_with_reads_into_numpy(target: Peer) -> None:
    """Legitimate use: an engine reads a peer's read-only buffer and writes its read-write one."""
    with Engine(transports=["shm"]) as eng:
        local = np.zeros(SIZE, np.uint8)
        buf = eng.register(local)
        eng.read(buf, target.seg("ro"), SIZE, timeout=10)
        assert sha(local) == target.digest("ro", 0, SIZE)
        eng.transfer(WRITE, buf, 0, target.seg("rw"), 0, SIZE, timeout=10)
        eng.transfer(READ, buf, 0, target.seg("rw"), 0, SIZE, timeout=10)
    target.call(cmd="fill", segment="rw", seed=0)
