"""TcpTransport (the Python side): descriptors, export/release, rail pairing, plugin registration."""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Any

import numpy as np
import pytest
from tcp_helpers import READ, WRITE, pattern, run
from tent_tcp import __version__
from tent_tcp.transport import TcpTransport, pair_rails

from tent_core.abi import Status
from tent_core.executor import EXECUTOR_ABI_VERSION
from tent_core.transport import Transport, TransportContext
from tent_core.types import BufferInfo, MemoryKind, PeerInfo, Permission


def make(name: str, config: dict[str, Any] | None = None) -> TcpTransport:
    t = TcpTransport()
    assert t.probe().available
    t.start(TransportContext(engine_id=name, host_id="host", config=config or {}, bind_host="127.0.0.1"))
    return t


def peer_info(name: str, t: TcpTransport) -> PeerInfo:
    return PeerInfo(engine_id=name, host_id="host", pid=os.getpid(), transports={"tcp": t.local_descriptor()})


def buffer(a: np.ndarray, perm: Permission = Permission.READ_WRITE) -> BufferInfo:
    return BufferInfo(segment="s", offset=0, addr=a.ctypes.data, length=a.nbytes, kind=MemoryKind.HOST, perm=perm)


@pytest.fixture
def pair() -> Iterator[tuple[TcpTransport, TcpTransport]]:
    a = make("a:1", {"slice_timeout_ms": 1000, "threads": 2})
    b = make("b:2", {"rails": ["127.0.0.1", "127.0.0.2"], "nominal_gbps": [25, 10]})
    yield a, b
    a.close()
    b.close()


def test_profile_and_descriptor(pair: tuple[TcpTransport, TcpTransport]) -> None:
    a, b = pair
    assert isinstance(a, Transport) and a.name == "tcp"
    cap = a.capabilities()
    assert cap.rank == 50 and cap.same_host and cap.cross_host
    assert cap.serves(MemoryKind.HOST, MemoryKind.HOST, True)
    assert not cap.serves(MemoryKind.CUDA, MemoryKind.HOST, True)
    d = b.local_descriptor()
    assert [r["ip"] for r in d["rails"]] == ["127.0.0.1", "127.0.0.2"]
    assert [r["gbps"] for r in d["rails"]] == [25.0, 10.0]
    assert all(r["port"] > 0 for r in d["rails"])
    assert a.executor.handle and a.executor.ops


def test_a_registration_is_a_handle(pair: tuple[TcpTransport, TcpTransport]) -> None:
    """The same bytes registered READ_WRITE and READ_ONLY; releasing the READ_WRITE registration
    removes exactly it: the region stays readable and is no longer remotely writable."""
    a, b = pair
    target = pattern(21, 1 << 16)
    rw, ro = buffer(target), buffer(target, Permission.READ)
    b.export_buffer(rw)
    b.export_buffer(ro)
    link = a.connect(peer_info("b:2", b), [])
    src = pattern(22, 16)
    assert run(a.executor, [(WRITE, src.ctypes.data, target.ctypes.data, 16, link.handle, 0)]).error == 0
    b.release_buffer(rw)
    assert run(a.executor, [(WRITE, src.ctypes.data, target.ctypes.data + 64, 16, link.handle, 0)]).error == Status.E_PERMISSION
    back = np.zeros(16, np.uint8)
    assert run(a.executor, [(READ, back.ctypes.data, target.ctypes.data + 64, 16, link.handle, 0)]).error == 0
    assert np.array_equal(back, target[64:80])
    b.release_buffer(ro)
    assert run(a.executor, [(READ, back.ctypes.data, target.ctypes.data, 16, link.handle, 0)]).error == Status.E_BOUNDS


