"""The tcp executor folds READ answers into the digest the caller armed for the slice's stream
(engine.submit(..., digest=d or [d1, d2, ...]); Transport.receive_digest; tent/digest.h): on the
thread that receives them, each recv'd run right after it landed in the destination. A request is
cut into 1 MiB slices over several connections, whose answers land out of order: the digest must
still be exactly python xxhash's xxh3_64 of the destination bytes in address order, nothing folded
twice or out of order; what the executor did not fold the caller folds with Digest.land."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tcp_helpers import engine_pair

from tent_core import READ, Digest, Request
from tent_core.engine import Engine
from tent_core.testing import pattern

xxhash = pytest.importorskip("xxhash")
MB = 1 << 20




@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine]]:
    yield from engine_pair(monkeypatch)


@pytest.fixture
def pair_off(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine]]:
    yield from engine_pair(monkeypatch, receive_digest=0)


def _src_dst(a: Engine, b: Engine, n: int, seed: int) -> tuple[Any, Any, str]:
    src = a.allocate(n)
    src.array[:] = pattern(n, seed)
    dst = b.allocate(n)
    dst.array[:] = 0xEE
    return src, dst, f"{a.engine_id}/default"


# odd sizes: around the 1 MiB slices (several connections at once), the 1 MiB recv step and 64 KiB
PIECES = [1, 65535, MB + 3, 4 * MB, 7, 3 * MB + 1, 2 * MB - 1]


def test_read_answers_fold_into_the_digest_in_stream_order(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    assert b.transports["tcp"].receive_digest
    n = sum(PIECES) + 12345
    src, dst, seg = _src_dst(a, b, n, 31)
    want = xxhash.xxh3_64_intdigest(src.array.tobytes())
    # all pieces in one batch: each is cut into 1 MiB slices spread over the rail's connections
    d = Digest(dst.addr, dst.addr + n)
    reqs, pos = [], 0
    for m in [*PIECES, n - sum(PIECES)]:
        reqs.append(Request(READ, dst, pos, seg, pos, m))
        pos += m
    b.submit(reqs, deadline=30, digest=d).wait(30)
    assert bytes(dst.array) == bytes(src.array)
    assert (d.next, d.folded) == (dst.addr + n, n)  # every byte folded where it landed, none by the caller
    assert d.intdigest() == want
    # piece by piece, one batch each (the answers of a lone READ: header and payload in one readv)
    dst.array[:] = 0xEE
    d = Digest(dst.addr, dst.addr + n)
    pos = 0
    for m in [*PIECES, n - sum(PIECES)]:
        b.submit([Request(READ, dst, pos, seg, pos, m)], deadline=30, digest=d).wait(30)
        pos += m
    assert d.folded == n and d.intdigest() == want


def test_one_batch_several_streams_each_its_own_digest(pair: tuple[Engine, Engine]) -> None:
    """A batch over several tensors: each slice folds into the armed digest whose range holds its
    destination; bytes outside every range (the gap between the tensors) fold nowhere."""
    a, b = pair
    n = 6 * MB + 4099
    src, dst, seg = _src_dst(a, b, n, 32)
    cuts = [(0, 2 * MB + 1), (2 * MB + 1, 2 * MB + 4097), (2 * MB + 4097, n)]  # the middle one: no digest
    ds = [Digest(dst.addr + x, dst.addr + y) for x, y in (cuts[0], cuts[2])]
    b.submit([Request(READ, dst, x, seg, x, y - x) for x, y in cuts], deadline=30, digest=[ds[1], None, ds[0]]).wait(30)
    for d, (x, y) in zip(ds, (cuts[0], cuts[2]), strict=True):
        assert (d.next, d.folded) == (dst.addr + y, y - x)
        assert d.intdigest() == xxhash.xxh3_64_intdigest(src.array[x:y].tobytes())


def test_what_the_executor_did_not_fold_the_caller_folds(pair: tuple[Engine, Engine]) -> None:
    """Pieces READ without the digest armed (another route, a retry) land unfolded, and pieces after
    them land ahead of the stream: the caller's land() of the landed range folds the rest, in order."""
    a, b = pair
    n = 9 * MB + 5
    src, dst, seg = _src_dst(a, b, n, 33)
    d = Digest(dst.addr, dst.addr + n)
    b.submit([Request(READ, dst, 0, seg, 0, 3 * MB)], deadline=30, digest=d).wait(30)
    b.submit([Request(READ, dst, 3 * MB, seg, 3 * MB, 2 * MB + 1)], deadline=30).wait(30)  # not armed
    b.submit([Request(READ, dst, 5 * MB + 1, seg, 5 * MB + 1, n - 5 * MB - 1)], deadline=30, digest=d).wait(30)
    assert d.folded == 3 * MB and d.next == dst.addr + 3 * MB  # the rest is ahead of a gap: noted, not folded
    assert d.land(dst.array) == n - 3 * MB  # the gap, then the noted runs after it
    assert d.intdigest() == xxhash.xxh3_64_intdigest(src.array.tobytes())


def test_receive_digest_off_folds_nothing(pair_off: tuple[Engine, Engine]) -> None:
    a, b = pair_off
    assert not b.transports["tcp"].receive_digest
    n = 3 * MB + 17
    src, dst, seg = _src_dst(a, b, n, 34)
    d = Digest(dst.addr, dst.addr + n)
    b.submit([Request(READ, dst, 0, seg, 0, n)], deadline=30, digest=d).wait(30)
    assert d.folded == 0
    assert d.land(dst.array) == n and d.intdigest() == xxhash.xxh3_64_intdigest(src.array.tobytes())


def test_a_changed_source_byte_changes_the_digest(pair: tuple[Engine, Engine]) -> None:
    a, b = pair
    n = 5 * MB + 3
    src, dst, seg = _src_dst(a, b, n, 35)
    want = xxhash.xxh3_64_intdigest(src.array.tobytes())  # what the publisher announced
    for where in (0, 2 * MB + 1, n - 1):
        src.array[where] ^= 0x10
        d = Digest(dst.addr, dst.addr + n)
        b.submit([Request(READ, dst, 0, seg, 0, n)], deadline=30, digest=d).wait(30)
        assert d.folded == n and d.intdigest() != want, where
        src.array[where] ^= 0x10


def test_small_reads_of_pipelined_runs_fold_too(pair: tuple[Engine, Engine]) -> None:
    """Small READs leave in pipelined runs (one connection, answers read back to back, each answer's
    payload and the next header in one recvmsg): their payloads fold as they land as well."""
    a, b = pair
    piece, k = 16 * 1024 + 3, 48
    n = piece * k
    src, dst, seg = _src_dst(a, b, n, 36)
    d = Digest(dst.addr, dst.addr + n)
    b.submit([Request(READ, dst, i * piece, seg, i * piece, piece) for i in range(k)], deadline=30, digest=d).wait(30)
    assert bytes(dst.array) == bytes(src.array)
    in_transport = d.folded
    assert in_transport > 0
    assert d.land(dst.array) == n - in_transport  # what it could not note (if anything), folded here
    assert d.intdigest() == xxhash.xxh3_64_intdigest(src.array.tobytes())
