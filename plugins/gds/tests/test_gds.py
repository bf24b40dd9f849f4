"""The gds transport against real files, driven through the core's native submit path."""

from __future__ import annotations

import errno
import hashlib
import os
import select
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tent_gds.plugin import GdsTransport, get_lib, is_tmpfs

import tent_core.rails  # noqa: F401  (sets the native telemetry array)
from tent_core import _native
from tent_core.abi import Status
from tent_core.errors import InvalidRequestError
from tent_core.testing import pattern as tpattern
from tent_core.transport import TransportContext
from tent_core.types import BufferInfo, MemoryKind, PeerInfo, Permission

READ, WRITE = 0, 1
E_CONNECT, E_IO, E_BOUNDS, E_PERMISSION, E_CANCELLED = (
    Status.E_CONNECT, Status.E_IO, Status.E_BOUNDS, Status.E_PERMISSION, Status.E_CANCELLED,
)
HOST_ID = "gds-test-host"
BASE = 1 << 52

from tent_core.abi import SLICE_DTYPE  # noqa: E402

URING_OK = get_lib().uring_reason() is None
ENGINES = ["pread"] + (["io_uring"] if URING_OK else [])


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def aligned(n: int, align: int = 4096) -> np.ndarray:
    raw = np.zeros(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + n]


def make_file(path: Path, data: np.ndarray | int) -> Path:
    if isinstance(data, int):
        with open(path, "wb") as f:
            f.truncate(data)
    else:
        path.write_bytes(data.tobytes())
    return path


def rbuf(base: int, path: Path, length: int | None = None, perm: Permission = Permission.READ_WRITE) -> dict[str, Any]:
    n = os.path.getsize(path) if length is None else length
    return {
        "segment": "files",
        "offset": 0,
        "addr": base,
        "length": n,
        "perm": int(perm),
        "kind": MemoryKind.FILE.value,
        "desc": {"gds": {"path": str(path), "perm": int(perm)}},
    }


def peer() -> PeerInfo:
    return PeerInfo("self", HOST_ID, os.getpid(), {"gds": {"pid": os.getpid()}})


def make_transport(**cfg: Any) -> GdsTransport:
    tr = GdsTransport()
    assert tr.probe().available
    tr.start(TransportContext(engine_id="self", host_id=HOST_ID, config=cfg, bind_host="127.0.0.1"))
    return tr


def one(tr: GdsTransport, op: int, local: int, remote: int, n: int, handle: int, timeout: float = 30) -> int:
    b = _native.Batch(1)
    ex = tr.executor
    assert _native.submit_one(ex.ops, ex.handle, b, op, local, remote, n, handle, 0, 1, 0) == 0
    assert b.wait(timeout)
    return int(b.error)


from tent_core.abi import FAILURE_DTYPE  # noqa: E402


def one_retryable(tr: GdsTransport, op: int, local: int, remote: int, n: int, handle: int, timeout: float = 10) -> int:
    """Submit one slice expected to fail retryably: its status comes back through the core's
    failure queue (the engine would retry it), not through the batch."""
    b = _native.Batch(1)
    ex = tr.executor
    assert _native.submit_one(ex.ops, ex.handle, b, op, local, remote, n, handle, 0, 1, 0) == 0
    fd = _native.failure_fd()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        select.select([fd], [], [], 0.2)
        try:
            os.read(fd, 8)
        except BlockingIOError:
            pass
        recs = np.frombuffer(_native.pop_failures(), FAILURE_DTYPE)
        mine = recs[recs["slice"]["token"] == b.token]
        if len(mine):
            b.fail_slice(int(mine[0]["status"]))
            return int(mine[0]["status"])
        if b.wait(0):
            return int(b.error)
    raise AssertionError("no completion")


def many(tr: GdsTransport, slices: list[tuple[int, int, int, int]], handle: int, timeout: float = 30) -> Any:
    arr = np.zeros(len(slices), SLICE_DTYPE)
    for i, (op, local, remote, n) in enumerate(slices):
        arr[i] = (local, remote, n, handle, 0, 0, op, 0, 1, 0)
    b = _native.Batch(len(slices))
    ex = tr.executor
    assert _native.submit(ex.ops, ex.handle, b, arr) == 0
    assert b.wait(timeout)
    return b


@pytest.fixture(params=ENGINES)
def tr(request: pytest.FixtureRequest) -> Iterator[GdsTransport]:
    t = make_transport(engine=request.param, threads=2, queue_depth=8, chunk=256 << 10)
    assert t.io_engine == request.param
    yield t
    t.close()


# ------------------------------------------------------------------ plugin surface
def test_probe_and_capabilities() -> None:
    t = GdsTransport()
    av = t.probe()
    assert av.available and av.reason.startswith("io engine: ")
    assert ("io_uring" in av.reason) == URING_OK
    cap = t.capabilities()
    assert cap.kind_pairs == frozenset({(MemoryKind.HOST, MemoryKind.FILE)})
    assert cap.same_host and not cap.cross_host
    assert cap.serves(MemoryKind.HOST, MemoryKind.FILE, True)
    assert not cap.serves(MemoryKind.HOST, MemoryKind.FILE, False)


def test_bad_engine_config() -> None:
    with pytest.raises(InvalidRequestError):
        make_transport(engine="aio")


def test_export_buffer(tmp_path: Path) -> None:
    t = make_transport()
    try:
        f = make_file(tmp_path / "x", 100)
        info = BufferInfo("files", 0, BASE, 100, MemoryKind.FILE, perm=Permission.READ, path=str(f))
        assert t.export_buffer(info) == {"path": str(f), "perm": 1}
        assert t.export_buffer(BufferInfo("m", 0, 4096, 100, MemoryKind.HOST)) is None
        pl = t.connect(peer(), [rbuf(BASE, f)])
        assert pl.rails[0].name == f"gds-{t.io_engine}"
        other = PeerInfo("other", "another-host", 1, {"gds": {}})
        assert t.can_reach(other) is not None
    finally:
        t.close()


# ------------------------------------------------------------------ data path
def test_roundtrip_unaligned(tr: GdsTransport, tmp_path: Path) -> None:
    size = 3 * (1 << 20) + 12345
    src = pattern(size, 1)
    f = make_file(tmp_path / "a.bin", src)
    h = tr.connect(peer(), [rbuf(BASE, f)]).handle
    dst = np.zeros(size, np.uint8)
    assert one(tr, READ, dst.ctypes.data, BASE, size, h) == 0
    assert np.array_equal(dst, src)
    # odd offsets on both sides, several slices in one batch, zero-length slice included
    new = pattern(200_001, 2)
    b = many(
        tr,
        [
            (WRITE, new.ctypes.data + 1, BASE + 7, 100_000),
            (WRITE, new.ctypes.data + 100_001, BASE + 7 + 100_000, 100_000),
            (WRITE, new.ctypes.data, BASE + size, 0),
        ],
        h,
    )
    assert b.error == 0 and b.bytes_done == 200_000
    expect = src.copy()
    expect[7 : 7 + 200_000] = new[1:200_001]
    assert f.read_bytes() == expect.tobytes()
    back = np.zeros(200_002, np.uint8)
    assert one(tr, READ, back.ctypes.data + 1, BASE + 7, 200_000, h) == 0
    assert back[1:-1].tobytes() == new[1:].tobytes() and back[0] == 0 and back[-1] == 0


