"""The shm transport against a target in a separate process, driven through the core's native path."""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from shm_target import HOST_ID, pattern, target_main
from tent_shm.plugin import ShmTransport

from tent_core import _native
from tent_core.abi import Status
from tent_core.errors import PeerUnreachableError
from tent_core.transport import TransportContext
from tent_core.types import PeerInfo, Permission

READ, WRITE = 0, 1
E_CONNECT, E_IO, E_BOUNDS, E_PERMISSION, E_CANCELLED = (
    Status.E_CONNECT, Status.E_IO, Status.E_BOUNDS, Status.E_PERMISSION, Status.E_CANCELLED,
)

from tent_core.abi import FAILURE_DTYPE, SLICE_DTYPE  # noqa: E402

SPECS = [
    {"name": "anon", "size": 4 << 20},
    {"name": "rw", "size": 4 << 20, "memfd": True},
    {"name": "ro", "size": 1 << 20, "memfd": True, "perm": int(Permission.READ)},
    {"name": "big", "size": 16 << 20, "memfd": True},
]

import tent_core.rails  # noqa: E402,F401  (the core owns the telemetry slots; importing sets them)


class Target:
    def __init__(self, specs: list[dict[str, Any]] = SPECS, config: dict[str, Any] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # CMA is opt-in on both sides: the target allows it unless a test says otherwise
        self.proc = ctx.Process(target=target_main, args=(child, specs, config or {"mode": "auto"}), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(60):
            raise RuntimeError("target did not start")
        info = self.conn.recv()
        self.pid: int = info["pid"]
        self.desc: dict[str, Any] = info["desc"]
        self.bufs: list[dict[str, Any]] = info["bufs"]
        self.by_name = {b["name"]: b for b in self.bufs}

    def peer(self, **desc_overrides: Any) -> PeerInfo:
        return PeerInfo("target", HOST_ID, self.pid, {"shm": {**self.desc, **desc_overrides}})

    def addr(self, name: str) -> int:
        return int(self.by_name[name]["addr"])

    def get(self, name: str, off: int, n: int) -> bytes:
        self.conn.send(("get", name, off, n))
        return self.conn.recv()

    def release(self, name: str) -> None:
        self.conn.send(("release", name))
        assert self.conn.recv() is True

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(10)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("exit",))
                self.conn.poll(10)
            except (OSError, EOFError):
                pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(5)


def make_transport(mode: str, **cfg: Any) -> ShmTransport:
    tr = ShmTransport()
    assert tr.probe().available
    tr.start(
        TransportContext(engine_id="initiator", host_id=HOST_ID, config={"mode": mode, **cfg}, bind_host="127.0.0.1")
    )
    return tr


def submit(tr: ShmTransport, slices: list[tuple[int, int, int, int]], handle: int, inline: bool = False) -> Any:
    """slices: (opcode, local, remote, length). Returns the batch. `inline`: through submit_inline."""
    arr = np.zeros(len(slices), SLICE_DTYPE)
    for i, (op, local, remote, n) in enumerate(slices):
        arr[i] = (local, remote, n, handle, 0, 0, op, 0, i % 64, 0)
    b = _native.Batch(len(slices))
    ex = tr.executor
    assert _native.submit(ex.ops, ex.handle, b, arr, inline) == 0
    return b


def one(tr: ShmTransport, op: int, local: int, remote: int, n: int, handle: int, inline: bool = False) -> Any:
    b = _native.Batch(1)
    ex = tr.executor
    assert _native.submit_one(ex.ops, ex.handle, b, op, local, remote, n, handle, 0, 1, 0, inline) == 0
    return b


def wait_failures(n: int, timeout: float = 10.0) -> np.ndarray:
    """Collect `n` retryable failures from the core's queue (never hangs)."""
    fd = _native.failure_fd()
    out: list[np.ndarray] = []
    got = 0
    deadline = time.monotonic() + timeout
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        select.select([fd], [], [], min(left, 0.5))
        try:
            os.read(fd, 8)
        except BlockingIOError:
            pass
        recs = np.frombuffer(_native.pop_failures(), FAILURE_DTYPE)
        if len(recs):
            out.append(recs)
            got += len(recs)
    return np.concatenate(out) if out else np.zeros(0, FAILURE_DTYPE)


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    t = Target()
    yield t
    t.close()


@pytest.fixture(params=["cma", "memfd"])
def link(request: pytest.FixtureRequest, target: Target) -> Iterator[tuple[ShmTransport, int, Target]]:
    tr = make_transport(request.param, threads=2, chunk=1 << 20)
    pl = tr.connect(target.peer(), target.bufs)
    assert tr.link_mode(pl) == request.param
    assert pl.rails[0].name == request.param
    yield tr, pl.handle, target
    tr.disconnect(pl)
    tr.close()


# ------------------------------------------------------------------ data path
def test_read_write_roundtrip(link: tuple[ShmTransport, int, Target]) -> None:
    tr, h, t = link
    name = "big" if tr.link_mode(h) == "memfd" else "anon"
    size = t.by_name[name]["length"]
    local = np.zeros(size, np.uint8)
    b = one(tr, READ, local.ctypes.data, t.addr(name), size, h)
    assert b.wait(30) and b.error == 0
    idx = [b_["name"] for b_ in t.bufs].index(name)
    assert np.array_equal(local, pattern(size, 1000 + idx))

    data = pattern(size, 7)
    b = one(tr, WRITE, data.ctypes.data, t.addr(name), size, h)
    assert b.wait(30) and b.error == 0
    assert t.get(name, 0, size) == data.tobytes()


def test_unaligned_and_zero_length(link: tuple[ShmTransport, int, Target]) -> None:
    tr, h, t = link
    name = "rw"
    src = pattern(100_003, 11)
    base = t.addr(name)
    slices = [
        (WRITE, src.ctypes.data + 1, base + 3, 99_999),  # odd offsets both sides
        (WRITE, src.ctypes.data, base + 200_001, 0),  # zero length
        (WRITE, src.ctypes.data + 5, base + 300_007, 1),
    ]
    b = submit(tr, slices, h)
    assert b.wait(10) and b.error == 0 and b.bytes_done == 100_000
    assert t.get(name, 3, 99_999) == src[1:100_000].tobytes()
    assert t.get(name, 300_007, 1) == src[5:6].tobytes()
    dst = np.zeros(99_999 + 2, np.uint8)
    b = submit(tr, [(READ, dst.ctypes.data + 1, base + 3, 99_999), (READ, dst.ctypes.data, base, 0)], h)
    assert b.wait(10) and b.error == 0
    assert dst[1:-1].tobytes() == src[1:100_000].tobytes() and dst[0] == 0 and dst[-1] == 0


def test_many_concurrent_slices(link: tuple[ShmTransport, int, Target]) -> None:
    tr, h, t = link
    name = "rw" if tr.link_mode(h) == "memfd" else "anon"
    size = t.by_name[name]["length"]
    rng = np.random.default_rng(3)
    src = pattern(size, 21)
    n = 1000
    cuts = np.sort(rng.choice(np.arange(1, size), n - 1, replace=False))
    bounds = np.concatenate([[0], cuts, [size]])
    writes = [
        (WRITE, src.ctypes.data + int(a), t.addr(name) + int(a), int(e - a))
        for a, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    b = submit(tr, writes, h)
    assert b.wait(30) and b.error == 0 and b.bytes_done == size
    assert t.get(name, 0, size) == src.tobytes()
    dst = np.zeros(size, np.uint8)
    # many batches in flight at once
    batches = [
        one(tr, READ, dst.ctypes.data + int(a), t.addr(name) + int(a), int(e - a), h)
        for a, e in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    for bb in batches:
        assert bb.wait(30) and bb.error == 0
    assert np.array_equal(dst, src)


def test_inline_copy_is_done_when_submit_returns(link: tuple[ShmTransport, int, Target]) -> None:
    """submit_inline: a copy of up to one chunk runs on the caller: reported before the call returns."""
    tr, h, t = link
    assert _native.executor_inline(tr.executor.ops)
    name = "rw" if tr.link_mode(h) == "memfd" else "anon"
    t.conn.send(("fill", name))  # other tests wrote into it
    assert t.conn.recv() is True
    idx = [b_["name"] for b_ in t.bufs].index(name)
    want = pattern(t.by_name[name]["length"], 1000 + idx)
    for off, n in ((0, 65536), (12345, 1 << 20), (1 << 20, 1)):
        dst = np.zeros(n, np.uint8)
        b = one(tr, READ, dst.ctypes.data, t.addr(name) + off, n, h, inline=True)
        assert b.remaining == 0 and b.error == 0 and b.bytes_done == n  # no wait: done inside submit
        assert np.array_equal(dst, want[off : off + n])
    src = pattern(4096, 5)
    b = one(tr, WRITE, src.ctypes.data, t.addr(name) + 8192, 4096, h, inline=True)
    assert b.remaining == 0 and b.error == 0
    assert t.get(name, 8192, 4096) == src.tobytes()
    t.conn.send(("fill", name))  # leave the buffer as the other tests expect it
    assert t.conn.recv() is True
    if tr.link_mode(h) == "memfd":  # refusals are reported inline too, with the executor's checks
        b = one(tr, READ, dst.ctypes.data, t.addr("ro") + (1 << 20) - 10, 100, h, inline=True)
        assert b.remaining == 0 and b.error == E_BOUNDS
        b = one(tr, WRITE, src.ctypes.data, t.addr("ro"), 4096, h, inline=True)
        assert b.remaining == 0 and b.error == E_PERMISSION


def test_inline_batch_is_shared_by_caller_and_workers(link: tuple[ShmTransport, int, Target]) -> None:
    tr, h, t = link
    name = "big" if tr.link_mode(h) == "memfd" else "anon"
    size = t.by_name[name]["length"]
    rng = np.random.default_rng(8)
    cuts = np.sort(rng.choice(np.arange(1, size), 63, replace=False))
    bounds = np.concatenate([[0], cuts, [size]])  # 64 slices, some longer than a chunk
    src = pattern(size, 31)
    b = submit(tr, [(WRITE, src.ctypes.data + int(a), t.addr(name) + int(a), int(e - a))
                    for a, e in zip(bounds[:-1], bounds[1:], strict=True)], h, inline=True)
    assert b.wait(30) and b.error == 0 and b.bytes_done == size
    assert t.get(name, 0, size) == src.tobytes()
    dst = np.zeros(size, np.uint8)
    b = submit(tr, [(READ, dst.ctypes.data + int(a), t.addr(name) + int(a), int(e - a))
                    for a, e in zip(bounds[:-1], bounds[1:], strict=True)], h, inline=True)
    assert b.wait(30) and b.error == 0
    assert np.array_equal(dst, src)
    t.conn.send(("fill", name))
    assert t.conn.recv() is True


@pytest.mark.parametrize("mode", ["cma", "memfd"])
def test_inline_batches_in_a_window_leave_their_rest_to_the_workers(mode: str, target: Target) -> None:
    """A caller that pipelines inline batches (refhub's window of READs) leaves each submit after
    its inline budget while most of the batch is still queued (no hold for the workers): the
    workers report the rest, every slice exactly once, every byte in place."""
    tr = make_transport(mode, threads=2, chunk=64 << 10, inline_budget=64 << 10)
    pl = tr.connect(target.peer(), target.bufs)
    try:
        h = pl.handle
        name = "big" if mode == "memfd" else "anon"
        size = target.by_name[name]["length"]
        src = pattern(size, 41)
        b = submit(tr, [(WRITE, src.ctypes.data, target.addr(name), size)], h)
        assert b.wait(30) and b.error == 0
        dst = np.zeros(size, np.uint8)
        step = size // 16  # 16 batches of 4 slices, each slice many chunks
        inflight: list[tuple[Any, int]] = []
        for a in range(0, size, step):
            n = min(step, size - a)
            q = [(READ, dst.ctypes.data + a + c, target.addr(name) + a + c, min(n // 4 + 1, n - c))
                 for c in range(0, n, n // 4 + 1)]
            inflight.append((submit(tr, q, h, inline=True), n))
            if len(inflight) > 4:
                bb, nb = inflight.pop(0)
                assert bb.wait(30) and bb.error == 0 and bb.remaining == 0 and bb.bytes_done == nb
        for bb, nb in inflight:
            assert bb.wait(30) and bb.error == 0 and bb.remaining == 0 and bb.bytes_done == nb
        assert np.array_equal(dst, src)
    finally:
        target.conn.send(("fill", name))
        assert target.conn.recv() is True
        tr.disconnect(pl)
        tr.close()


def test_cancelled_batch(link: tuple[ShmTransport, int, Target]) -> None:
    tr, h, t = link
    dst = np.zeros(4096, np.uint8)
    b = _native.Batch(1)
    b.cancel()
    ex = tr.executor
    assert _native.submit_one(ex.ops, ex.handle, b, READ, dst.ctypes.data, t.addr("rw"), 4096, h, 0, 0, 0) == 0
    assert b.wait(10) and b.error == E_CANCELLED


def test_unknown_peer_handle_is_retryable(target: Target) -> None:
    tr = make_transport("cma")
    try:
        dst = np.zeros(16, np.uint8)
        b = one(tr, READ, dst.ctypes.data, target.addr("anon"), 16, 0xDEAD)
        f = wait_failures(1)
        assert len(f) == 1 and f[0]["status"] == E_CONNECT
        b.fail_slice(int(f[0]["status"]))
        assert b.wait(5)
    finally:
        tr.close()


# ------------------------------------------------------------------ memfd enforcement
@pytest.fixture
def memfd_link(target: Target) -> Iterator[tuple[ShmTransport, int, Target]]:
    tr = make_transport("memfd")
    pl = tr.connect(target.peer(), target.bufs)
    yield tr, pl.handle, target
    tr.close()


def test_memfd_readonly_buffer(memfd_link: tuple[ShmTransport, int, Target]) -> None:
    tr, h, t = memfd_link
    size = t.by_name["ro"]["length"]
    dst = np.zeros(size, np.uint8)
    b = one(tr, READ, dst.ctypes.data, t.addr("ro"), size, h)
    assert b.wait(10) and b.error == 0
    assert dst.tobytes() == t.get("ro", 0, size)
    src = np.full(64, 0xAB, np.uint8)
    b = one(tr, WRITE, src.ctypes.data, t.addr("ro") + 128, 64, h)
    assert b.wait(10) and b.error == E_PERMISSION
    assert t.get("ro", 128, 64) == dst[128:192].tobytes()  # untouched


def test_memfd_out_of_mapping(memfd_link: tuple[ShmTransport, int, Target]) -> None:
    tr, h, t = memfd_link
    dst = np.zeros(8192, np.uint8)
    size = t.by_name["rw"]["length"]
    for remote, n in [
        (t.addr("rw") + size - 100, 200),  # runs past the end
        (max(b_["addr"] + b_["length"] for b_ in t.bufs) + (1 << 20), 16),  # past every buffer
        (0x1000, 16),  # nowhere
    ]:
        b = one(tr, READ, dst.ctypes.data, remote, n, h)
        assert b.wait(10) and b.error == E_BOUNDS, (hex(remote), n)


def test_memfd_non_memfd_buffer_is_retryable(memfd_link: tuple[ShmTransport, int, Target]) -> None:
    """A registered buffer that is not memfd-backed: another transport may serve it."""
    tr, h, t = memfd_link
    dst = np.zeros(64, np.uint8)
    b = one(tr, READ, dst.ctypes.data, t.addr("anon"), 64, h)
    f = wait_failures(1)
    assert len(f) == 1 and f[0]["status"] == E_CONNECT
    b.fail_slice(int(f[0]["status"]))


def test_memfd_release_revokes_mapping() -> None:
    t = Target([{"name": "a", "size": 1 << 20, "memfd": True}, {"name": "b", "size": 1 << 20, "memfd": True}])
    tr = make_transport("memfd")
    try:
        pl = tr.connect(t.peer(), t.bufs)
        dst = np.zeros(4096, np.uint8)
        b = one(tr, READ, dst.ctypes.data, t.addr("a"), 4096, pl.handle)
        assert b.wait(10) and b.error == 0
        t.release("a")  # returns after our side unmapped it
        b = one(tr, READ, dst.ctypes.data, t.addr("a"), 4096, pl.handle)
        assert b.wait(10) and b.error == E_BOUNDS
        b = one(tr, READ, dst.ctypes.data, t.addr("b"), 4096, pl.handle)
        assert b.wait(10) and b.error == 0
        # a later connect with the shrunk buffer list keeps working
        pl = tr.connect(t.peer(), [x for x in t.bufs if x["name"] == "b"])
        b = one(tr, READ, dst.ctypes.data, t.addr("b"), 4096, pl.handle)
        assert b.wait(10) and b.error == 0
    finally:
        tr.close()
        t.close()


# ------------------------------------------------------------------ peer death
@pytest.mark.parametrize("mode", ["cma", "memfd"])
def test_peer_killed_is_an_error_not_a_hang(mode: str) -> None:
    t = Target([{"name": "m", "size": 1 << 20, "memfd": True}, {"name": "anon", "size": 1 << 20}])
    tr = make_transport(mode)
    try:
        pl = tr.connect(t.peer(), t.bufs)
        name = "m" if mode == "memfd" else "anon"
        dst = np.zeros(1 << 20, np.uint8)
        b = one(tr, READ, dst.ctypes.data, t.addr(name), 1 << 20, pl.handle)
        assert b.wait(10) and b.error == 0
        t.kill()
        time.sleep(0.2)
        b = submit(
            tr,
            [(READ, dst.ctypes.data, t.addr(name), 1 << 20), (WRITE, dst.ctypes.data, t.addr(name), 4096)],
            pl.handle,
        )
        f = wait_failures(2)
        assert len(f) == 2 and set(f["status"].tolist()) <= {E_IO, E_CONNECT}, f["status"]
        for rec in f:
            b.fail_slice(int(rec["status"]))
        assert b.wait(5)
    finally:
        tr.close()
        t.close()


# ------------------------------------------------------------------ modes and connect
def test_auto_mode_prefers_cma_and_falls_back_to_memfd(target: Target) -> None:
    tr = make_transport("auto")
    try:
        assert tr.mode == "auto"
        pl = tr.connect(target.peer(), target.bufs)
        assert tr.link_mode(pl) == "cma" and pl.extra["mode"] == "cma"
        tr.disconnect(pl)
        # a peer whose probe read fails (as under a ptrace policy): memfd
        pl = tr.connect(target.peer(probe_addr=0x1000), target.bufs)
        assert tr.link_mode(pl) == "memfd"
        dst = np.zeros(4096, np.uint8)
        b = one(tr, READ, dst.ctypes.data, target.addr("rw"), 4096, pl.handle)
        assert b.wait(10) and b.error == 0 and dst.tobytes() == target.get("rw", 0, 4096)
    finally:
        tr.close()


def test_connect_fails_clearly_when_nothing_works(target: Target) -> None:
    tr = make_transport("cma")
    try:
        with pytest.raises(PeerUnreachableError, match="CMA"):
            tr.connect(target.peer(probe_addr=0x1000), target.bufs)
    finally:
        tr.close()
    tr = make_transport("auto")
    try:
        # CMA refused and no memfd-backed buffer among those offered
        with pytest.raises(PeerUnreachableError, match="memfd"):
            tr.connect(target.peer(probe_addr=0x1000), [target.by_name["anon"]])
        # CMA refused and the memfd server unreachable
        with pytest.raises(PeerUnreachableError, match="unreachable"):
            tr.connect(target.peer(probe_addr=0x1000, sock="tent-shm-nobody"), target.bufs)
        # wrong secret
        with pytest.raises(PeerUnreachableError):
            tr.connect(target.peer(probe_addr=0x1000, secret="x"), target.bufs)
    finally:
        tr.close()


def test_can_reach_and_capabilities(target: Target) -> None:
    tr = make_transport("auto")
    try:
        assert tr.can_reach(target.peer()) is None
        other = PeerInfo("x", "other-host", 1, {"shm": target.desc})
        assert "another host" in (tr.can_reach(other) or "")
        assert tr.can_reach(PeerInfo("x", HOST_ID, 1, {"tcp": {}})) is not None
        caps = tr.capabilities()
        assert caps.same_host and not caps.cross_host and caps.rank == 10
        d = tr.local_descriptor()
        assert d["pid"] == os.getpid() and d["sock"]
    finally:
        tr.close()


def test_plugin_is_discovered() -> None:
    from tent_core.plugin_manager import discover

    ps = discover()
    assert "shm" in ps.registry.entries
    assert ps.registry.entries["shm"].factory is ShmTransport


def test_close_with_queued_slices_reports_every_slice(target: Target) -> None:
    tr = make_transport("cma", threads=1, chunk=0)
    pl = tr.connect(target.peer(), target.bufs)
    dst = np.zeros(4 << 20, np.uint8)
    b = submit(tr, [(READ, dst.ctypes.data, target.addr("anon"), 4 << 20)] * 200, pl.handle)
    tr.close()  # joins the worker; what it did not run completes as cancelled
    # a slice cut off mid-copy may report a retryable error instead: those reach the failure
    # queue (the core would re-route them); finalize them here so every slice is accounted for
    deadline = time.monotonic() + 10
    while not b.wait(0.1) and time.monotonic() < deadline:
        for rec in np.frombuffer(_native.pop_failures(), FAILURE_DTYPE):
            if int(rec["slice"]["token"]) == b.token:
                b.fail_slice(int(rec["status"]))
    assert b.remaining == 0 and b.error in (0, E_CANCELLED, E_CONNECT, E_IO)


@pytest.mark.parametrize("mode", ["cma", "memfd"])
def test_engine_roundtrip(mode: str) -> None:
    engine_mod = pytest.importorskip("tent_core.engine")
    from tent_core import READ as OP_READ
    from tent_core import WRITE as OP_WRITE

    cfg = {"transports": {"shm": {"mode": mode}}}
    a, b = engine_mod.Engine(cfg), engine_mod.Engine(cfg)
    try:
        if "shm" not in b.transports:
            pytest.skip("engine did not start the shm transport")
        src = a.allocate(3 << 20)
        src.array[:] = pattern(3 << 20, 5)
        dst = b.allocate(3 << 20)
        b.transfer(OP_READ, dst, 0, f"{a.engine_id}/default", 0, 3 << 20, timeout=10)
        assert np.array_equal(dst.array, src.array)
        dst.array[:] = 9
        b.transfer(OP_WRITE, dst, 1, f"{a.engine_id}/default", 3, (3 << 20) - 3, timeout=10)
        assert (src.array[3:] == 9).all() and np.array_equal(src.array[:3], pattern(3 << 20, 5)[:3])
        tr = b.transports["shm"]
        assert [tr.link_mode(h) for h in list(tr._by_handle)] == [mode]
        a.unregister(src)  # memfd: revokes b's mapping before returning
    finally:
        b.close()
        a.close()


def test_memfd_server_name_taken_by_another_process_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control socket's abstract name is random; if a live socket of any process (any user)
    already holds the name drawn, the server draws another instead of failing the engine."""
    import socket

    from tent_shm import plugin as shm_plugin

    drawn = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(shm_plugin.secrets, "token_hex", lambda n: next(drawn))
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    squatter.bind(f"\0tent-shm-{os.getpid()}-aaaaaaaaaaaa")
    try:
        server = shm_plugin._ShmServer("engine-under-test", b"k" * 32, allow_cma=False)
        try:
            assert server.name == f"tent-shm-{os.getpid()}-bbbbbbbbbbbb"
        finally:
            server.close()
    finally:
        squatter.close()
