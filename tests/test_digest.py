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
