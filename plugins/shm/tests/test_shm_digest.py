"""The shm executor folds a READ it copies on the submitting thread into the digest armed for that
submit (engine.submit(..., digest=d); tent/digest.h): through real engines in two roles, memfd mode.
The digest must equal python xxhash's xxh3_64 of the bytes, whatever the pieces; bytes the copy did
not fold (out of stream order, CMA, a worker) are left to the caller, who folds them in order."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tent_core import READ, Digest, Request
from tent_core.engine import Engine
from tent_core.testing import pattern

xxhash = pytest.importorskip("xxhash")
MB = 1 << 20


def _engines(monkeypatch: pytest.MonkeyPatch, mode: str, **extra: Any) -> Iterator[tuple[Engine, Engine, str]]:
    monkeypatch.setenv("TENT_PLUGINS", "shm")
    cfg: dict[str, Any] = {"transports": {"shm": {"mode": mode}}, **extra}
    a, b = Engine(cfg), Engine(cfg)
    try:
        if "shm" not in b.transports:
            pytest.skip("engine did not start the shm transport")
        yield a, b, mode
    finally:
        b.close()
        a.close()


@pytest.fixture(params=["memfd", "cma"])
def pair(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine, str]]:
    yield from _engines(monkeypatch, request.param)


@pytest.fixture
def memfd(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, Engine, str]]:
    yield from _engines(monkeypatch, "memfd")


def test_inline_reads_fold_into_the_digest(pair: tuple[Engine, Engine, str]) -> None:
    a, b, mode = pair
    n = 9 * MB + 12345
    src = a.allocate(n)
    src.array[:] = pattern(n, 21)
    dst = b.allocate(n)
    dst.array[:] = 0xEE
    seg = f"{a.engine_id}/default"
    assert b.transports["shm"].inline_digest == (mode != "cma")
    d = Digest(dst.addr)
    # odd piece sizes across the executor's 64 KiB runs and its 1 MiB chunk, each at most inline_bytes
    pieces = [1, 65535, 65537, MB + 3, 4 * MB, 7, 3 * MB + 1]
    pos = 0
    for m in [*pieces, n - sum(pieces)]:
        b.submit([Request(READ, dst, pos, seg, pos, m)], deadline=30, digest=d).wait(30)
        if mode == "memfd":
            assert d.next == dst.addr + pos + m  # folded by the copy itself
        else:
            assert d.next == dst.addr + pos  # CMA does not fold: the caller does, in order
            d.update(dst.array[pos:pos + m])
        pos += m
    assert np.array_equal(dst.array, src.array)
    assert d.folded == n and d.intdigest() == xxhash.xxh3_64_intdigest(pattern(n, 21).tobytes())


def test_only_the_streams_next_bytes_fold(memfd: tuple[Engine, Engine, str]) -> None:
    """A piece that does not continue the stream (out of order) is copied but not folded; a submit
    without digest= folds nothing; the caller then folds what is missing and gets the same digest."""
    a, b, _ = memfd
    n = 2 * MB + 999
    src = a.allocate(n)
    src.array[:] = pattern(n, 22)
    dst = b.allocate(n)
    seg = f"{a.engine_id}/default"
    d = Digest(dst.addr)
    half = MB + 1
    b.submit([Request(READ, dst, half, seg, half, n - half)], deadline=30, digest=d).wait(30)  # ahead of the stream
    assert d.next == dst.addr and d.folded == 0
    b.submit([Request(READ, dst, 0, seg, 0, half)], deadline=30).wait(30)  # no digest armed
    assert d.next == dst.addr and d.folded == 0
    d.update(dst.array)
    assert d.intdigest() == xxhash.xxh3_64_intdigest(pattern(n, 22).tobytes())
    # re-read the head with the digest armed on a fresh stream: only that piece folds
    d.reset(dst.addr)
    b.submit([Request(READ, dst, 0, seg, 0, half)], deadline=30, digest=d).wait(30)
    assert d.next == dst.addr + half and d.folded == half


def test_a_changed_source_byte_changes_the_folded_digest(memfd: tuple[Engine, Engine, str]) -> None:
    a, b, _ = memfd
    n = 3 * MB + 17
    src = a.allocate(n)
    src.array[:] = pattern(n, 23)
    want = xxhash.xxh3_64_intdigest(pattern(n, 23).tobytes())
    dst = b.allocate(n)
    seg = f"{a.engine_id}/default"
    for pos in (0, 65536, 2 * MB + 5, n - 1):
        src.array[pos] ^= 0x10
        d = Digest(dst.addr)
        b.submit([Request(READ, dst, 0, seg, 0, n)], deadline=30, digest=d).wait(30)
        assert d.folded == n and d.intdigest() != want, pos
        src.array[pos] ^= 0x10
    d = Digest(dst.addr)
    b.submit([Request(READ, dst, 0, seg, 0, n)], deadline=30, digest=d).wait(30)
    assert d.intdigest() == want


def test_digest_through_the_planner(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the native fast path off, Engine.submit arms the digest around the planner's submit."""
    for a, b, _ in _engines(monkeypatch, "memfd", fast_path=False):
        n = MB + 3
        src = a.allocate(n)
        src.array[:] = pattern(n, 24)
        dst = b.allocate(n)
        d = Digest(dst.addr)
        b.submit([Request(READ, dst, 0, f"{a.engine_id}/default", 0, n)], deadline=30, digest=d).wait(30)
        assert d.next == dst.addr + n and d.intdigest() == xxhash.xxh3_64_intdigest(pattern(n, 24).tobytes())