def test_bounds(tr: GdsTransport, tmp_path: Path) -> None:
    f = make_file(tmp_path / "b.bin", pattern(10_000, 3))
    g = make_file(tmp_path / "c.bin", pattern(5_000, 4))
    h = tr.connect(peer(), [rbuf(BASE, f), rbuf(BASE + (1 << 40), g)]).handle
    buf = np.zeros(20_000, np.uint8)
    assert one(tr, READ, buf.ctypes.data, BASE + 9_000, 1_001, h) == E_BOUNDS  # runs past the end
    assert one(tr, READ, buf.ctypes.data, BASE + 10_000, 1, h) == E_BOUNDS
    assert one(tr, WRITE, buf.ctypes.data, BASE + 20_000, 10, h) == E_BOUNDS  # in the gap
    assert one(tr, READ, buf.ctypes.data, BASE - 1, 10, h) == E_BOUNDS  # below every file
    assert one(tr, READ, buf.ctypes.data, BASE + (1 << 40) + 4_990, 20, h) == E_BOUNDS
    assert one(tr, READ, buf.ctypes.data, BASE + 9_000, 1_000, h) == 0  # exactly to the end
    assert one(tr, READ, buf.ctypes.data, BASE + 10_000, 0, h) == 0  # zero length at the end
    assert one(tr, READ, buf.ctypes.data, BASE + (1 << 40), 5_000, h) == 0
    assert buf[:5_000].tobytes() == g.read_bytes()
    assert os.path.getsize(f) == 10_000  # a refused write never extends the file
    assert (
        one_retryable(tr, READ, buf.ctypes.data, BASE, 10, h + (1 << 32)) == E_CONNECT
    )  # stale peer handle -> retryable


def test_permission(tr: GdsTransport, tmp_path: Path) -> None:
    data = pattern(8192, 5)
    f = make_file(tmp_path / "ro.bin", data)
    h = tr.connect(peer(), [rbuf(BASE, f, perm=Permission.READ)]).handle
    assert tr.link_files(h)[BASE]["writable"] is False
    src = pattern(8192, 6)
    assert one(tr, WRITE, src.ctypes.data, BASE, 8192, h) == E_PERMISSION
    assert f.read_bytes() == data.tobytes()
    dst = np.zeros(8192, np.uint8)
    assert one(tr, READ, dst.ctypes.data, BASE, 8192, h) == 0
    assert np.array_equal(dst, data)


def test_permission_from_filesystem(tr: GdsTransport, tmp_path: Path) -> None:
    """Advertised writable, but the file mode denies writes: registered read-only, WRITE refused."""
    if os.geteuid() == 0:
        pytest.skip("root ignores file modes")
    f = make_file(tmp_path / "mode.bin", pattern(4096, 7))
    f.chmod(0o444)
    h = tr.connect(peer(), [rbuf(BASE, f)]).handle
    src = pattern(4096, 8)
    assert one(tr, WRITE, src.ctypes.data, BASE, 4096, h) == E_PERMISSION


def test_short_file(tr: GdsTransport, tmp_path: Path) -> None:
    """The file is shorter than its registered length: READ past EOF fails, never returns garbage."""
    data = pattern(3 * 4096 + 100, 9)
    f = make_file(tmp_path / "short.bin", data)
    h = tr.connect(peer(), [rbuf(BASE, f, length=1 << 20)]).handle
    dst = np.full(1 << 20, 0xAB, np.uint8)
    assert one(tr, READ, dst.ctypes.data, BASE, 1 << 20, h) == E_BOUNDS
    assert one(tr, READ, dst.ctypes.data, BASE + 4096, 3 * 4096, h) == E_BOUNDS
    assert one(tr, READ, dst.ctypes.data, BASE + 4096, 2 * 4096 + 100, h) == 0  # up to EOF exactly
    assert dst[: 2 * 4096 + 100].tobytes() == data[4096:].tobytes()
    # truncated under us after connect
    os.truncate(f, 4096)
    assert one(tr, READ, dst.ctypes.data, BASE, 8192, h) == E_BOUNDS


def test_reconnect_updates_table(tr: GdsTransport, tmp_path: Path) -> None:
    a = make_file(tmp_path / "a", pattern(4096, 10))
    b = make_file(tmp_path / "b", pattern(4096, 11))
    base_b = BASE + (1 << 40)
    pl = tr.connect(peer(), [rbuf(BASE, a)])
    dst = np.zeros(4096, np.uint8)
    assert one(tr, READ, dst.ctypes.data, base_b, 4096, pl.handle) == E_BOUNDS
    pl2 = tr.connect(peer(), [rbuf(base_b, b, perm=Permission.READ)])  # a gone, b new
    assert pl2.handle == pl.handle
    assert set(tr.link_files(pl.handle)) == {base_b}
    assert one(tr, READ, dst.ctypes.data, BASE, 4096, pl.handle) == E_BOUNDS
    assert one(tr, READ, dst.ctypes.data, base_b, 4096, pl.handle) == 0
    assert dst.tobytes() == b.read_bytes()
    assert one(tr, WRITE, dst.ctypes.data, base_b, 4096, pl.handle) == E_PERMISSION
    tr.connect(peer(), [rbuf(base_b, b, perm=Permission.READ_WRITE)])  # perm changed: reopened writable
    assert one(tr, WRITE, dst.ctypes.data, base_b, 4096, pl.handle) == 0
    tr.disconnect(pl)
    assert one_retryable(tr, READ, dst.ctypes.data, base_b, 4096, pl.handle) == E_CONNECT


def test_cancelled(tr: GdsTransport, tmp_path: Path) -> None:
    f = make_file(tmp_path / "c", pattern(1 << 20, 12))
    h = tr.connect(peer(), [rbuf(BASE, f)]).handle
    dst = np.zeros(1 << 20, np.uint8)
    b = _native.Batch(1)
    b.cancel()
    ex = tr.executor
    assert _native.submit_one(ex.ops, ex.handle, b, READ, dst.ctypes.data, BASE, 1 << 20, h, 0, 1, 0) == 0
    assert b.wait(10) and b.error == E_CANCELLED
    assert not dst.any()


