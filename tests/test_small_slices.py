"""A small request on a route of several rails goes out as one slice on one rail (issue 17: it was
cut into 64 KiB slices that all went to the same rail anyway), over real loopback rails; an
elephant is still cut and sprayed over both."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from peers import Peer

from tent_core import READ, WRITE, Engine, Request
from tent_core.testing import pattern

KiB, MiB = 1024, 1024 * 1024
SIZE = 16 * MiB
RAILS2 = {"rails": ["127.0.0.1", "127.0.0.2"]}
# every elephant sprayed evenly (a probe): both rails get slices whatever the rate estimates say
CONFIG = {"transports": {"tcp": RAILS2}, "scheduler": {"probe_every": 1}}


@pytest.fixture(scope="module")
def peer():
    p = Peer(size=SIZE, config={"transports": {"tcp": RAILS2}}, transports=["tcp"])
    yield p
    p.close()


@pytest.fixture
def eng(peer):
    with Engine(CONFIG, transports=["tcp"]) as e:
        yield e


def _per_rail(eng: Engine) -> dict[int, tuple[int, int]]:
    """(slices done, bytes) per rail index of the tcp route."""
    return {r["index"]: (r["slices"], r["bytes"]) for r in eng.rail_stats() if r["transport"] == "tcp"}


def _delta(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    return {i: (after[i][0] - before[i][0], after[i][1] - before[i][1]) for i in after}


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


@pytest.mark.parametrize("length", [256 * KiB, 1 * MiB - 4 * KiB])
def test_a_small_request_on_two_rails_is_one_slice(eng, peer, length):
    rw = peer.seg("rw")
    want = pattern(SIZE, seed=0)  # the peer's "rw" segment
    local = eng.allocate(4 * MiB)
    eng.read(local, rw, 4 * MiB)  # connects both rails (an elephant: sprayed)
    assert len(_per_rail(eng)) == 2
    for k in range(4):
        ro = (k * 3 + 1) * 256 * KiB + 4 * KiB * k  # some not slice-aligned
        local.array[:length] = 0
        before = _per_rail(eng)
        eng.submit(Request(READ, local, 0, rw, ro, length)).wait(10)
        moved = _delta(before, _per_rail(eng))
        assert np.array_equal(local.array[:length], want[ro : ro + length])
        assert sorted(moved.values()) == [(0, 0), (1, length)], moved  # one slice, one rail, every byte
    src = pattern(length, seed=7)
    local.array[:length] = src
    before = _per_rail(eng)
    eng.submit(Request(WRITE, local, 0, rw, 3 * MiB, length)).wait(10)
    moved = _delta(before, _per_rail(eng))
    try:
        assert sorted(moved.values()) == [(0, 0), (1, length)], moved
        assert peer.digest("rw", 3 * MiB, length) == _sha(src)
    finally:
        peer.call(cmd="fill", segment="rw", seed=0)


def test_an_elephant_on_two_rails_is_still_sprayed(eng, peer):
    rw = peer.seg("rw")
    local = eng.allocate(8 * MiB)
    eng.read(local, rw, 1 * MiB)  # connects both rails
    before = _per_rail(eng)
    local.array[:] = 0
    eng.submit(Request(READ, local, 0, rw, 4 * KiB, 8 * MiB)).wait(10)
    moved = _delta(before, _per_rail(eng))
    assert np.array_equal(local.array, pattern(8 * MiB, seed=0, offset=4 * KiB))
    # 8 MiB: 64 slices of 128 KiB, a probe deals them evenly
    assert [moved[i][0] for i in sorted(moved)] == [32, 32], moved
    assert sum(b for _, b in moved.values()) == 8 * MiB
