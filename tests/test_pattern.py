"""The verification pattern (tent_core.testing.pattern): a misplaced or stale slice must fail the check."""

from __future__ import annotations

import numpy as np
import pytest

from tent_core.testing import first_mismatch, fresh_seed, pattern

MiB = 1 << 20


def _old_pattern(n: int, seed: int = 0) -> np.ndarray:
    """The pattern used before issue 14: it keeps bits 13-20 of a 32-bit product, period 2 MiB."""
    idx = np.arange(n, dtype=np.uint32)
    return ((idx * 2654435761 + seed * 97) >> 13).astype(np.uint8)


def test_a_slice_written_2_mib_off_fails_the_check():
    seed = fresh_seed()
    buf = pattern(8 * MiB, seed)
    src = 4 * MiB  # the slice that should have landed at 4 MiB was written from 2 MiB, 6 MiB, ...
    for wrong in (2 * MiB, 6 * MiB, 1 * MiB, 4 * MiB - 4096, 4 * MiB + 8, 4 * MiB + 1):
        landed = buf[wrong : wrong + MiB]
        bad = first_mismatch(landed, seed, offset=src)
        assert bad is not None and bad < 16, (wrong, bad)
    assert first_mismatch(buf[src : src + MiB], seed, offset=src) is None
    # the old pattern could not tell: a slice 2 MiB off carried exactly the expected bytes
    old = _old_pattern(8 * MiB)
    assert np.array_equal(old[2 * MiB : 3 * MiB], old[4 * MiB : 5 * MiB])


def test_a_stale_buffer_from_an_earlier_round_fails_the_check():
    earlier, now = fresh_seed(), fresh_seed()
    assert earlier != now
    stale = pattern(4 * MiB, earlier)
    assert first_mismatch(stale, now) == 0
    assert first_mismatch(pattern(4 * MiB, now), now) is None
    # and a slice of the earlier round at any offset of this round's range
    assert first_mismatch(pattern(MiB, earlier, offset=3 * MiB), now, offset=3 * MiB) is not None


def test_never_repeats_and_offsets_compose():
    seed = 12345
    words = pattern(16 * MiB, seed).view(np.uint64)
    assert len(np.unique(words)) == len(words)  # no two aligned 8-byte words of a stream are equal
    full = pattern(3 * MiB + 77, seed)
    for off, n in ((0, 10), (1, 4096), (7, 1000), (8, MiB), (2 * MiB + 3, MiB + 74), (3 * MiB + 77, 0)):
        assert np.array_equal(pattern(n, seed, offset=off), full[off : off + n]), (off, n)
    assert not np.array_equal(pattern(4096, 1), pattern(4096, 2))
    assert pattern(4096, 1)[:16].tolist() == pattern(16, 1).tolist()  # deterministic per seed
    with pytest.raises(ValueError):
        pattern(-1, 0)



def test_the_simulated_device_kernel_writes_the_same_pattern():
    """tent_core/_native/simdev.c's fill kernel implements the pattern in C: byte for byte the same."""
    from tent_core.simdev import SimArray, SimStream

    n = 1 * MiB + 13
    for seed in (0, 5, fresh_seed()):
        arr = SimArray(n)
        s = SimStream()
        s.fill(arr, seed)
        s.synchronize()
        assert first_mismatch(arr.download(), seed) is None, seed