# ------------------------------------------------------------------ buffered writes
def _nowait_writes(directory: Path) -> bool:
    """The kernel's own answer: can a buffered write to a file in `directory` go without blocking
    (pwritev2 with RWF_NOWAIT)? ext4 says no (EOPNOTSUPP), tmpfs and XFS say yes."""
    probe = directory / "nowait-probe.bin"
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"\0" * 4096)
        try:
            os.pwritev(fd, [b"\1" * 4096], 0, os.RWF_NOWAIT)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
                return False
            if exc.errno != errno.EAGAIN:
                raise
        return True
    finally:
        os.close(fd)
        probe.unlink()


@pytest.mark.skipif(not URING_OK, reason="io_uring unusable here")
@pytest.mark.parametrize("where", ["tmp_path", "/dev/shm"])
def test_uring_buffered_writes_the_filesystem_would_block_run_on_the_worker(where: str, tmp_path: Path) -> None:
    """io_uring hands buffered writes the filesystem cannot do without blocking (ext4) to its io-wq
    thread: the worker writes those itself with pwrite, and the rest (tmpfs, XFS) through its ring.
    Either way every byte lands, reads go through the ring, and the choice follows the kernel's
    own RWF_NOWAIT answer for that filesystem."""
    directory = tmp_path if where == "tmp_path" else Path(where)
    if not directory.is_dir():
        pytest.skip(f"no {where}")
    nowait = _nowait_writes(directory)
    size, piece = 8 << 20, 1 << 20
    tr = make_transport(engine="io_uring", threads=2, queue_depth=8, chunk=piece)
    f = directory / f"gds-writes-{os.getpid()}.bin"
    try:
        make_file(f, size)
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        src = aligned(size)
        src[:] = pattern(size, 21)
        s0 = tr.stats()
        assert one(tr, WRITE, src.ctypes.data, BASE, size, h) == 0  # 8 pieces
        # a second request at an unaligned offset and length (a short first and last page)
        assert one(tr, WRITE, src.ctypes.data + 5, BASE + 4096 + 5, 3 * piece + 7, h) == 0
        s1 = tr.stats()
        want = src.copy()
        want[4096 + 5 : 4096 + 5 + 3 * piece + 7] = src[5 : 5 + 3 * piece + 7]
        assert np.array_equal(np.fromfile(f, np.uint8), want)
        assert s1["buffered_bytes"] - s0["buffered_bytes"] == size + 3 * piece + 7
        pieces = size // piece + 4
        if nowait:  # the first piece learns it (one pwritev2), the rest through the ring
            assert s1["sync_ios"] - s0["sync_ios"] <= 1 and s1["uring_ios"] - s0["uring_ios"] >= pieces - 1
        else:
            assert s1["sync_ios"] - s0["sync_ios"] >= pieces and s1["uring_ios"] == s0["uring_ios"]
        dst = aligned(size)
        assert one(tr, READ, dst.ctypes.data, BASE, size, h) == 0
        s2 = tr.stats()
        assert np.array_equal(dst, want)
        assert s2["uring_ios"] - s1["uring_ios"] >= size // piece and s2["sync_ios"] == s1["sync_ios"]
    finally:
        tr.close()
        f.unlink(missing_ok=True)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["tmp_path", "/dev/shm"])
def test_buffered_write_slices_have_one_writer(engine: str, where: str, tmp_path: Path) -> None:
    """The kernel serializes buffered writes to one file, so a buffered WRITE slice longer than a
    chunk is queued whole and one worker writes it in order (stat whole_writes), in chunk-sized
    requests, where write_warm is off; slices up to a chunk, READs, O_DIRECT executors, split_writes=1
    and write_warm (the default: the workers read each piece's source before writing it) cut them.
    Every byte lands where it belongs, at odd offsets and lengths, next to READs in one batch."""
    directory = tmp_path if where == "tmp_path" else Path(where)
    if not directory.is_dir():
        pytest.skip(f"no {where}")
    size, piece = 16 << 20, 1 << 20
    f = directory / f"gds-whole-{os.getpid()}.bin"
    for cfg, whole in (({"write_warm": 0}, True), ({}, False), ({"split_writes": 1, "write_warm": 0}, False), ({"direct": 1}, False)):
        tr = make_transport(engine=engine, threads=2, queue_depth=8, chunk=piece, **cfg)
        try:
            old = pattern(size, 40)
            make_file(f, old)
            h = tr.connect(peer(), [rbuf(BASE, f)]).handle
            src = aligned(size)
            src[:] = pattern(size, 41)
            dst = aligned(size)
            # two long WRITEs (odd start and length), a short one, and a READ of a range none touches
            writes = [
                (5, 4096 + 5, 3 * piece + 7),
                (6 * piece + 11, 6 * piece + 11, 5 * piece + 4093),
                (13 * piece, 13 * piece, 4096 + 1),
            ]
            read = (15 * piece, piece)
            s0 = tr.stats()
            b = many(tr, [(WRITE, src.ctypes.data + lo, BASE + fo, n) for lo, fo, n in writes]
                     + [(READ, dst.ctypes.data + read[0], BASE + read[0], read[1])], h)  # fmt: skip
            assert b.error == 0 and b.bytes_done == sum(n for _, _, n in writes) + read[1]
            s1 = tr.stats()
            want = old.copy()
            for lo, fo, n in writes:
                want[fo : fo + n] = src[lo : lo + n]
            assert np.array_equal(np.fromfile(f, np.uint8), want)
            assert np.array_equal(dst[read[0] : read[0] + read[1]], old[read[0] : read[0] + read[1]])
            assert s1["whole_writes"] - s0["whole_writes"] == (2 if whole else 0)
            assert s1["slices_ok"] - s0["slices_ok"] == 4
        finally:
            tr.close()
            f.unlink(missing_ok=True)


def test_whole_write_cancelled_and_out_of_bounds(tmp_path: Path) -> None:
    """A WRITE kept whole fails like a cut one: past the file's end it is E_BOUNDS with the file
    untouched, into a read-only registration E_PERMISSION, and a cancelled batch's is E_CANCELLED."""
    size, piece = 4 << 20, 1 << 20
    tr = make_transport(threads=2, queue_depth=8, chunk=piece, write_warm=0)
    try:
        old = pattern(size, 42)
        f = make_file(tmp_path / "whole-errors.bin", old)
        ro = make_file(tmp_path / "whole-ro.bin", old)
        h = tr.connect(peer(), [rbuf(BASE, f), rbuf(BASE + (1 << 40), ro, perm=Permission.READ)]).handle
        src = aligned(size)
        src[:] = pattern(size, 43)
        assert one(tr, WRITE, src.ctypes.data, BASE + piece, size, h) == E_BOUNDS
        assert one(tr, WRITE, src.ctypes.data, BASE + (1 << 40), 2 * piece, h) == E_PERMISSION
        assert np.array_equal(np.fromfile(f, np.uint8), old) and np.array_equal(np.fromfile(ro, np.uint8), old)
        b = _native.Batch(1)
        b.cancel()
        ex = tr.executor
        assert _native.submit_one(ex.ops, ex.handle, b, WRITE, src.ctypes.data, BASE, 2 * piece, h, 0, 1, 0) == 0
        assert b.wait(30) and int(b.error) == E_CANCELLED
        assert tr.stats()["whole_writes"] == 3
    finally:
        tr.close()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["tmp_path", "/dev/shm"])
