"""TENT's Mooncake facade in one process: return codes, registration, the managed pool, P2P transfers."""

from __future__ import annotations

import ctypes
import json
import logging
import time
from collections.abc import Iterator

import pytest

from tent_core.compat import mooncake as mc
from tent_core.compat.mooncake import TransferEngine, TransferNotify, TransferOpcode


@pytest.fixture
def pair() -> Iterator[tuple[TransferEngine, TransferEngine, str]]:
    target, initiator = TransferEngine(), TransferEngine()
    assert target.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert initiator.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    name = f"127.0.0.1:{target.get_rpc_port()}"
    assert target.server_name == name
    yield target, initiator, name
    initiator.close()
    target.close()


def test_uninitialized_calls_fail_with_codes() -> None:
    te = TransferEngine()
    assert te.get_rpc_port() == -1
    assert te.register_memory(4096, 4096) == mc.ERR_INVALID_ARGUMENT
    assert te.allocate_managed_buffer(4096) == 0
    assert te.transfer_sync_write("127.0.0.1:1", 4096, 4096, 16) == -1
    assert te.batch_transfer_async_read("127.0.0.1:1", [4096], [4096], [16]) == 0
    assert te.send_probe("127.0.0.1:1") == -1
    assert te.get_first_buffer_address("127.0.0.1:1") == 0


def test_initialize_rejects_what_it_cannot_serve() -> None:
    for server in ("redis://127.0.0.1:6379", "http://127.0.0.1:8080/metadata"):
        assert TransferEngine().initialize("127.0.0.1", server, "tcp", "") == -1
    assert TransferEngine().initialize("no-such-host.invalid", "P2PHANDSHAKE", "tcp", "") == -1
    te = TransferEngine()
    assert te.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "") == 0
    try:
        assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1, "a second initialize is refused"
    finally:
        te.close()


def test_protocol_is_a_hint_and_missing_fabrics_are_loud(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.WARNING, logger="tent_core.compat.mooncake")
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    try:
        assert len(te.engine.transports) > 1 or "tcp" in te.engine.transports
        if "rdma" not in te.engine.transports:
            assert any("rdma" in r.getMessage() and "unavailable" in r.getMessage() for r in caplog.records)
    finally:
        te.close()
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        assert sorted(te.engine.transports) == ["tcp"]
    finally:
        te.close()


def test_registration_codes(pair: tuple[TransferEngine, TransferEngine, str]) -> None:
    te = pair[1]
    mem = ctypes.create_string_buffer(1 << 16)
    addr = ctypes.addressof(mem)
    assert te.register_memory(addr, 1 << 16) == 0
    assert te.register_memory(addr, 1 << 16) == mc.ERR_ADDRESS_OVERLAPPED
    assert te.register_memory(addr + 100, 100) == mc.ERR_ADDRESS_OVERLAPPED
    assert te.register_memory(addr - 4096, 4097) == mc.ERR_ADDRESS_OVERLAPPED
    assert te.unregister_memory(addr + 1) == mc.ERR_ADDRESS_NOT_REGISTERED
    assert te.unregister_memory(addr) == 0
    assert te.unregister_memory(addr) == mc.ERR_ADDRESS_NOT_REGISTERED
    assert te.register_memory(addr, 0) == mc.ERR_INVALID_ARGUMENT
    assert te.register_memory(addr, 4096, "npu:0") == mc.ERR_INVALID_ARGUMENT
    assert te.register_memory(addr, 4096, "cpu:0") == 0
    assert te.unregister_memory(addr) == 0
    # batch registration is all or nothing
    other = ctypes.create_string_buffer(4096)
    oaddr = ctypes.addressof(other)
    assert te.register_memory(oaddr, 4096) == 0
    assert te.batch_register_memory([addr, oaddr], [4096, 4096]) == mc.ERR_ADDRESS_OVERLAPPED
    assert te.register_memory(addr, 4096) == 0, "the failed batch left nothing registered"
    assert te.batch_unregister_memory([addr, oaddr, 12345]) == mc.ERR_ADDRESS_NOT_REGISTERED
    assert te.batch_register_memory([addr, oaddr], [4096, 4096]) == 0
    assert te.batch_unregister_memory([addr, oaddr]) == 0
    assert te.batch_register_memory([addr], [1, 2]) == mc.ERR_INVALID_ARGUMENT


