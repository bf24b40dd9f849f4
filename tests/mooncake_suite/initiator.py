"""Initiator side of the Mooncake-style two-process suite (unittest, run as its own process).

Same environment as target.py plus INITIATOR_SERVER_NAME (default 127.0.0.1:12347) and CIRCLE (round
trips of the random write/read test; batch tests run max(2, CIRCLE // 100) rounds of 100 buffers).
Every byte check uses fresh random bytes, so stale data can never pass.
"""

from __future__ import annotations

import os
import random
import time
import unittest

from mooncake.engine import TransferEngine, TransferOpcode

TENT = TransferEngine.__module__.startswith("tent_core")
UNKNOWN_PEER = "unreachable_peer:9"


class MooncakeStyleSuite(unittest.TestCase):
    BUFFER_BYTES = 64 * 1024 * 1024

    @classmethod
    def setUpClass(cls) -> None:
        cls.target = os.getenv("TARGET_SERVER_NAME", "127.0.0.1:12345")
        cls.me = os.getenv("INITIATOR_SERVER_NAME", "127.0.0.1:12347")
        cls.metadata = os.getenv("MC_METADATA_SERVER", "127.0.0.1:2379")
        cls.protocol = os.getenv("PROTOCOL", "tcp")
        cls.circle = int(os.getenv("CIRCLE", "1000"))
        cls.rng = random.Random(int(os.getenv("SEED", str(time.time_ns()))))
        cls.engine = TransferEngine()
        rc = cls.engine.initialize(cls.me, cls.metadata, cls.protocol, "")
        if rc != 0:
            raise RuntimeError(f"initialize returned {rc}")
        if cls.metadata == "P2PHANDSHAKE":
            cls.me = f"{cls.me.rpartition(':')[0] or cls.me}:{cls.engine.get_rpc_port()}"
        cls.managed = 0

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.managed:
            assert cls.engine.free_managed_buffer(cls.managed, cls.BUFFER_BYTES) == 0

    @classmethod
    def local_buffer(cls) -> int:
        addr = cls.engine.get_first_buffer_address(cls.me)
        if addr == 0:
            cls.managed = cls.engine.allocate_managed_buffer(cls.BUFFER_BYTES)
            if cls.managed == 0:
                raise RuntimeError("allocate_managed_buffer failed")
            addr = cls.managed
        return addr

    def remote_buffer(self) -> int:
        addr = self.engine.get_first_buffer_address(self.target)
        self.assertNotEqual(addr, 0, f"{self.target} has no registered buffer")
        return addr

    def data(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    # ---------------------------------------------------------------- Mooncake's own cases
    def test_random_write_read_round_trips(self) -> None:
        src, dst = self.local_buffer(), self.remote_buffer()
        e = self.engine
        for i in range(self.circle):
            payload = self.data(self.rng.randint(16, 256))
            n = len(payload)
            self.assertEqual(e.write_bytes_to_buffer(src, payload, n), 0, f"[{i}] write_bytes_to_buffer")
            self.assertEqual(e.transfer_sync_write(self.target, src, dst, n), 0, f"[{i}] transfer_sync_write")
            self.assertEqual(e.write_bytes_to_buffer(src, bytes(n), n), 0, f"[{i}] clear")
            self.assertEqual(e.transfer_sync_read(self.target, src, dst, n), 0, f"[{i}] transfer_sync_read")
            self.assertEqual(e.read_bytes_from_buffer(src, n), payload, f"[{i}] data mismatch")
        print(f"{self.circle} random write/read round trips verified")

    def _batch_round(self, asynchronous: bool) -> None:
        e = self.engine
        base_src, base_dst = self.local_buffer(), self.remote_buffer()
        slot, count = 1024, 100
        srcs = [base_src + i * slot for i in range(count)]
        dsts = [base_dst + i * slot for i in range(count)]
        rounds = max(2, self.circle // 100)
        for r in range(rounds):
            payloads = [self.data(self.rng.randint(32, 128)) for _ in range(count)]
            lengths = [len(p) for p in payloads]
            for s, p in zip(srcs, payloads, strict=True):
                self.assertEqual(e.write_bytes_to_buffer(s, p, len(p)), 0)
            if asynchronous:
                bid = e.batch_transfer_async_write(self.target, srcs, dsts, lengths)
                self.assertNotEqual(bid, 0, f"[{r}] batch_transfer_async_write submit")
                self.assertEqual(e.get_batch_transfer_status([bid]), 0, f"[{r}] async write batch")
            else:
                self.assertEqual(e.batch_transfer_sync_write(self.target, srcs, dsts, lengths), 0, f"[{r}] batch write")
            for s, n in zip(srcs, lengths, strict=True):
                self.assertEqual(e.write_bytes_to_buffer(s, bytes(n), n), 0)
            if asynchronous:
                bid = e.batch_transfer_async_read(self.target, srcs, dsts, lengths)
                self.assertNotEqual(bid, 0, f"[{r}] batch_transfer_async_read submit")
                self.assertEqual(e.get_batch_transfer_status([bid]), 0, f"[{r}] async read batch")
            else:
                self.assertEqual(e.batch_transfer_sync_read(self.target, srcs, dsts, lengths), 0, f"[{r}] batch read")
            for j, (s, p) in enumerate(zip(srcs, payloads, strict=True)):
                self.assertEqual(e.read_bytes_from_buffer(s, len(p)), p, f"[{r}-{j}] data mismatch")
        print(f"{rounds} rounds of {'async' if asynchronous else 'sync'} batches of {count} verified")

    def test_batch_write_read(self) -> None:
        self._batch_round(asynchronous=False)

    def test_async_batch_write_read(self) -> None:
        self._batch_round(asynchronous=True)

    def test_async_submit_to_unknown_peer_returns_zero(self) -> None:
        self.assertEqual(self.engine.batch_transfer_async_write(UNKNOWN_PEER, [0], [0], [16]), 0)
        self.assertEqual(self.engine.transfer_submit_write(UNKNOWN_PEER, 0, 0, 16), 0)

    def test_send_probe_reachable_peer(self) -> None:
        self.assertEqual(self.engine.send_probe(self.target), 0)

    def test_send_probe_unknown_peer(self) -> None:
        self.assertNotEqual(self.engine.send_probe(UNKNOWN_PEER), 0)

    # ---------------------------------------------------------------- more of the API
    def test_submit_write_and_check_status(self) -> None:
        e = self.engine
        src, dst = self.local_buffer(), self.remote_buffer()
        payload = self.data(1 << 20)
        self.assertEqual(e.write_bytes_to_buffer(src, payload, len(payload)), 0)
        bid = e.transfer_submit_write(self.target, src, dst, len(payload))
        self.assertNotEqual(bid, 0)
        deadline = time.monotonic() + 30
        status = 0
        while status == 0 and time.monotonic() < deadline:
            status = e.transfer_check_status(bid)
        self.assertEqual(status, 1, "transfer_check_status")
        self.assertEqual(e.write_bytes_to_buffer(src, bytes(len(payload)), len(payload)), 0)
        rc = e.transfer_sync(self.target, src, dst, len(payload), TransferOpcode.Read)
        self.assertEqual(rc, 0)
        self.assertEqual(e.read_bytes_from_buffer(src, len(payload)), payload)

    def test_opcode_batches_and_large_transfers(self) -> None:
        e = self.engine
        src, dst = self.local_buffer(), self.remote_buffer()
        sizes = [8 << 20, 3 << 20, 1]
        offs, o = [], 0
        for n in sizes:
            offs.append(o)
            o += n + 4096
        payloads = [self.data(n) for n in sizes]
        for off, p in zip(offs, payloads, strict=True):
            self.assertEqual(e.write_bytes_to_buffer(src + off, p, len(p)), 0)
        srcs = [src + off for off in offs]
        dsts = [dst + off for off in offs]
        self.assertEqual(e.batch_transfer_sync(self.target, srcs, dsts, sizes, TransferOpcode.Write), 0)
        for off, n in zip(offs, sizes, strict=True):
            self.assertEqual(e.write_bytes_to_buffer(src + off, bytes(n), n), 0)
        bid = e.batch_transfer_async(self.target, srcs, dsts, sizes, TransferOpcode.Read)
        self.assertNotEqual(bid, 0)
        self.assertEqual(e.get_batch_transfer_status([bid]), 0)
        for off, p in zip(offs, payloads, strict=True):
            self.assertEqual(e.read_bytes_from_buffer(src + off, len(p)), p)

    def test_registered_user_memory_round_trip(self) -> None:
        import ctypes

        e = self.engine
        n = 1 << 16
        mem = ctypes.create_string_buffer(n)
        addr = ctypes.addressof(mem)
        self.assertEqual(e.register_memory(addr, n), 0)
        try:
            self.assertNotEqual(e.register_memory(addr, n), 0, "registering the same memory twice must fail")
            dst = self.remote_buffer()
            payload = self.data(n)
            ctypes.memmove(addr, payload, n)
            self.assertEqual(e.transfer_sync_write(self.target, addr, dst, n), 0)
            ctypes.memset(addr, 0, n)
            self.assertEqual(e.transfer_sync_read(self.target, addr, dst, n), 0)
            self.assertEqual(mem.raw, payload)
        finally:
            self.assertEqual(e.unregister_memory(addr), 0)
        self.assertNotEqual(e.unregister_memory(addr), 0, "unregistering twice must fail")

    def test_remote_range_outside_registered_memory_fails(self) -> None:
        e = self.engine
        src = self.local_buffer()
        self.assertEqual(e.transfer_sync_write(self.target, src, 4096, 64), -1)
        self.assertEqual(e.transfer_sync_read(self.target, src, 4096, 64), -1)

    @unittest.skipUnless(TENT, "TENT facade behaviour")
    def test_notifications_are_refused_not_dropped(self) -> None:
        from mooncake.engine import TransferNotify

        src, dst = self.local_buffer(), self.remote_buffer()
        rc = self.engine.transfer_sync(self.target, src, dst, 16, TransferOpcode.Write, TransferNotify("n", "m"))
        self.assertEqual(rc, -303)


if __name__ == "__main__":
    unittest.main(verbosity=2)