def test_transfer_through_transport(pair: tuple[TcpTransport, TcpTransport]) -> None:
    a, b = pair
    target = np.zeros(1 << 20, np.uint8)
    ro = pattern(11, 4096)
    target_reg = buffer(target)  # a registration: releasing it names this very object
    b.export_buffer(target_reg)
    ro_reg = buffer(ro, Permission.READ)
    b.export_buffer(ro_reg)
    link = a.connect(peer_info("b:2", b), [])
    # a has one rail 127.0.0.1, b has two on 127.0.0.0/24: both of b's rails are used
    assert [r.index for r in link.rails] == [0, 1]
    assert [r.name.split(":")[0] for r in link.rails] == ["127.0.0.1->127.0.0.1", "127.0.0.1->127.0.0.2"]
    assert a.connect(peer_info("b:2", b), []).handle == link.handle  # reused

    src = pattern(12, 1 << 20)
    half = 1 << 19
    res = run(
        a.executor,
        [
            (WRITE, src.ctypes.data, target.ctypes.data, half, link.handle, 0),
            (WRITE, src.ctypes.data + half, target.ctypes.data + half, half, link.handle, 1),
        ],
    )
    assert res.done and res.error == 0
    assert np.array_equal(target, src)
    back = np.zeros(4096, np.uint8)
    assert run(a.executor, [(READ, back.ctypes.data, ro.ctypes.data, 4096, link.handle, 1)]).error == 0
    assert np.array_equal(back, ro)
    assert run(a.executor, [(WRITE, src.ctypes.data, ro.ctypes.data, 16, link.handle, 0)]).error == Status.E_PERMISSION
    assert a.native.rail_counters(link.handle, 1)["slices"] == 2

    b.release_buffer(buffer(target))  # another registration object (never exported): releases nothing
    assert run(a.executor, [(WRITE, src.ctypes.data, target.ctypes.data, 16, link.handle, 0)]).error == 0
    b.release_buffer(target_reg)
    assert run(a.executor, [(WRITE, src.ctypes.data, target.ctypes.data, 16, link.handle, 0)]).error == Status.E_BOUNDS
    b.release_buffer(target_reg)  # releasing twice is harmless

    a.disconnect(link)
    res = run(a.executor, [(READ, back.ctypes.data, ro.ctypes.data, 16, link.handle, 0)])
    assert res.retryable == [Status.E_REROUTED]  # a forgotten peer: handed back untouched
    link2 = a.connect(peer_info("b:2", b), [])
    assert link2.handle != link.handle
    assert run(a.executor, [(READ, back.ctypes.data, ro.ctypes.data, 16, link2.handle, 0)]).error == 0
    # released before `ro` is freed: it returns once no server thread uses it (a READ's answer
    # is in the initiator's hands before the server's sendmsg returns, and AddressSanitizer reads
    # the sent bytes after that call)
    b.release_buffer(ro_reg)


def test_close_is_idempotent() -> None:
    t = make("c:3")
    t.close()
    t.close()
    with pytest.raises(RuntimeError):
        _ = t.executor


def test_can_reach() -> None:
    t = TcpTransport()
    assert t.can_reach(PeerInfo("x", "h", 1, {})) is not None
    assert t.can_reach(PeerInfo("x", "h", 1, {"tcp": {"rails": []}})) is not None
    assert t.can_reach(PeerInfo("x", "h", 1, {"tcp": {"rails": [{"ip": "1.2.3.4", "port": 5}]}})) is None


@pytest.mark.parametrize(
    "local,remote,expected",
    [
        (["127.0.0.1"], ["127.0.0.1"], [(0, 0)]),
        (["198.18.0.1", "198.18.1.1"], ["198.18.1.2", "198.18.0.2"], [(0, 1), (1, 0)]),
        (["198.18.0.1", "198.18.1.1"], ["198.18.0.2", "198.18.1.2"], [(0, 0), (1, 1)]),
        (["198.18.0.1", "198.18.1.1"], ["198.18.0.2"], [(0, 0)]),
        (["10.0.0.1", "10.1.0.1"], ["192.168.0.2"], [(0, 0), (1, 0)]),  # nothing shared: by index
        (["10.0.0.1"], ["192.168.0.2", "192.168.1.2"], [(0, 0)]),
        (["127.0.0.1", "127.0.0.2"], ["127.0.0.1", "127.0.0.2"], [(0, 0), (1, 1)]),
    ],
)
def test_pair_rails(local: list[str], remote: list[str], expected: list[tuple[int, int]]) -> None:
    assert pair_rails(local, remote) == expected


def test_entry_point_registers_transport() -> None:
    eps = [ep for ep in entry_points(group="tent_core.transports") if ep.name == "tcp"]
    assert len(eps) == 1 and eps[0].value == "tent_tcp.plugin"
    module = eps[0].load()

    calls: list[tuple[Any, ...]] = []

    class Registry:
        def add(self, name: str, factory: Any, *, abi_version: int, version: str) -> None:
            calls.append((name, factory, abi_version, version))

    module.tent_register_transports(Registry())
    assert calls == [("tcp", TcpTransport, EXECUTOR_ABI_VERSION, __version__)]