def test_write_warm_pieces_read_before_written(engine: str, where: str, tmp_path: Path) -> None:
    """With write_warm (default) a buffered WRITE longer than a chunk is cut into pieces for all
    workers, and each piece's source is read by its writer just before its pwrite (stat
    warm_pieces: one per piece of such slices; slices up to a chunk, and write_warm=0, read none).
    Every byte lands where it belongs, at odd offsets and lengths, two long WRITEs in one batch."""
    directory = tmp_path if where == "tmp_path" else Path(where)
    if not directory.is_dir():
        pytest.skip(f"no {where}")
    size, piece = 16 << 20, 256 << 10
    f = directory / f"gds-warm-{os.getpid()}.bin"
    for warm in (1, 0):
        tr = make_transport(engine=engine, threads=2, queue_depth=8, chunk=piece, write_warm=warm)
        try:
            old = pattern(size, 60)
            make_file(f, old)
            h = tr.connect(peer(), [rbuf(BASE, f)]).handle
            src = aligned(size)
            src[:] = pattern(size, 61)
            # 14 and 18 pieces (the last ones short), and one of a single piece
            writes = [(7, 4096 + 7, 13 * piece + 4093), (20 * piece + 5, 30 * piece + 5, 17 * piece + 1), (3, 50 * piece, piece)]
            s0 = tr.stats()
            b = many(tr, [(WRITE, src.ctypes.data + lo, BASE + fo, n) for lo, fo, n in writes], h)
            assert b.error == 0 and b.bytes_done == sum(n for _, _, n in writes)
            s1 = tr.stats()
            want = old.copy()
            for lo, fo, n in writes:
                want[fo : fo + n] = src[lo : lo + n]
            assert np.array_equal(np.fromfile(f, np.uint8), want)
            nowait_fs = s1["uring_ios"] > s0["uring_ios"]  # tmpfs takes buffered WRITEs on the ring
            warmed = s1["warm_pieces"] - s0["warm_pieces"]
            if warm and not nowait_fs:
                assert warmed == 14 + 18
            elif not warm:
                assert warmed == 0
            assert s1["whole_writes"] - s0["whole_writes"] == (0 if warm else 2)
            assert s1["slices_ok"] - s0["slices_ok"] == 3
        finally:
            tr.close()
            f.unlink(missing_ok=True)


_WARM_UNMAP_CHILD = """
import ctypes, os, sys
import numpy as np
sys.path.insert(0, sys.argv[4])
from test_gds import BASE, WRITE, make_transport, one, pattern, peer, rbuf
from pathlib import Path
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
path, engine, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
size, piece = 4 << 20, 256 << 10
tr = make_transport(engine=engine, threads=2, queue_depth=8, chunk=piece)
h = tr.connect(peer(), [rbuf(BASE, path)]).handle
for r in range(rounds):
    addr = libc.mmap(None, size, 3, 0x22, -1, 0)  # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
    assert addr not in (None, ctypes.c_void_p(-1).value)
    src = np.ctypeslib.as_array((ctypes.c_uint8 * size).from_address(addr))
    src[:] = pattern(size, 1000 + r)
    last = src.copy()
    assert one(tr, WRITE, addr, BASE, size, h) == 0
    del src
    assert libc.munmap(addr, size) == 0  # the slice completed: nothing may read its memory now
want = np.fromfile(path, np.uint8)
assert np.array_equal(want, last), "file bytes"
print("warm_pieces", tr.stats()["warm_pieces"])
tr.close()
"""


