"""tent_core.Digest (tent/digest.h, the vendored xxhash.h) against the python xxhash package: the
same xxh3_64, bit for bit, however the stream is cut (refhub publishes with python xxhash and the
shm executor folds with the C one), and one changed byte anywhere changes it."""

from __future__ import annotations

import numpy as np
import pytest

from tent_core import Digest
from tent_core.testing import pattern

xxhash = pytest.importorskip("xxhash")

RUN = 64 << 10  # TENT_DIGEST_RUN: the executor folds in runs of this size


def _fold(data: np.ndarray, cuts: list[int]) -> Digest:
    d = Digest(1000)
    pos = 0
    for c in [*cuts, data.size]:
        d.update(data[pos:c])
        pos = c
    assert d.folded == data.size and d.next == 1000 + data.size
    return d


@pytest.mark.parametrize("n", [0, 1, 15, 16, 17, 128, 239, 240, 241, 1023, 1024, 1025, RUN - 1, RUN, RUN + 1,
                               3 * RUN + 77, (1 << 20) + 13, (4 << 20) - 1])
def test_streamed_digest_equals_python_xxh3_64(n: int) -> None:
    data = pattern(n, n + 1)
    want = xxhash.xxh3_64_intdigest(data.tobytes())
    assert Digest().intdigest() == xxhash.xxh3_64_intdigest(b"")
    assert _fold(data, []).intdigest() == want  # one piece
    rng = np.random.default_rng(n)
    for _ in range(4):  # odd cuts, piece boundaries anywhere (inside XXH3's 64-byte stripes and 1 KiB blocks)
        k = int(rng.integers(0, 8))
        cuts = sorted(int(c) for c in rng.integers(0, n + 1, k))
        assert _fold(data, cuts).intdigest() == want, cuts
    if n > 2:
        assert _fold(data, list(range(1, n, max(1, n // 300)))).intdigest() == want  # many small pieces


def test_one_changed_byte_changes_the_digest() -> None:
    n = 3 * RUN + 5
    data = pattern(n, 7)
    want = _fold(data, [RUN, 2 * RUN + 1]).intdigest()
    for pos in (0, RUN - 1, RUN, 2 * RUN + 1, n - 1):
        bad = data.copy()
        bad[pos] ^= 0x01
        assert _fold(bad, [RUN, 2 * RUN + 1]).intdigest() != want, pos


def test_reset_and_arguments() -> None:
    d = Digest(5)
    d.update(b"abc")
    assert (d.next, d.folded) == (8, 3)
    d.reset(64)
    assert (d.next, d.folded) == (64, 0) and d.intdigest() == xxhash.xxh3_64_intdigest(b"")
    with pytest.raises(TypeError):
        d.update(12)


# ---- landing bytes where they are (a receive path, Digest.land; tent_digest_land in C) ----


def _cuts(n: int, rng: np.random.Generator, pieces: int) -> list[tuple[int, int]]:
    cuts = sorted({0, n, *(int(x) for x in rng.integers(1, max(2, n), pieces - 1))})
    return list(zip(cuts[:-1], cuts[1:], strict=True))


@pytest.mark.parametrize("n", [1, 239, RUN + 1, 3 * RUN + 77, (1 << 20) + 13])
def test_landed_pieces_fold_in_stream_order_whatever_order_they_land(n: int) -> None:
    """Pieces landing ahead of the stream are noted and folded when the gap closes: any landing
    order gives python xxhash's xxh3_64 of the bytes in address order."""
    data = pattern(n, 9)
    base = data.ctypes.data
    want = xxhash.xxh3_64_intdigest(data.tobytes())
    rng = np.random.default_rng(n)
    for _ in range(5):
        pieces = _cuts(n, rng, min(n, 12))
        order = list(rng.permutation(len(pieces)))
        d = Digest(base, base + n)
        ahead = 0  # bytes of pieces that land while a piece before them is missing
        for k, i in enumerate(order):
            a, b = pieces[i]
            if any(j < i for j in order[k + 1:]):
                ahead += b - a
            d.land(data[a:b], False)
        assert (d.next, d.folded) == (base + n, n), order
        assert d.late == ahead  # hashed from the notes when the gap closed; the others where they landed
        assert d.intdigest() == want


def test_land_ignores_bytes_outside_its_range_and_folded_ones() -> None:
    data = pattern(5 * RUN, 3)
    base = data.ctypes.data
    d = Digest(base + RUN, base + 3 * RUN)  # the stream is [RUN, 3 RUN) of the buffer
    assert d.land(data[:RUN]) == 0 and d.folded == 0  # before the range
    assert d.land(data[:2 * RUN]) == RUN  # its part inside the range
    assert d.land(data[RUN:2 * RUN]) == 0  # folded already: not twice
    assert d.land(data[RUN:]) == RUN  # the part past the end is not the stream's
    assert (d.start, d.end, d.next, d.folded) == (base + RUN, base + 3 * RUN, base + 3 * RUN, 2 * RUN)
    assert d.intdigest() == xxhash.xxh3_64_intdigest(data[RUN:3 * RUN].tobytes())
    with pytest.raises(ValueError):
        Digest(10, 5)


def test_runs_it_cannot_note_are_left_to_the_caller() -> None:
    """More pieces ahead of the stream than the notes hold (TENT_DIGEST_PENDING): those are not folded
    (never folded wrongly); the caller's land of the whole landed range folds them, in order."""
    n = 100 * 1000 + 1
    data = pattern(n, 4)
    base = data.ctypes.data
    d = Digest(base, base + n)
    for a in range(n - 1000, 0, -1000):  # 100 pieces, last first: every one lands ahead of the stream
        d.land(data[a:a + 1000], False)
    assert d.folded == 0 and d.next == base
    d.land(data[:1000], False)  # closes the first gap: the noted runs that follow fold, then a gap
    assert 0 < d.folded < n and (d.next - base) % 1000 == 0
    rest = n - d.folded
    assert d.land(data) == rest  # the caller folds the rest
    assert (d.next, d.folded) == (base + n, n)
    assert d.intdigest() == xxhash.xxh3_64_intdigest(data.tobytes())


def _land_all(d: Digest, data: np.ndarray, pieces: list[tuple[int, int]]) -> None:
    for a, b in pieces:
        d.land(data[a:b], False)


def test_pieces_landing_on_several_threads_fold_in_order() -> None:
    """Many threads land shuffled pieces of one stream at once (several connections' receivers): the
    digest is exactly the stream's, every byte folded once."""
    import threading

    n = 8 * (1 << 20) + 12345
    data = pattern(n, 5)
    base = data.ctypes.data
    want = xxhash.xxh3_64_intdigest(data.tobytes())
    rng = np.random.default_rng(1)
    for _ in range(3):
        pieces = _cuts(n, rng, 24)
        order = [pieces[i] for i in rng.permutation(len(pieces))]
        d = Digest(base, base + n)
        lanes = [order[k::4] for k in range(4)]
        ts = [threading.Thread(target=_land_all, args=(d, data, ps)) for ps in lanes]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        d.land(data)  # the caller's fallback (a note that did not fit): nothing left, or the rest
        assert (d.next, d.folded) == (base + n, n)
        assert d.intdigest() == want


def test_one_changed_landed_byte_changes_the_digest() -> None:
    data = pattern(3 * RUN + 5, 6)
    base = data.ctypes.data
    d = Digest(base, base + data.size)
    d.land(data[RUN:], False)
    d.land(data[:RUN], False)
    good = d.intdigest()
    bad = data.copy()
    bad[2 * RUN + 3] ^= 1
    b0 = bad.ctypes.data
    e = Digest(b0, b0 + bad.size)
    e.land(bad[RUN:], False)
    e.land(bad[:RUN], False)
    assert e.intdigest() != good and good == xxhash.xxh3_64_intdigest(data.tobytes())


# ---- copying and folding in one pass (Digest.copy; tent_digest_copy, the shm executor's READ copy) ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 9000) | st.integers(9000, 300_000), src_off=st.integers(0, 63), dst_off=st.integers(0, 63),
       seed=st.integers(0, 2**32 - 1), ways=st.lists(st.sampled_from("cccul"), min_size=1, max_size=12))
def test_copy_folds_exactly_the_stream_at_any_alignment_and_split(n: int, src_off: int, dst_off: int, seed: int,
                                                                   ways: list[str]) -> None:
    """The one-pass copy+hash (AVX2: each stripe loaded once, stored and accumulated) leaves XXH3's state
    exactly as memcpy + XXH3_64bits_update would: python xxhash's xxh3_64 of the stream, whatever the
    alignment of source and destination, the lengths, and the cut of the stream into copies, mixed
    with pieces folded another way (c: Digest.copy, u: copied then update, l: copied then land)."""
    rng = np.random.default_rng(seed)
    src_buf = pattern(n + 64, seed % 1000)
    dst_buf = np.zeros(n + 64, np.uint8)
    src, dst = src_buf[src_off:src_off + n], dst_buf[dst_off:dst_off + n]
    base = dst.ctypes.data
    d = Digest(base, base + n) if n else Digest(base)
    cuts = sorted({0, n, *(int(x) for x in rng.integers(0, n + 1, len(ways) - 1))})
    for (a, b), way in zip(zip(cuts[:-1], cuts[1:], strict=True), ways, strict=False):
        if way == "c":
            assert d.copy(dst[a:b], src[a:b])
        else:
            dst[a:b] = src[a:b]
            d.update(dst[a:b]) if way == "u" else d.land(dst[a:b])
    if len(cuts) - 1 > len(ways):  # the pieces the ways did not reach: one copy
        a = cuts[len(ways)]
        assert d.copy(dst[a:], src[a:])
    assert np.array_equal(dst, src)
    assert (d.next, d.folded) == (base + n, n)
    assert d.intdigest() == xxhash.xxh3_64_intdigest(src.tobytes())


@pytest.mark.parametrize("n", [3, 255, 256, 257, 1024, 1025, 16 * 1024 + 64, RUN + 1, (1 << 20) + 13, (8 << 20) + 3])
def test_copy_that_closes_a_gap_folds_the_runs_landed_ahead(n: int) -> None:
    """A copy that continues the stream also folds, in order, the runs that landed ahead of it (the
    out-of-order land path); a copy anywhere else is a plain copy that folds nothing."""
    src = pattern(n, n)
    dst = np.zeros(n, np.uint8)
    base = dst.ctypes.data
    d = Digest(base, base + n)
    k = n // 3
    dst[2 * k:] = src[2 * k:]
    d.land(dst[2 * k:], False)  # ahead of the stream: noted
    assert not d.copy(dst[k:2 * k], src[k:2 * k]) and d.folded == 0  # not where the stream stands
    assert np.array_equal(dst[k:2 * k], src[k:2 * k])
    d.land(dst[k:2 * k], False)  # noted as well
    assert d.copy(dst[:k], src[:k])  # the stream's next bytes: folded, then the noted runs after it
    assert (d.next, d.folded, d.late) == (base + n, n, n - k)
    assert d.intdigest() == xxhash.xxh3_64_intdigest(src.tobytes()) and np.array_equal(dst, src)
    with pytest.raises(ValueError):
        d.copy(dst[:2], src[:1])


def test_a_submit_arms_at_most_digests_per_submit() -> None:
    """The limit refhub batches by is the one the native submit enforces (one name, exported)."""
    from tent_core import DIGESTS_PER_SUBMIT, _native

    full = [Digest(i * 10, i * 10 + 10) for i in range(DIGESTS_PER_SUBMIT)]
    try:
        _native.digest_arm(full)
        with pytest.raises(ValueError, match=f"at most {DIGESTS_PER_SUBMIT} digests"):
            _native.digest_arm([*full, Digest(0)])
    finally:
        _native.digest_arm(None)