def test_local_byte_helpers_stay_inside_registered_memory(pair: tuple[TransferEngine, TransferEngine, str]) -> None:
    te = pair[1]
    buf = te.allocate_managed_buffer(4096)
    assert te.write_bytes_to_buffer(buf, b"hello", 5) == 0
    assert te.read_bytes_from_buffer(buf, 5) == b"hello"
    assert te.write_bytes_to_buffer(buf, "str ok", 6) == 0
    assert te.write_bytes_to_buffer(buf, b"abc", 5) == mc.ERR_INVALID_ARGUMENT
    assert te.write_bytes_to_buffer(8, b"x", 1) == mc.ERR_ADDRESS_NOT_REGISTERED
    with pytest.raises(ValueError):
        te.read_bytes_from_buffer(8, 1)


def test_managed_pool_splits_reuses_and_checks_frees(pair: tuple[TransferEngine, TransferEngine, str]) -> None:
    te = pair[1]
    small = [te.allocate_managed_buffer(n) for n in (1, 8 << 10, 9 << 10, 100 << 10, 4 << 20)]
    assert all(small)
    spans = sorted((a, a + max(mc.SLAB_MIN << mc._slab_class(n), 1)) for a, n in zip(small, (1, 8 << 10, 9 << 10, 100 << 10, 4 << 20), strict=True))
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)), "managed buffers overlap"
    assert len(te._arenas) == 1, "small buffers share one registered arena"
    big = te.allocate_managed_buffer(5 << 20)
    assert big and big not in te._arenas
    assert te.free_managed_buffer(small[2], 1 << 20) == mc.ERR_INVALID_ARGUMENT, "wrong length"
    assert te.free_managed_buffer(12345, 4096) == mc.ERR_INVALID_ARGUMENT
    assert te.free_managed_buffer(small[2], 9 << 10) == 0
    assert te.allocate_managed_buffer(10 << 10) == small[2], "a freed block is reused"
    assert te.free_managed_buffer(big, 5 << 20) == 0
    assert te.unregister_memory(min(te._arenas)) == mc.ERR_INVALID_ARGUMENT


