"""Per-buffer reachability through real engines: shm in memfd mode cannot map plain process memory
(registered with engine.register()); the engine routes such buffers over another transport or fails
the request at submit with the reason, never by retrying until the deadline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from shm_target import pattern

from tent_core import READ, WRITE
from tent_core.engine import Engine
from tent_core.errors import NoPathError

# far beyond anything a loaded machine needs: a request that waited for it would show as a timeout
DEADLINE_S = 60.0


def engines(monkeypatch: pytest.MonkeyPatch, plugins: str, mode: str) -> tuple[Engine, Engine]:
    monkeypatch.setenv("TENT_PLUGINS", plugins)
    cfg: dict[str, Any] = {"transports": {"shm": {"mode": mode}}}
    a, b = Engine(cfg), Engine(cfg)
    for e in (a, b):
        missing = set(plugins.split(",")) - set(e.transports)
        if missing:
            a.close()
            b.close()
            pytest.skip(f"engine did not start {', '.join(sorted(missing))}")
    return a, b


@pytest.fixture
def closing() -> Iterator[list[Engine]]:
    made: list[Engine] = []
    yield made
    for e in reversed(made):
        e.close()


def target(a: Engine, n: int) -> tuple[np.ndarray, Any, Any]:
    """`a`'s segment "default": an engine-allocated buffer, then a plain numpy array registered."""
    alloc = a.allocate(n)
    alloc.array[:] = pattern(n, 11)
    plain = np.empty(n, np.uint8)
    plain[:] = pattern(n, 12)
    return plain, alloc, a.register(plain)


def test_shm_only_memfd_mode_fails_at_submit_with_the_reason(monkeypatch: pytest.MonkeyPatch, closing: list[Engine]) -> None:
    a, b = engines(monkeypatch, "shm", "memfd")
    closing += [a, b]
    n = 1 << 20
    plain, alloc, reg = target(a, n)
    dst = b.allocate(n)
    seg = f"{a.engine_id}/default"
    # the engine-allocated buffer of the same segment still goes over shm
    b.transfer(READ, dst, 0, seg, alloc.offset, n, timeout=DEADLINE_S)
    assert np.array_equal(dst.array, alloc.array)
    t0 = time.monotonic()
    for op in (READ, WRITE):
        with pytest.raises(NoPathError) as err:
            b.transfer(op, dst, 0, seg, reg.offset, n, timeout=DEADLINE_S)
        msg = str(err.value)
        assert "memfd mode" in msg and "engine.allocate()" in msg and "tcp" in msg, msg
        assert f"{reg.addr:#x}" in msg, msg  # names the buffer
    # refused at submit: nowhere near the deadline, however loaded the machine
    assert time.monotonic() - t0 < DEADLINE_S / 2
    assert np.array_equal(plain, pattern(n, 12))  # the WRITE touched nothing
    # a request spanning both buffers is refused as a whole, before anything moves
    with pytest.raises(NoPathError):
        b.transfer(WRITE, b.allocate(2 * n), 0, seg, alloc.offset, 2 * n, timeout=DEADLINE_S)
    assert np.array_equal(alloc.array, pattern(n, 11))


def test_tcp_substitutes_for_plain_memory(monkeypatch: pytest.MonkeyPatch, closing: list[Engine]) -> None:
    a, b = engines(monkeypatch, "shm,tcp", "memfd")
    closing += [a, b]
    n = 3 << 20
    plain, alloc, reg = target(a, n)
    dst = b.allocate(n)
    seg = f"{a.engine_id}/default"
    b.transfer(READ, dst, 0, seg, reg.offset, n, timeout=DEADLINE_S)
    assert np.array_equal(dst.array, pattern(n, 12))
    dst.array[:] = pattern(n, 13)
    b.transfer(WRITE, dst, 0, seg, reg.offset, n, timeout=DEADLINE_S)
    assert np.array_equal(plain, pattern(n, 13))
    b.transfer(READ, dst, 0, seg, alloc.offset, n, timeout=DEADLINE_S)
    assert np.array_equal(dst.array, pattern(n, 11))
    peer = b.peers.lookup(a.engine_id)
    assert peer is not None
    bufs = {rb.addr: rb for rb in peer.segments["default"]}
    assert "shm" in bufs[reg.addr].unreachable and "shm" not in bufs[alloc.addr].hidden
    # the plain buffer went over tcp, the allocated one over shm (no transport was given up on)
    assert set(peer.routes) == {"shm", "tcp"} and not peer.dead_transports


def test_cma_mode_reaches_plain_memory(monkeypatch: pytest.MonkeyPatch, closing: list[Engine]) -> None:
    a, b = engines(monkeypatch, "shm", "auto")
    closing += [a, b]
    n = 1 << 20
    plain, _, reg = target(a, n)
    dst = b.allocate(n)
    b.transfer(READ, dst, 0, f"{a.engine_id}/default", reg.offset, n, timeout=DEADLINE_S)
    assert np.array_equal(dst.array, plain)
    tr = b.transports["shm"]
    assert [tr.link_mode(h) for h in list(tr._by_handle)] == ["cma"]


def test_auto_mode_that_falls_back_to_memfd_learns_at_connect(monkeypatch: pytest.MonkeyPatch, closing: list[Engine]) -> None:
    """`b` allows CMA but `a` does not: b cannot tell before connecting; once connected (memfd),
    the plain buffer is known out of reach and the request fails at submit, not at its deadline."""
    monkeypatch.setenv("TENT_PLUGINS", "shm")
    a = Engine({"transports": {"shm": {"mode": "memfd"}}})
    closing.append(a)
    b = Engine({"transports": {"shm": {"mode": "auto"}}})
    closing.append(b)
    if "shm" not in a.transports or "shm" not in b.transports:
        pytest.skip("engine did not start the shm transport")
    n = 1 << 20
    _, alloc, reg = target(a, n)
    dst = b.allocate(n)
    seg = f"{a.engine_id}/default"
    with pytest.raises(NoPathError) as err:
        b.transfer(READ, dst, 0, seg, reg.offset, n, timeout=DEADLINE_S)
    assert "CMA to this peer is not possible" in str(err.value) and "does not allow CMA" in str(err.value), str(err.value)
    b.transfer(READ, dst, 0, seg, alloc.offset, n, timeout=DEADLINE_S)
    assert np.array_equal(dst.array, alloc.array)