@pytest.mark.parametrize("engine", ENGINES)
def test_write_warm_reads_no_memory_after_a_write_completes(engine: str, tmp_path: Path) -> None:
    """A WRITE's memory may be unmapped the moment its slice completes: no worker may read a piece's
    source (write_warm) after the slice is done. A child process writes 4 MiB (16 pieces) from a
    fresh mapping and unmaps it at once, 150 times; a read of unmapped memory would kill it."""
    import subprocess

    f = make_file(tmp_path / "warm-unmap.bin", pattern(4 << 20, 70))
    out = subprocess.run([sys.executable, "-c", _WARM_UNMAP_CHILD, str(f), engine, "150", str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    posted = int(out.stdout.split("warm_pieces")[1].split()[0])
    assert posted == 150 * 16


# ------------------------------------------------------------------ O_DIRECT
@pytest.mark.parametrize("engine", ENGINES)
def test_direct_aligned_and_unaligned(engine: str, tmp_path: Path) -> None:
    if is_tmpfs(str(tmp_path)):
        pytest.skip("tmp_path is on tmpfs")
    tr = make_transport(engine=engine, direct=1, chunk=1 << 20)
    try:
        size = 4 << 20
        data = pattern(size, 13)
        f = make_file(tmp_path / "d.bin", data)
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        if not tr.link_files(h)[BASE]["direct"]:
            pytest.skip("filesystem refuses O_DIRECT")
        dst = aligned(size)
        s0 = tr.stats()
        assert one(tr, READ, dst.ctypes.data, BASE, size, h) == 0  # aligned: direct
        s1 = tr.stats()
        assert np.array_equal(dst, data)
        assert s1["direct_bytes"] - s0["direct_bytes"] == size
        assert s1["buffered_bytes"] == s0["buffered_bytes"]
        # unaligned memory: buffered fallback, same bytes
        dst2 = np.zeros(size + 1, np.uint8)
        assert one(tr, READ, dst2.ctypes.data + 1, BASE, 100_000, h) == 0
        s2 = tr.stats()
        assert dst2[1:100_001].tobytes() == data[:100_000].tobytes()
        assert s2["direct_bytes"] == s1["direct_bytes"] and s2["buffered_bytes"] - s1["buffered_bytes"] == 100_000
        # aligned start, unaligned length: direct prefix + buffered tail
        assert one(tr, READ, dst.ctypes.data, BASE + 8192, 3 * 4096 + 10, h) == 0
        s3 = tr.stats()
        assert dst[: 3 * 4096 + 10].tobytes() == data[8192 : 8192 + 3 * 4096 + 10].tobytes()
        assert s3["direct_bytes"] - s2["direct_bytes"] == 3 * 4096 and s3["buffered_bytes"] - s2["buffered_bytes"] == 10
        # direct writes, read back through the page cache
        new = aligned(1 << 20)
        new[:] = pattern(1 << 20, 14)
        assert one(tr, WRITE, new.ctypes.data, BASE + (1 << 20), 1 << 20, h) == 0
        assert tr.stats()["direct_bytes"] - s3["direct_bytes"] == 1 << 20
        with open(f, "rb") as fh:
            fh.seek(1 << 20)
            assert fh.read(1 << 20) == new.tobytes()
        # direct read hitting EOF of a short file: E_BOUNDS
        pl = tr.connect(peer(), [rbuf(BASE, f, length=size + (1 << 20))])
        assert one(tr, READ, dst.ctypes.data, BASE + size - 4096, 8192, pl.handle) == E_BOUNDS
    finally:
        tr.close()


def test_direct_on_tmpfs_uses_buffered() -> None:
    if not os.path.isdir("/dev/shm") or not is_tmpfs("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    tr = make_transport(direct=1)
    path = Path(f"/dev/shm/tent-gds-test-{os.getpid()}")
    try:
        data = pattern(1 << 20, 15)
        make_file(path, data)
        h = tr.connect(peer(), [rbuf(BASE, path)]).handle
        assert tr.link_files(h)[BASE]["direct"] is False
        dst = aligned(1 << 20)
        assert one(tr, READ, dst.ctypes.data, BASE, 1 << 20, h) == 0
        assert np.array_equal(dst, data)
        assert tr.stats()["direct_bytes"] == 0
    finally:
        tr.close()
        path.unlink(missing_ok=True)


# ------------------------------------------------------------------ large files
@pytest.mark.parametrize("engine", ENGINES)
def test_large_file_checksums(engine: str, tmp_path: Path) -> None:
    size = 256 << 20
    tr = make_transport(engine=engine, direct=1, threads=2, queue_depth=16, chunk=1 << 20)
    try:
        f = make_file(tmp_path / "big.bin", size)
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        src = aligned(size)
        src[:] = np.random.default_rng(16).integers(0, 256, size, dtype=np.uint8)
        digest = hashlib.sha256(src).hexdigest()
        assert one(tr, WRITE, src.ctypes.data, BASE, size, h, timeout=120) == 0
        h2 = hashlib.sha256()
        with open(f, "rb") as fh:
            while chunk := fh.read(16 << 20):
                h2.update(chunk)
        assert h2.hexdigest() == digest
        dst = aligned(size)
        # 4 slices in one batch
        q = size // 4
        b = many(tr, [(READ, dst.ctypes.data + i * q, BASE + i * q, q) for i in range(4)], h, timeout=120)
        assert b.error == 0 and b.bytes_done == size
        assert hashlib.sha256(dst).hexdigest() == digest
    finally:
        tr.close()


# ------------------------------------------------------------------ through the engine
def test_engine_register_file(tmp_path: Path) -> None:
    from tent_core.engine import Engine

    if not hasattr(Engine, "register_file"):
        pytest.skip("Engine.register_file not in this tent_core yet")
    from tent_core.types import READ_ONLY

    data = pattern(2 << 20, 17)
    fpath = make_file(tmp_path / "e.bin", data)
    with Engine(transports=["gds"]) as eng:
        assert "gds" in eng.transports, eng.availability
        fb = eng.register_file(str(fpath), segment="files")
        assert fb.kind == MemoryKind.FILE and fb.length == 2 << 20
        ro = eng.register_file(str(make_file(tmp_path / "ro.bin", pattern(4096, 18))), segment="ro", perm=READ_ONLY)
        assert ro.length == 4096
        created = eng.register_file(str(tmp_path / "new.bin"), segment="new", size=1 << 20)
        assert os.path.getsize(tmp_path / "new.bin") == 1 << 20 and created.length == 1 << 20
        mem = np.zeros(2 << 20, np.uint8)
        lb = eng.register(mem)
        eng.read(lb, eng.segment_name("files"), 2 << 20)
        assert np.array_equal(mem, data)
        mem[:] = pattern(2 << 20, 19)
        eng.write(lb, eng.segment_name("new"), 1 << 20, local_offset=12345)
        assert (tmp_path / "new.bin").read_bytes() == mem[12345 : 12345 + (1 << 20)].tobytes()
        from tent_core import errors

        with pytest.raises(errors.TentError):
            eng.write(lb, eng.segment_name("ro"), 4096)
        with pytest.raises(errors.TentError):
            eng.read(lb, eng.segment_name("files"), 4096, remote_offset=(2 << 20) - 100)


# ------------------------------------------------------------------ waiters run pieces
def _one_inline(tr: GdsTransport, op: int, local: int, remote: int, n: int, handle: int, timeout: float) -> Any:
    b = _native.Batch(1)
    ex = tr.executor
    assert _native.submit_one(ex.ops, ex.handle, b, op, local, remote, n, handle, 0, 1, 0, True) == 0
    return b


@pytest.mark.parametrize("engine", ENGINES)
def test_waiters_run_their_pieces(engine: str, tmp_path: Path) -> None:
    """A request submitted inline and waited for at once is usually run by its waiter (no worker
    hand-off); whoever runs each piece, every byte is right, and every piece ran exactly once.
    (nowait off: the submitting thread's own try would take every page-cache hit first.)"""
    size, piece, n = 8 << 20, 1 << 20, 200
    tr = make_transport(engine=engine, threads=2, queue_depth=8, chunk=piece, nowait=False)
    try:
        data = pattern(size, 31)
        f = make_file(tmp_path / "w.bin", data)
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        dst, src = aligned(piece), aligned(piece)
        s0 = tr.stats()
        for i in range(n):  # READs of a different MiB each time into a cleared buffer: nothing stale passes
            k = (i * 3) % (size // piece)
            dst[:] = 0
            b = _one_inline(tr, READ, dst.ctypes.data, BASE + k * piece, piece, h, 30)
            assert b.wait(30) and b.error == 0
            assert np.array_equal(dst, data[k * piece : (k + 1) * piece]), f"request {i}"
        want = data.copy()
        for i in range(n):  # WRITEs of fresh bytes, each checked in the file
            k = (i * 5) % (size // piece)
            src[:] = pattern(piece, 1000 + i)
            b = _one_inline(tr, WRITE, src.ctypes.data, BASE + k * piece, piece, h, 30)
            assert b.wait(30) and b.error == 0
            want[k * piece : (k + 1) * piece] = src
        assert np.array_equal(np.fromfile(f, np.uint8), want)
        s1 = tr.stats()
        ran = {k: s1[k] - s0[k] for k in ("waiter_pieces", "uring_ios", "sync_ios", "slices_ok", "buffered_bytes")}
        assert ran["slices_ok"] == 2 * n and ran["buffered_bytes"] == 2 * n * piece
        # one I/O per piece, whoever ran it (the workers' ring or pread/pwrite, or the waiter's pread/pwrite)
        assert ran["uring_ios"] + ran["sync_ios"] == 2 * n
        assert ran["waiter_pieces"] <= ran["sync_ios"]
        # the waiter comes microseconds after its submit, a woken worker usually later: within a
        # bounded number of requests, waiters have run pieces
        for _ in range(2000):
            if tr.stats()["waiter_pieces"] > s0["waiter_pieces"]:
                break
            b = _one_inline(tr, READ, dst.ctypes.data, BASE, piece, h, 30)
            assert b.wait(30) and b.error == 0
        assert tr.stats()["waiter_pieces"] > s0["waiter_pieces"]
    finally:
        tr.close()


def test_a_short_poll_runs_no_piece(tmp_path: Path) -> None:
    """A waiter offering less than 1 ms (a poll) takes no I/O onto its thread: its wait must not
    overrun by a piece's I/O time; the workers finish the request."""
    piece = 1 << 20
    tr = make_transport(threads=1, chunk=piece)
    try:
        data = pattern(4 * piece, 32)
        h = tr.connect(peer(), [rbuf(BASE, make_file(tmp_path / "p.bin", data))]).handle
        dst = aligned(4 * piece)
        s0 = tr.stats()
        for _ in range(20):
            b = _one_inline(tr, READ, dst.ctypes.data, BASE, 4 * piece, h, 30)
            deadline = time.monotonic() + 30
            while not b.wait(0.0002):
                assert time.monotonic() < deadline
            assert b.error == 0 and np.array_equal(dst, data)
            dst[:] = 0
        s1 = tr.stats()
        assert s1["waiter_pieces"] == s0["waiter_pieces"] and s1["slices_ok"] - s0["slices_ok"] == 20
    finally:
        tr.close()


def test_engine_inline_bytes_config(tmp_path: Path) -> None:
    """Through the engine: requests up to `inline_bytes` may be run by their waiter (here with the
    submitting thread's own try off); 0 turns it off."""
    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    data = pattern(4 << 20, 33)
    fpath = make_file(tmp_path / "i.bin", data)
    for inline, expect_waiter in ((0, False), (1 << 20, True)):
        with Engine({"transports": {"gds": {"inline_bytes": inline, "nowait": False}}}, transports=["gds"]) as eng:
            assert eng.transports["gds"].inline_bytes == inline
            eng.register_file(str(fpath), segment="f")
            local = eng.allocate(1 << 20, segment="l")
            for i in range(100 if not expect_waiter else 2000):  # bounded: waiters run pieces well before
                local.array[:] = 0
                k = i % 4
                eng.submit([Request(OpCode.READ, local, 0, eng.segment_name("f"), k << 20, 1 << 20)]).wait()
                assert np.array_equal(local.array, data[k << 20 : (k + 1) << 20])
                if expect_waiter and eng.transports["gds"].stats()["waiter_pieces"] > 0:
                    break
            assert (eng.transports["gds"].stats()["waiter_pieces"] > 0) == expect_waiter


# ------------------------------------------------------------------ the submitting thread's own try (RWF_NOWAIT)
def _cache_only(path: Path, offset: int, length: int) -> None:
    """Leave only [offset, offset+length) of `path` in the page cache: drop the whole file (written
    back first; a partial drop keeps the large folios that straddle its ends), then read the range
    back through an fd without readahead."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        assert len(os.pread(fd, length, offset)) == length
    finally:
        os.close(fd)


@pytest.mark.parametrize("engine", ENGINES)
def test_submitting_thread_reads_cached_slices(engine: str, tmp_path: Path) -> None:
    """A READ of one piece out of the page cache is done by the submitting thread (preadv2 with
    RWF_NOWAIT) and reported before submit returns; odd offsets and lengths, never-repeating bytes,
    into junk-filled memory at odd addresses; every byte right, the bytes around untouched."""
    size, piece = 4 << 20, 1 << 20
    data = tpattern(size, 41)
    f = make_file(tmp_path / "n.bin", data)
    tr = make_transport(engine=engine, threads=2, queue_depth=8, chunk=piece)
    try:
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        dst = aligned(piece + 64)
        s0 = tr.stats()
        cases = [(0, piece), (1, piece - 1), (4095, 12345), (size - 777, 777), (2 * piece + 3, piece - 4096 + 1), (7, 1)]
        done_at_submit = 0
        for i, (off, n) in enumerate(cases):
            dst[:] = tpattern(len(dst), 900 + i)  # junk that differs from the file's bytes
            before = dst.copy()
            at = 1 + i % 7  # odd local addresses
            b = _one_inline(tr, READ, dst.ctypes.data + at, BASE + off, n, h, 30)
            done_at_submit += b.wait(0)
            assert b.wait(30) and b.error == 0, (off, n)
            assert np.array_equal(dst[at : at + n], data[off : off + n]), (off, n)
            assert np.array_equal(dst[:at], before[:at]) and np.array_equal(dst[at + n :], before[at + n :])
        s1 = tr.stats()
        ran = {k: s1[k] - s0[k] for k in ("nowait_slices", "nowait_ios", "slices_ok", "buffered_bytes")}
        assert ran["slices_ok"] == len(cases)
        assert ran["buffered_bytes"] == sum(n for _, n in cases)  # every byte moved exactly once
        # the file was just written: its pages are cached, every READ is the submitting thread's
        assert ran["nowait_slices"] == len(cases) and done_at_submit == len(cases)
    finally:
        tr.close()


@pytest.mark.parametrize("engine", ENGINES)
def test_submitting_thread_leaves_what_would_block(engine: str, tmp_path: Path) -> None:
    """Pages not in the page cache: the non-blocking read stops at the first of them (a short read,
    or EAGAIN) and the rest of the slice goes to the workers / the waiter, from where it stopped;
    every byte right either way."""
    size, piece = 4 << 20, 1 << 20
    data = tpattern(size, 42)
    f = make_file(tmp_path / "e.bin", data)
    tr = make_transport(engine=engine, threads=2, queue_depth=8, chunk=piece)
    try:
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        dst = aligned(piece)
        partial = 0
        for i in range(20):  # bounded: the first try normally shows it
            off = (i % 3) * piece + 4096 * (i + 1)
            _cache_only(f, off, piece // 2)  # the first half of the range cached, the rest not
            dst[:] = 0xA5
            s0 = tr.stats()
            b = _one_inline(tr, READ, dst.ctypes.data, BASE + off, piece - 3, h, 30)
            assert b.wait(30) and b.error == 0
            assert np.array_equal(dst[: piece - 3], data[off : off + piece - 3]) and (dst[piece - 3 :] == 0xA5).all()
            s1 = tr.stats()
            assert s1["buffered_bytes"] - s0["buffered_bytes"] == piece - 3  # no byte twice
            if s1["nowait_slices"] == s0["nowait_slices"] and s1["nowait_ios"] > s0["nowait_ios"]:
                partial += 1  # the cached half here, the rest by a worker or the waiter
        assert partial > 0
    finally:
        tr.close()


def test_submitting_thread_errors_typed(tmp_path: Path) -> None:
    """Whatever the submitting thread cannot finish is reported like any slice: past the end of the
    file (E_BOUNDS, never garbage), outside every file (E_BOUNDS), a read-only file (E_PERMISSION),
    a batch cancelled before its submit (E_CANCELLED, nothing read)."""
    data = tpattern(3 * 4096 + 100, 43)
    f = make_file(tmp_path / "s.bin", data)
    ro = make_file(tmp_path / "ro.bin", tpattern(8192, 44))
    tr = make_transport(threads=1, chunk=1 << 20)
    try:
        h = tr.connect(peer(), [rbuf(BASE, f, length=1 << 20), rbuf(BASE + (1 << 40), ro, perm=Permission.READ)]).handle
        dst = np.full(1 << 20, 0xAB, np.uint8)

        def inline(op: int, local: int, remote: int, n: int) -> int:
            b = _one_inline(tr, op, local, remote, n, h, 30)
            assert b.wait(30)
            return int(b.error)

        assert inline(READ, dst.ctypes.data, BASE + 4096, 3 * 4096) == E_BOUNDS  # short read, then EOF
        assert inline(READ, dst.ctypes.data, BASE + 4096 + 1, 2 * 4096 + 99) == 0  # up to EOF exactly
        assert dst[: 2 * 4096 + 99].tobytes() == data[4096 + 1 :].tobytes()
        assert inline(READ, dst.ctypes.data, BASE + (2 << 20), 10) == E_BOUNDS  # in no file
        src = tpattern(8192, 45)
        assert inline(WRITE, src.ctypes.data, BASE + (1 << 40), 8192) == E_PERMISSION
        assert ro.read_bytes() == tpattern(8192, 44).tobytes()
        c = _native.Batch(1)  # cancelled before it was submitted: never read
        c.cancel()
        dst[:] = 0xAB
        ex = tr.executor
        assert _native.submit_one(ex.ops, ex.handle, c, READ, dst.ctypes.data, BASE, 4096, h, 0, 1, 0, True) == 0
        assert c.wait(30) and c.error == E_CANCELLED and (dst == 0xAB).all()
        assert tr.stats()["nowait_slices"] == 1
    finally:
        tr.close()


@pytest.mark.parametrize("inline_write", [0, 1 << 20])
@pytest.mark.parametrize("where", ["tmp_path", "/dev/shm"])
def test_submitting_thread_writes_where_the_filesystem_allows(where: str, inline_write: int, tmp_path: Path) -> None:
    """A WRITE of one piece is the submitting thread's where the filesystem takes buffered writes
    without blocking (tmpfs, XFS); where it refuses RWF_NOWAIT (ext4) the file remembers that and
    its writes up to inline_write_bytes are the submitting thread's plain pwrites (0: they go to
    the workers / the waiter). Several slices in one call: the first may be the caller's, the
    others are queued. Every byte lands either way."""
    directory = tmp_path if where == "tmp_path" else Path(where)
    if not directory.is_dir():
        pytest.skip(f"no {where}")
    nowait = _nowait_writes(directory)
    size, piece = 4 << 20, 1 << 20
    f = directory / f"gds-nowait-{os.getpid()}.bin"
    tr = make_transport(threads=2, chunk=piece, inline_write_bytes=inline_write)
    try:
        make_file(f, size)
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        src = aligned(size + 8)
        src[:] = tpattern(len(src), 46)
        s0 = tr.stats()
        for i, (off, n) in enumerate([(0, piece), (piece + 5, piece - 11), (3 * piece + 1, 4096)]):
            b = _one_inline(tr, WRITE, src.ctypes.data + off + i, BASE + off, n, h, 30)
            assert b.wait(30) and b.error == 0
        arr = np.zeros(3, SLICE_DTYPE)
        for i, (off, n) in enumerate([(2 * piece, 1000), (2 * piece + 1000, piece - 1000), (3 * piece + 4097, 3)]):
            arr[i] = (src.ctypes.data + off, BASE + off, n, h, 0, 0, WRITE, 0, 1, 0)
        b = _native.Batch(3)
        assert _native.submit(tr.executor.ops, tr.executor.handle, b, arr, True) == 0
        assert b.wait(30) and b.error == 0 and b.bytes_done == piece + 3
        want = np.zeros(size, np.uint8)
        for i, (off, n) in enumerate([(0, piece), (piece + 5, piece - 11), (3 * piece + 1, 4096)]):
            want[off : off + n] = src[off + i : off + i + n]
        for off, n in [(2 * piece, 1000), (2 * piece + 1000, piece - 1000), (3 * piece + 4097, 3)]:
            want[off : off + n] = src[off : off + n]
        assert np.array_equal(np.fromfile(f, np.uint8), want)
        s1 = tr.stats()
        assert s1["slices_ok"] - s0["slices_ok"] == 6
        if nowait:
            assert s1["nowait_slices"] - s0["nowait_slices"] >= 4  # each call's first slice
            assert s1["inline_writes"] == s0["inline_writes"]
        elif inline_write:  # refused (EOPNOTSUPP, remembered): each call's first slice, pwritten
            assert s1["nowait_slices"] - s0["nowait_slices"] == 4 and s1["inline_writes"] - s0["inline_writes"] == 4
        else:  # the first try learned EOPNOTSUPP; nothing after it tried again
            assert s1["nowait_slices"] == s0["nowait_slices"] and s1["nowait_ios"] == s0["nowait_ios"]
            assert s1["inline_writes"] == s0["inline_writes"]
    finally:
        tr.close()
        f.unlink(missing_ok=True)


@pytest.mark.parametrize("where", ["tmp_path", "/dev/shm"])
def test_submitting_thread_write_errors_typed(where: str, tmp_path: Path) -> None:
    """The submitting thread's WRITEs (RWF_NOWAIT or, where refused, a plain pwrite) report their
    errors like any slice and touch nothing they must not: past the registered length (E_BOUNDS),
    a read-only file (E_PERMISSION), a batch cancelled before its submit (E_CANCELLED); longer
    than inline_write_bytes goes to the workers. Non-repeating patterns, every byte checked."""
    directory = tmp_path if where == "tmp_path" else Path(where)
    if not directory.is_dir():
        pytest.skip(f"no {where}")
    size = 1 << 20
    f = make_file(directory / f"gds-werr-{os.getpid()}.bin", tpattern(size, 61))
    ro = make_file(directory / f"gds-wro-{os.getpid()}.bin", tpattern(8192, 62))
    tr = make_transport(threads=1, chunk=1 << 20, inline_write_bytes=64 << 10)
    try:
        h = tr.connect(peer(), [rbuf(BASE, f), rbuf(BASE + (1 << 40), ro, perm=Permission.READ)]).handle
        src = tpattern(size + 4096, 63)
        want = tpattern(size, 61)

        def inline(local: int, remote: int, n: int, b: Any = None) -> int:
            if b is None:
                b = _one_inline(tr, WRITE, local, remote, n, h, 30)
            else:
                ex = tr.executor
                assert _native.submit_one(ex.ops, ex.handle, b, WRITE, local, remote, n, h, 0, 1, 0, True) == 0
            assert b.wait(30)
            return int(b.error)

        s0 = tr.stats()
        assert inline(src.ctypes.data + 7, BASE + 4097, 60000) == 0  # learns the filesystem, then writes
        want[4097 : 4097 + 60000] = src[7 : 7 + 60000]
        assert inline(src.ctypes.data + 3, BASE + size - 4096, 8192) == E_BOUNDS  # past the end: untouched
        assert inline(src.ctypes.data, BASE + (1 << 40), 4096) == E_PERMISSION
        c = _native.Batch(1)
        c.cancel()
        assert inline(src.ctypes.data + 11, BASE, 4096, c) == E_CANCELLED
        assert inline(src.ctypes.data + 1, BASE + 70000, 65537) == 0  # over inline_write_bytes: a worker's
        want[70000 : 70000 + 65537] = src[1 : 1 + 65537]
        assert inline(src.ctypes.data + 5, BASE + 200001, 65536) == 0
        want[200001 : 200001 + 65536] = src[5 : 5 + 65536]
        assert np.array_equal(np.fromfile(f, np.uint8), want)
        assert ro.read_bytes() == tpattern(8192, 62).tobytes()
        s1 = tr.stats()
        if not _nowait_writes(directory):
            assert s1["inline_writes"] - s0["inline_writes"] == 2
        assert s1["nowait_slices"] - s0["nowait_slices"] == 2
    finally:
        tr.close()
        f.unlink(missing_ok=True)
        ro.unlink(missing_ok=True)


def test_submitting_thread_write_lets_go_of_the_gil(tmp_path: Path) -> None:
    """Where RWF_NOWAIT is refused, the submitting thread's pwrite may sleep (here on the inode's
    lock, held by another thread's 256 MiB pwrite to the same file): the GIL is let go meanwhile,
    so another Python thread runs in the middle of that submit call. Attempts where the call did
    not sleep (the big write not yet or no longer holding the lock) are not judged; any sleeping
    one with the other thread running inside it passes (the OS may starve that thread in one)."""
    if _nowait_writes(tmp_path):
        pytest.skip("this filesystem takes RWF_NOWAIT buffered writes: nothing is pwritten inline")
    big, piece = 256 << 20, 1 << 20
    f = make_file(tmp_path / "gil.bin", big + piece)
    tr = make_transport(threads=1, chunk=piece)
    fd = os.open(f, os.O_WRONLY)
    ticks: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())

    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    tk = threading.Thread(target=ticker, daemon=True)
    tk.start()
    judged, ran_inside = 0, 0
    try:
        h = tr.connect(peer(), [rbuf(BASE, f)]).handle
        blob = memoryview(bytes(big))
        for attempt in range(12):
            src = tpattern(piece, 80 + attempt)
            holder = threading.Thread(target=os.pwrite, args=(fd, blob, 0))
            holder.start()
            time.sleep(0.003)
            t0 = time.perf_counter()
            b = _one_inline(tr, WRITE, src.ctypes.data, BASE + big, piece, h, 30)
            t1 = time.perf_counter()
            assert b.wait(30) and b.error == 0
            holder.join(30)
            with open(f, "rb") as fh:
                fh.seek(big)
                assert fh.read(piece) == src.tobytes()
            d = t1 - t0
            if d < 0.02:
                continue
            judged += 1
            lo, hi = t0 + 0.3 * d, t1 - 0.3 * d
            ran_inside += any(lo <= t <= hi for t in ticks[-200000:])
            ticks.clear()
            if ran_inside or judged >= 5:
                break
        assert tr.stats()["inline_writes"] >= 1
        if not judged:
            pytest.skip("no submit call slept on the inode's lock (the big write was always done first)")
        assert ran_inside, f"another Python thread never ran inside {judged} sleeping submit calls"
    finally:
        stop.set()
        tk.join(10)
        sys.setswitchinterval(old_switch)
        os.close(fd)
        tr.close()


def test_engine_writes_on_the_submitting_thread(tmp_path: Path) -> None:
    """Through the engine with the defaults, on this machine's tmp directory: a 1 MiB WRITE is done
    inside submit (the handle finished when submit returns) whether the filesystem takes
    RWF_NOWAIT or not; a deadline far off does not change that; `inline_write_bytes` 0 on a
    refusing filesystem leaves it to workers and waiter. Bytes checked after each."""
    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    nowait = _nowait_writes(tmp_path)
    for inline_write in (1 << 20, 0):
        fpath = make_file(tmp_path / f"w{inline_write}.bin", 4 << 20)
        want = np.zeros(4 << 20, np.uint8)
        with Engine({"transports": {"gds": {"inline_write_bytes": inline_write}}}, transports=["gds"]) as eng:
            eng.register_file(str(fpath), segment="f")
            local = eng.allocate(1 << 20, segment="l")
            done_at_submit = 0
            for i in range(8):
                local.array[:] = tpattern(1 << 20, 100 + i)
                k = (i * 3) % 4
                h = eng.submit([Request(OpCode.WRITE, local, 0, eng.segment_name("f"), k << 20, 1 << 20)], deadline=30.0)
                done_at_submit += h.remaining == 0
                h.wait()
                want[k << 20 : (k + 1) << 20] = local.array
            assert np.array_equal(np.fromfile(fpath, np.uint8), want)
            st = eng.transports["gds"].stats()
            if nowait or inline_write:
                assert st["nowait_slices"] == 8 and done_at_submit == 8
            else:
                assert st["nowait_slices"] == 0 and st["inline_writes"] == 0
            assert st["inline_writes"] == (0 if nowait or not inline_write else 8)


def test_engine_reads_on_the_submitting_thread(tmp_path: Path) -> None:
    """Through the engine with the defaults: a 1 MiB READ of a cached file is done inside submit
    (the handle is finished when submit returns); `nowait` off leaves it to workers and waiter."""
    from tent_core.engine import Engine, Request
    from tent_core.types import OpCode

    data = tpattern(4 << 20, 47)
    fpath = make_file(tmp_path / "d.bin", data)
    for nowait in (True, False):
        with Engine({"transports": {"gds": {"nowait": nowait}}}, transports=["gds"]) as eng:
            eng.register_file(str(fpath), segment="f")
            local = eng.allocate(1 << 20, segment="l")
            for i in range(8):
                local.array[:] = 0
                k = (i * 3) % 4
                eng.submit([Request(OpCode.READ, local, 0, eng.segment_name("f"), k << 20, 1 << 20)]).wait()
                assert np.array_equal(local.array, data[k << 20 : (k + 1) << 20])
            st = eng.transports["gds"].stats()
            assert (st["nowait_slices"] == 8) == nowait and (st["nowait_slices"] == 0) == (not nowait)