def test_p2p_transfers_by_raw_address(pair: tuple[TransferEngine, TransferEngine, str]) -> None:
    target, te, name = pair
    import os

    assert target.get_first_buffer_address(name) == 0
    assert te.get_first_buffer_address(name) == 0
    remote = target.allocate_managed_buffer(8 << 20)
    assert target.get_first_buffer_address(name) == remote
    assert te.get_first_buffer_address(name) == remote
    local = te.allocate_managed_buffer(8 << 20)
    data = os.urandom(8 << 20)
    assert te.write_bytes_to_buffer(local, data, len(data)) == 0
    assert te.transfer_sync_write(name, local, remote, len(data)) == 0
    assert target.read_bytes_from_buffer(remote, len(data)) == data
    # memory the target registers later is found on first use (the peer's buffer list is re-read once)
    late = ctypes.create_string_buffer(1 << 16)
    laddr = ctypes.addressof(late)
    assert target.register_memory(laddr, 1 << 16) == 0
    assert te.transfer_sync(name, local + 5, laddr + 7, 1000, TransferOpcode.Write) == 0
    assert late.raw[7:1007] == data[5:1005]
    # async: submit, poll, collect
    bid = te.transfer_submit_write(name, local, laddr, 4096)
    assert bid != 0
    end = time.monotonic() + 10
    st = 0
    while st == 0 and time.monotonic() < end:
        st = te.transfer_check_status(bid)
    assert st == 1
    assert te.transfer_check_status(bid) == -1, "a collected id is released"
    assert te.get_batch_transfer_status([987654]) == -1
    b1 = te.batch_transfer_async_read(name, [local, local + 4096], [remote, remote + 4096], [4096, 4096])
    b2 = te.batch_transfer_async(name, [local + 8192], [laddr], [100], TransferOpcode.Read)
    assert b1 and b2 and b1 != b2
    assert te.get_batch_transfer_status([b1, b2]) == 0
    # failures are codes, never exceptions
    assert te.transfer_sync_read(name, local, remote + (8 << 20) - 8, 64) == -1, "runs past the remote buffer"
    assert te.transfer_sync_read(name, 16, remote, 64) == -1, "unregistered local memory"
    assert te.batch_transfer_sync_read(name, [local], [remote, remote], [8]) == -1, "mismatched list lengths"
    assert te.transfer_sync(name, local, remote, 8, 7) == mc.ERR_INVALID_ARGUMENT
    assert te.transfer_sync(name, local, remote, 8, TransferOpcode.Read, TransferNotify("a", "b")) == mc.ERR_NOT_IMPLEMENTED
    assert te.batch_transfer_sync(name, [local], [remote], [8], TransferOpcode.Read, TransferNotify("a", "b")) == mc.ERR_NOT_IMPLEMENTED
    assert te.get_notifies() == []


def test_target_refuses_unregistered_memory_over_tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over TCP the target enforces registration (same-host CMA is one-sided and cannot)."""
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    target, te = TransferEngine(), TransferEngine()
    assert target.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        name = target.server_name
        mem = ctypes.create_string_buffer(1 << 16)
        addr = ctypes.addressof(mem)
        assert target.register_memory(addr, 1 << 16) == 0
        local = te.allocate_managed_buffer(1 << 16)
        assert te.write_bytes_to_buffer(local, b"x" * 64, 64) == 0
        assert te.transfer_sync_write(name, local, addr, 64) == 0
        assert mem.raw[:64] == b"x" * 64
        assert target.unregister_memory(addr) == 0
        assert te.transfer_sync_write(name, local, addr, 64) == -1, "the initiator's cache is stale; the target refuses"
        assert te.transfer_sync_write(name, local, addr, 64) == -1, "and the refreshed view says so at once"
    finally:
        te.close()
        target.close()


def test_unknown_and_dead_peers_fail_fast(pair: tuple[TransferEngine, TransferEngine, str]) -> None:
    _, te, name = pair
    assert te.send_probe(name) == 0
    t0 = time.monotonic()
    assert te.send_probe("unreachable_peer:9") == mc.ERR_DNS
    assert te.transfer_submit_write("unreachable_peer:9", 0, 0, 16) == 0
    assert te.transfer_sync_write("unreachable_peer:9", 0, 0, 16) == -1
    assert te.get_first_buffer_address("unreachable_peer:9") == 0
    assert time.monotonic() - t0 < 3, "unresolvable names fail at once"
    slow = TransferEngine({"control_timeout_s": 0.5})
    assert slow.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    try:
        t0 = time.monotonic()
        assert slow.send_probe("127.0.0.1:1") == mc.ERR_SOCKET
        assert time.monotonic() - t0 < 3
    finally:
        slow.close()


def test_topology_and_misc(pair: tuple[TransferEngine, TransferEngine, str]) -> None:
    te = pair[1]
    topo = json.loads(te.get_local_topology())
    assert isinstance(topo, dict)
    assert te.warmup_efa_segment(pair[2]) == 0
    assert te.get_engine() is te.engine
    assert te.get_engine_ptr() == 0
    assert TransferEngine.TransferOpcode.Read == 0 and TransferEngine.TransferOpcode.Write == 1
