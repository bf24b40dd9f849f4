"""The checks of the conformance kit and the harness that runs them.

The kit drives a transport the way the engine does, minus the engine: it starts the transport
(its config through :meth:`Transport.resolve_config`), exports a local buffer, connects to a
target process (:mod:`tent_core.conformance.target`) with the peer descriptor and the buffer list
in the engine's format, and submits slices straight to the compiled executor through the C ABI.
Every slice gets its own completion counter, so the kit sees whether each one was reported
exactly once, with which status, and whether anything is reported after ``close()`` returned.
Every wait has a deadline: a transport that hangs fails a check, it does not hang the kit.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import _native
from ..abi import FAILURE_DTYPE, SLICE_DTYPE, WAIT_DTYPE, Status
from ..executor import _Ops
from ..memory import MemfdBuffer
from ..metadata import host_identity
from ..plugin_manager import TransportEntry, discover, instantiate
from ..transport import Transport, TransportContext
from ..types import BufferInfo, MemoryKind, OpCode, PeerInfo, PeerLink, Permission
from .target import BUFFERS, ControlPlane, KiB, MiB, buffer_seed, pattern, recv_frame, send_frame

log = logging.getLogger(__name__)

READ, WRITE = int(OpCode.READ), int(OpCode.WRITE)
NO_STAT_SLOT = 0xFFFFFFFF  # telemetry slot the core ignores: the kit keeps its own books
LOCAL_BYTES = 8 * MiB
CHECK_DEADLINE_S = 30.0  # every slice of a check must be reported by then
GRACE_S = 0.02  # after a group of slices was reported: nothing more may arrive in this long...
CHECK_GRACE_S = 0.2  # ...nor in this long at the end of each check (over every slice so far)
_SUBMIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32)


class CheckFailed(AssertionError):
    """A contract violation, with what was expected and what happened."""


class CheckSkipped(Exception):
    """The check does not apply to this transport here (the message says why)."""


@dataclass
class CheckResult:
    name: str
    status: str  # "passed" | "failed" | "skipped"
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    transport: str
    checks: list[CheckResult] = field(default_factory=list)
    kind_pair: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    reason: str = ""  # set when no check could run at all

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.status == status)

    @property
    def ok(self) -> bool:
        return self.count("failed") == 0 and not (self.reason and not self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "transport": self.transport,
            "passed": self.count("passed"),
            "failed": self.count("failed"),
            "skipped": self.count("skipped"),
            "kind_pair": self.kind_pair,
            "config": self.config,
            "reason": self.reason,
            "checks": [dataclasses.asdict(c) for c in self.checks],
        }


# --------------------------------------------------------------------------- slices and their books
@dataclass(frozen=True)
class WaitCond:
    """A waiting READ's condition (tent_wait_t): answer once lo <= *word <= hi, park while
    floor <= *word < lo, at most wait_ms."""

    word: int  # target-side address
    floor: int
    lo: int
    hi: int
    wait_ms: int
    reserved: int = 0


@dataclass
class Slice:
    op: int
    local: int  # address
    remote: int  # address
    length: int
    rail: int = 0
    peer: int | None = None  # default: the session's link handle


class Completions:
    """Per-slice completion books over the core's host API: one counter per slice."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._batches: dict[int, Any] = {}  # token -> Batch (kept alive for the whole run: unique tokens)
        self._queued: dict[int, int] = {}  # token -> retryable status seen in the failure queue
        self.duplicates: list[str] = []

    def new(self) -> Any:
        b = _native.Batch(1)
        with self._lock:
            self._batches[b.token] = b
        return b

    def drain_failures(self) -> None:
        """Retryable failures arrive in the core's queue instead of the counter: book them."""
        try:
            os.read(_native.failure_fd(), 8)
        except BlockingIOError:
            pass
        recs = np.frombuffer(_native.pop_failures(), FAILURE_DTYPE)
        foreign = []
        with self._lock:
            for rec in recs:
                token, status = int(rec["slice"]["token"]), int(rec["status"])
                b = self._batches.get(token)
                if b is None:
                    foreign.append(rec)
                    continue
                if token in self._queued or b.remaining <= 0:
                    self.duplicates.append(f"slice reported again with status {_status_name(status)} after it completed")
                    continue
                self._queued[token] = status
                b.fail_slice(status)  # finalize it: a later report would now show as a duplicate
        if foreign:
            _native.requeue_failures(np.array(foreign, FAILURE_DTYPE).tobytes())

    def status(self, b: Any) -> int | None:
        """None while outstanding; else the reported status (retryable ones included)."""
        if b.remaining > 0:
            return None
        queued = self._queued.get(b.token)
        return queued if queued is not None else int(b.error)

    def wait(self, batches: Sequence[Any], deadline_s: float = CHECK_DEADLINE_S) -> list[int | None]:
        """Statuses of `batches` once every one was reported, or with None for those not reported by the deadline."""
        end = time.monotonic() + deadline_s
        fd = _native.failure_fd()
        while True:
            self.drain_failures()
            out = [self.status(b) for b in batches]
            if all(s is not None for s in out) or time.monotonic() >= end:
                return out
            select.select([fd], [], [], min(0.01, max(0.0, end - time.monotonic())))

    def all_batches(self) -> list[Any]:
        with self._lock:
            return list(self._batches.values())

    def check_no_duplicates(self, batches: Sequence[Any], grace_s: float = GRACE_S) -> None:
        time.sleep(grace_s)
        self.drain_failures()
        twice = [b for b in batches if b.remaining < 0]
        if twice or self.duplicates:
            raise CheckFailed(
                f"{len(twice) + len(self.duplicates)} slice(s) reported more than once "
                f"({'; '.join(self.duplicates[:3]) or 'the completion counter went below zero'})"
            )


def _status_name(status: int | None) -> str:
    if status is None:
        return "never reported"
    try:
        return Status(status).name
    except ValueError:
        return f"unknown status {status}"


# --------------------------------------------------------------------------- the target process
class Target:
    """The target process and its buffers (as advertised to the initiator)."""

    def __init__(self, name: str, kind: MemoryKind, config: dict[str, Any], timeout: float = 60.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tent_core.conformance.target", name, "--kind", kind.value, "--config", json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self._stderr: list[bytes] = []
        self._err_thread = threading.Thread(target=self._pump_stderr, daemon=True)
        self._err_thread.start()
        try:
            hello = self._recv(timeout)
        except (TimeoutError, EOFError) as exc:
            self.close()
            raise RuntimeError(f"target process did not start: {exc}; its log: {self.log()}") from None
        if not hello.get("ok"):
            self.close()
            raise RuntimeError(f"target: {hello.get('error')}")
        self.pid = int(hello["pid"])
        self.engine_id = str(hello["engine_id"])
        self.host_id = str(hello["host_id"])
        self.descriptor: dict[str, Any] = hello["descriptor"]
        self.buffers: dict[str, dict[str, Any]] = {b["name"]: b for b in hello["buffers"]}

    def _pump_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            if sum(map(len, self._stderr)) < 64 * KiB:  # bounded
                self._stderr.append(line)

    def log(self) -> str:
        return b"".join(self._stderr).decode(errors="replace").strip()[-2000:]

    def _recv(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        return recv_frame(self.proc.stdout.fileno(), timeout)

    def call(self, msg: dict[str, Any], timeout: float = 30.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        send_frame(self.proc.stdin, msg)
        reply = self._recv(timeout)
        if not reply.get("ok"):
            raise RuntimeError(f"target refused {msg.get('op')}: {reply.get('error')}")
        return reply

    def addr(self, name: str) -> int:
        return int(self.buffers[name]["addr"])

    def read(self, name: str, off: int, n: int) -> np.ndarray:
        return np.frombuffer(self.call({"op": "read", "buf": name, "off": off, "len": n})["data"], np.uint8)

    def expected(self, name: str, off: int, n: int) -> np.ndarray:
        """What buffer `name` holds at [off, off+n) while nobody wrote it since its last fill."""
        return pattern(BUFFERS[name][0], buffer_seed(name))[off : off + n]

    def peer_info(self, transport: str) -> PeerInfo:
        return PeerInfo(self.engine_id, self.host_id, self.pid, {transport: self.descriptor})

    def buffer_list(self) -> list[dict[str, Any]]:
        keys = ("segment", "offset", "addr", "length", "perm", "kind", "desc")
        return [{k: b[k] for k in keys} for b in self.buffers.values()]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call({"op": "exit"}, timeout=10.0)
            except (OSError, RuntimeError, TimeoutError, EOFError, ValueError):
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()
        self._err_thread.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


# --------------------------------------------------------------------------- the initiator session
class Session:
    """One started transport in this process, connected to the target, with a local buffer."""

    def __init__(self, name: str, entry: TransportEntry, target: Target, config: dict[str, Any],
                 books: Completions) -> None:  # fmt: skip
        transport, avail = instantiate(entry)
        if transport is None or not avail.available:
            raise RuntimeError(f"transport {name} unavailable: {avail.reason}")
        self.name = name
        self.transport: Transport = transport
        self.target = target
        self.books = books
        self.link: PeerLink | None = None
        self._exported = False
        self._transport_open = False
        self.local: MemfdBuffer | None = None
        self.control: ControlPlane | None = None
        try:
            cfg = transport.resolve_config(config)
            self.control = ControlPlane(name)  # the target may call back (e.g. to ping its initiators)
            self.control.transport = transport
            self._transport_open = True  # a start() that fails half-way is closed too
            transport.start(TransportContext(engine_id=self.control.engine_id, host_id=host_identity(), config=cfg,
                                             bind_host="127.0.0.1"))  # fmt: skip
            self.local = MemfdBuffer(LOCAL_BYTES, name="tent-conformance-local")
            self.local_info = BufferInfo("local", 0, self.local.addr, LOCAL_BYTES, MemoryKind.HOST,
                                         perm=Permission.READ_WRITE, memfd=self.local.fd)  # fmt: skip
            if any(MemoryKind.HOST in pair for pair in transport.capabilities().kind_pairs):
                transport.export_buffer(self.local_info)  # as the engine does for every registered buffer
                self._exported = True
            peer = target.peer_info(name)
            why = transport.can_reach(peer)
            if why:
                raise CheckFailed(f"can_reach() refuses a peer on this host: {why}")
            self.link = transport.connect(peer, target.buffer_list())
            if not self.link.rails:
                raise CheckFailed("connect() returned a link without rails")
            ops = _Ops.from_address(transport.executor.ops)
            self._submit = _SUBMIT(ops.submit)
        except BaseException:
            self.close()
            raise

    @property
    def handle(self) -> int:
        assert self.link is not None
        return self.link.handle

    @property
    def arr(self) -> np.ndarray:
        assert self.local is not None
        return self.local.array

    @property
    def addr(self) -> int:
        assert self.local is not None
        return self.local.addr

    def submit(self, slices: Sequence[Slice]) -> tuple[int, list[Any]]:
        """Hand `slices` to the executor in one submit() call. Returns (rc, one counter per slice)."""
        batches = [self.books.new() for _ in slices]
        rec = np.zeros(len(slices), SLICE_DTYPE)
        now = _native.now_ns()
        for i, (s, b) in enumerate(zip(slices, batches, strict=True)):
            rec[i] = (s.local, s.remote, s.length, self.handle if s.peer is None else s.peer, b.token, now, s.op,
                      s.rail, NO_STAT_SLOT, 0)  # fmt: skip
        ex = self.transport.executor
        rc = int(self._submit(ex.handle, rec.ctypes.data, len(slices)))
        return rc, batches

    def submit_waiting(self, items: Sequence[tuple[Slice, WaitCond | None]]) -> tuple[list[int], list[Any]]:
        """Each slice in a submit() of its own through the core's host API, with its wait condition
        armed the way engine.submit_when arms one (tent_host_wait answers it), but unchecked: the kit
        sends malformed ones on purpose. Returns (rc per slice, one counter per slice)."""
        ex = self.transport.executor
        rcs, batches = [], []
        for sl, cond in items:
            b = self.books.new()
            rec = np.zeros(1, SLICE_DTYPE)
            rec[0] = (sl.local, sl.remote, sl.length, self.handle if sl.peer is None else sl.peer, 0, 0, sl.op, sl.rail,
                      NO_STAT_SLOT, 0)  # fmt: skip
            if cond is not None:
                row = (sl.local, sl.local + max(1, sl.length), cond.word, cond.floor, cond.lo, cond.hi, cond.wait_ms,
                       cond.reserved)  # fmt: skip
                _native.wait_arm(np.array([row], WAIT_DTYPE).tobytes())
            try:
                rcs.append(int(_native.submit(ex.ops, ex.handle, b, rec)))
            finally:
                if cond is not None:
                    _native.wait_arm(None)
            batches.append(b)
        return rcs, batches

    def run(self, slices: Sequence[Slice], deadline_s: float = CHECK_DEADLINE_S) -> list[int]:
        """Submit, wait for every report, check none came twice; the statuses in order."""
        rc, batches = self.submit(slices)
        if rc != 0:
            raise CheckFailed(f"submit() of {len(slices)} valid slice(s) returned {_status_name(rc)}")
        statuses = self.books.wait(batches, deadline_s)
        missing = sum(1 for s in statuses if s is None)
        if missing:
            raise CheckFailed(f"{missing} of {len(slices)} slice(s) not reported within {deadline_s:.0f} s")
        self.books.check_no_duplicates(batches)
        return [int(s) for s in statuses if s is not None]

    def run_ok(self, slices: Sequence[Slice], what: str) -> None:
        statuses = self.run(slices)
        bad = [(i, s) for i, s in enumerate(statuses) if s != Status.OK]
        if bad:
            i, s = bad[0]
            sl = slices[i]
            raise CheckFailed(f"{what}: {len(bad)} slice(s) failed, first: {'READ' if sl.op == READ else 'WRITE'} "
                              f"of {sl.length} bytes -> {_status_name(s)}")  # fmt: skip

    def close_transport(self) -> None:
        """Disconnect, release the local buffer, close the transport (the local memory stays mapped)."""
        if not self._transport_open:
            return
        self._transport_open = False
        try:
            if self.link is not None:
                self.transport.disconnect(self.link)
            if self._exported:
                self.transport.release_buffer(self.local_info)
        finally:
            self.transport.close()
            if self.control is not None:
                self.control.close()

    def close(self) -> None:
        try:
            self.close_transport()
        finally:
            if self.local is not None:
                self.local.close()
                self.local = None


def _expect_bytes(got: np.ndarray, want: np.ndarray, what: str) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        diff = np.flatnonzero(got != want) if got.shape == want.shape else [0]
        raise CheckFailed(f"{what}: bytes differ (first at offset {int(diff[0])} of {len(want)})")


# --------------------------------------------------------------------------- the checks
def check_read_write_exact(s: Session) -> str:
    """READ and WRITE move exactly the requested bytes across two processes, at several sizes."""
    t = s.target
    sizes = [1, 4095, 4096, 65537, MiB + 3, BUFFERS["rw"][0]]
    for n in sizes:
        s.arr[:n] = 0
        s.run_ok([Slice(READ, s.addr, t.addr("rw"), n)], f"READ of {n} bytes")
        _expect_bytes(s.arr[:n], t.expected("rw", 0, n), f"READ of {n} bytes")
    for i, n in enumerate(sizes):
        data = pattern(n, 77 + i)
        s.arr[:n] = data
        s.run_ok([Slice(WRITE, s.addr, t.addr("rw"), n)], f"WRITE of {n} bytes")
        _expect_bytes(t.read("rw", 0, n), data, f"WRITE of {n} bytes (read back by the target)")
    t.call({"op": "fill", "buf": "rw", "seed": buffer_seed("rw")})
    return f"sizes {sizes}"


def check_zero_length(s: Session) -> str:
    """Zero-length READ and WRITE complete OK and move nothing, also at a buffer's very end."""
    t = s.target
    size = BUFFERS["rw"][0]
    s.arr[:16] = 0xA5
    s.run_ok([Slice(READ, s.addr, t.addr("rw"), 0), Slice(WRITE, s.addr, t.addr("rw"), 0),
              Slice(READ, s.addr + 7, t.addr("rw") + size, 0),
              Slice(WRITE, s.addr + 7, t.addr("rw") + size, 0)], "zero-length slices")  # fmt: skip
    if not (s.arr[:16] == 0xA5).all():
        raise CheckFailed("a zero-length READ changed local bytes")
    _expect_bytes(t.read("rw", 0, 64), t.expected("rw", 0, 64), "target after zero-length WRITEs")
    _expect_bytes(t.read("rw", size - 64, 64), t.expected("rw", size - 64, 64), "target end after zero-length WRITEs")
    return "4 slices"


def check_unaligned(s: Session) -> str:
    """Odd offsets and lengths on both sides; the bytes around each range stay untouched."""
    t = s.target
    cases = [(1, 3, 5), (4093, 8191, 1), (12345, 777, 70001), (3, 4096 * 3 + 1, 4096 * 5 - 3)]
    guard = 64
    for k, (loff, roff, n) in enumerate(cases):
        s.arr[: loff + n + guard] = 0x5A
        s.run_ok([Slice(READ, s.addr + loff, t.addr("rw") + roff, n)], f"unaligned READ {loff}/{roff}/{n}")
        _expect_bytes(s.arr[loff : loff + n], t.expected("rw", roff, n), f"unaligned READ {loff}/{roff}/{n}")
        if not (s.arr[:loff] == 0x5A).all() or not (s.arr[loff + n : loff + n + guard] == 0x5A).all():
            raise CheckFailed(f"unaligned READ {loff}/{roff}/{n} wrote outside its local range")
        data = pattern(n, 500 + k)
        s.arr[loff : loff + n] = data
        s.run_ok([Slice(WRITE, s.addr + loff, t.addr("rw") + roff, n)], f"unaligned WRITE {loff}/{roff}/{n}")
        lo = max(0, roff - guard)
        got = t.read("rw", lo, (roff - lo) + n + guard)
        _expect_bytes(got[roff - lo : roff - lo + n], data, f"unaligned WRITE {loff}/{roff}/{n}")
        _expect_bytes(got[: roff - lo], t.expected("rw", lo, roff - lo), "bytes before an unaligned WRITE")
        _expect_bytes(got[roff - lo + n :], t.expected("rw", roff + n, guard), "bytes after an unaligned WRITE")
        t.call({"op": "fill", "buf": "rw", "seed": buffer_seed("rw")})
    return f"{len(cases)} (local offset, remote offset, length) cases"


def _refused(s: Session, sl: Slice, want: Status, what: str) -> None:
    (status,) = s.run([sl])
    if status != want:
        raise CheckFailed(f"{what}: expected {want.name}, got {_status_name(status)}")


def check_bounds(s: Session) -> str:
    """Slices outside the peer's registered buffers fail with E_BOUNDS, and move nothing."""
    ac = s.transport.access_control(s.link)
    if not ac.bounds:
        raise CheckSkipped(f"this link does not refuse out-of-bounds ranges itself: {ac.reason}")
    t = s.target
    size = BUFFERS["rw"][0]
    end = t.addr("rw") + size
    s.arr[:8192] = 0x33
    _refused(s, Slice(READ, s.addr, end - 100, 4096), Status.E_BOUNDS, "READ running past a buffer's end")
    _refused(s, Slice(WRITE, s.addr, end - 100, 4096), Status.E_BOUNDS, "WRITE running past a buffer's end")
    far = max(int(b["addr"]) + int(b["length"]) for b in t.buffers.values()) + (1 << 30)
    _refused(s, Slice(READ, s.addr, far, 4096), Status.E_BOUNDS, "READ outside every registered buffer")
    _refused(s, Slice(WRITE, s.addr, far, 4096), Status.E_BOUNDS, "WRITE outside every registered buffer")
    _expect_bytes(t.read("rw", size - 4096, 4096), t.expected("rw", size - 4096, 4096), "target after refused WRITEs")
    return "past the end and outside every buffer, both ops"


def check_permission(s: Session) -> str:
    """A READ-only buffer serves READs; a WRITE into it fails with E_PERMISSION and changes nothing."""
    t = s.target
    n = BUFFERS["ro"][0]
    s.run_ok([Slice(READ, s.addr, t.addr("ro"), n)], "READ from a READ-only buffer")
    _expect_bytes(s.arr[:n], t.expected("ro", 0, n), "READ from a READ-only buffer")
    ac = s.transport.access_control(s.link)
    if not ac.permission:
        raise CheckSkipped(f"READs pass; this link does not refuse writes itself: {ac.reason}")
    s.arr[:n] = pattern(n, 4242)
    _refused(s, Slice(WRITE, s.addr, t.addr("ro"), n), Status.E_PERMISSION, "WRITE into a READ-only buffer")
    _expect_bytes(t.read("ro", 0, n), t.expected("ro", 0, n), "READ-only buffer after the refused WRITE")
    return "READ served, WRITE refused"


def check_concurrent(s: Session) -> str:
    """Hundreds of slices of mixed sizes and ops, from several threads at once: all OK, exactly once, exact bytes."""
    t = s.target
    half = BUFFERS["rw"][0] // 2
    rng = np.random.default_rng(7)
    cuts = np.unique(np.concatenate([[0, half], rng.integers(1, half, 255)]))
    pieces = list(zip(cuts[:-1].tolist(), (cuts[1:] - cuts[:-1]).tolist(), strict=True))
    s.arr[:half] = 0
    src = pattern(half, 99)
    s.arr[half : 2 * half] = src
    slices = [Slice(READ, s.addr + off, t.addr("rw") + off, n) for off, n in pieces]
    slices += [Slice(WRITE, s.addr + half + off, t.addr("rw") + half + off, n) for off, n in pieces]
    order = rng.permutation(len(slices))
    groups = [[slices[i] for i in order[k::4]] for k in range(4)]
    results: list[list[Any]] = [[] for _ in groups]
    errors: list[str] = []

    def submitter(k: int) -> None:
        try:
            for j in range(0, len(groups[k]), 16):
                rc, batches = s.submit(groups[k][j : j + 16])
                if rc != 0:
                    errors.append(f"submit() returned {_status_name(rc)}")
                    return
                results[k].extend(batches)
        except Exception as exc:  # reported below, the other threads go on
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(len(groups))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(CHECK_DEADLINE_S)
    if errors:
        raise CheckFailed(f"concurrent submit: {errors[0]}")
    batches = [b for r in results for b in r]
    statuses = s.books.wait(batches)
    missing = sum(1 for st in statuses if st is None)
    bad = [st for st in statuses if st not in (None, Status.OK)]
    if missing or bad:
        raise CheckFailed(f"{missing} slice(s) never reported, {len(bad)} failed"
                          + (f" (first: {_status_name(bad[0])})" if bad else ""))  # fmt: skip
    s.books.check_no_duplicates(batches)
    _expect_bytes(s.arr[:half], t.expected("rw", 0, half), "concurrent READs")
    _expect_bytes(t.read("rw", half, half), src, "concurrent WRITEs")
    t.call({"op": "fill", "buf": "rw", "seed": buffer_seed("rw")})
    return f"{len(slices)} slices from {len(groups)} threads"


def check_all_or_nothing_submit(s: Session) -> str:
    """A submit() holding an invalid slice either refuses them all (and none is ever reported) or
    takes them all (and each is reported exactly once, the invalid one with an error)."""
    t = s.target
    outcomes = []
    for label, bad in (("unknown opcode", Slice(7, s.addr, t.addr("rw"), 4096)),
                       ("unknown peer handle", Slice(READ, s.addr, t.addr("rw"), 4096, peer=0x7EADBEEF0001))):  # fmt: skip
        good = [Slice(READ, s.addr + 8192 * (i + 1), t.addr("rw") + 4096 * i, 4096) for i in range(4)]
        slices = [*good[:2], bad, *good[2:]]
        rc, batches = s.submit(slices)
        if rc != 0:
            if rc >= 0 or rc not in {int(v) for v in Status}:
                raise CheckFailed(f"{label}: submit() returned {rc}, neither 0 nor a negative tent_status")
            time.sleep(CHECK_GRACE_S)
            s.books.drain_failures()
            reported = [b for b in batches if b.remaining != 1]
            if reported:
                raise CheckFailed(f"{label}: submit() refused the batch ({_status_name(rc)}) yet {len(reported)} "
                                  "of its slices were reported")  # fmt: skip
            outcomes.append(f"{label}: refused ({_status_name(rc)})")
            continue
        statuses = s.books.wait(batches)
        if any(st is None for st in statuses):
            raise CheckFailed(f"{label}: submit() took the batch but some slices were never reported")
        s.books.check_no_duplicates(batches)
        if statuses[2] == Status.OK:
            raise CheckFailed(f"{label}: the invalid slice completed OK")
        if any(st != Status.OK for i, st in enumerate(statuses) if i != 2):
            raise CheckFailed(f"{label}: a valid slice next to the invalid one failed")
        outcomes.append(f"{label}: taken, invalid one {_status_name(statuses[2])}")
    return "; ".join(outcomes)


def check_abort_rail(s: Session) -> str:
    """abort_rail() fails the rail's queued and in-flight slices now, each reported exactly once with
    a retryable status (or OK if it had finished), and the rail serves new slices afterwards."""
    if type(s.transport).abort_rail is Transport.abort_rail:
        raise CheckSkipped("abort_rail is optional and this transport does not implement it")
    t = s.target
    rail = s.link.rails[0].index
    n, size = 256, 256 * KiB
    slices = [Slice(READ, s.addr + (i % 16) * size, t.addr("back") + i * size % BUFFERS["back"][0], size, rail=rail)
              for i in range(n)]  # fmt: skip
    rc, batches = s.submit(slices)
    if rc != 0:
        raise CheckFailed(f"submit() of the backlog returned {_status_name(rc)}")
    handed_back = s.transport.abort_rail(s.link, rail)
    statuses = s.books.wait(batches)
    if any(st is None for st in statuses):
        raise CheckFailed(f"{sum(st is None for st in statuses)} slice(s) never reported after abort_rail")
    s.books.check_no_duplicates(batches)
    final = [st for st in statuses if st is not None and st != Status.OK and not Status(st).retryable]
    if final:
        raise CheckFailed(f"abort_rail made {len(final)} slice(s) fail with a final status ({_status_name(final[0])}); "
                          "they must stay retryable so the core re-routes them")  # fmt: skip
    retried = sum(1 for st in statuses if st != Status.OK)
    if handed_back > retried:
        raise CheckFailed(f"abort_rail returned {handed_back} but only {retried} slice(s) failed")
    end = time.monotonic() + 10.0
    while True:  # the engine probes a paused rail and re-admits it: it must work again
        s.arr[:4096] = 0
        (st,) = s.run([Slice(READ, s.addr, t.addr("rw"), 4096, rail=rail)])
        if st == Status.OK:
            _expect_bytes(s.arr[:4096], t.expected("rw", 0, 4096), "READ on the rail after abort_rail")
            break
        if not Status(st).retryable or time.monotonic() > end:
            raise CheckFailed(f"the rail does not serve new slices after abort_rail: {_status_name(st)}")
        time.sleep(0.1)
    note = "" if retried else " (the backlog finished before the abort)"
    return f"{n} queued, {handed_back} handed back, {retried} retryable{note}"


def check_buffer_reach(s: Session) -> str:
    """What buffer_unreachable() claims holds (the core plans by it): it answers for every buffer,
    before and after connect, without raising, and a buffer ruled out before connecting stays ruled
    out; every buffer it does not rule out moves exact bytes; one it rules out is never reached (a
    slice to it fails and moves nothing)."""
    t = s.target
    peer = t.peer_info(s.name)
    served, refused = [], {}
    for name, b in sorted(t.buffers.items()):
        if name == "rel":
            continue  # released by another check
        view = {k: b[k] for k in ("offset", "addr", "length", "perm", "kind", "desc")}
        try:
            before = s.transport.buffer_unreachable(peer, view, None)
            after = s.transport.buffer_unreachable(peer, view, s.link)
        except Exception as exc:
            raise CheckFailed(f"buffer_unreachable() raised for buffer {name!r}: {type(exc).__name__}: {exc}") from exc
        if before and not after:
            raise CheckFailed(f"buffer {name!r}: ruled out before connect ({before}) but not after: the core "
                              "would have routed around a buffer the link serves")  # fmt: skip
        if after:
            refused[name] = str(after)
        else:
            served.append(name)
    n = 4096
    for name in served:
        if not t.buffers[name]["perm"] & int(Permission.READ):  # WRITE-only: a WRITE lands instead
            data = pattern(n, 4343)
            s.arr[:n] = data
            s.run_ok([Slice(WRITE, s.addr, t.addr(name), n)], f"WRITE of buffer {name!r} (not ruled out)")
            _expect_bytes(t.read(name, 0, n), data, f"WRITE of buffer {name!r} (read back by the target)")
            t.call({"op": "fill", "buf": name, "seed": buffer_seed(name)})
            continue
        s.arr[:n] = 0
        s.run_ok([Slice(READ, s.addr, t.addr(name), n)], f"READ of buffer {name!r} (not ruled out)")
        _expect_bytes(s.arr[:n], t.expected(name, 0, n), f"READ of buffer {name!r}")
    for name, why in refused.items():
        s.arr[:n] = 0x3C
        (status,) = s.run([Slice(READ, s.addr, t.addr(name), n)])
        if status == Status.OK or not (s.arr[:n] == 0x3C).all():
            raise CheckFailed(f"buffer {name!r} is ruled out ({why}) but a READ of it reached it")
        if t.buffers[name]["perm"] & int(Permission.WRITE):
            s.arr[:n] = 0x3C
            (status,) = s.run([Slice(WRITE, s.addr, t.addr(name), n)])
            _expect_bytes(t.read(name, 0, n), t.expected(name, 0, n), f"buffer {name!r} (ruled out) after a WRITE")
            if status == Status.OK:
                raise CheckFailed(f"buffer {name!r} is ruled out ({why}) but a WRITE to it reported OK")
    return f"served {served}" + (f"; ruled out {sorted(refused)}: {next(iter(refused.values()))}" if refused else "")


def check_release_buffer(s: Session) -> str:
    """After the target's release_buffer() returned, slices into that buffer fail (never succeed, never hang)."""
    ac = s.transport.access_control(s.link)
    if not ac.revocation:
        raise CheckSkipped(f"this link cannot revoke: {ac.reason}")
    t = s.target
    n = BUFFERS["rel"][0]
    s.run_ok([Slice(READ, s.addr, t.addr("rel"), n)], "READ before release")  # the link now uses it
    t.call({"op": "release", "buf": "rel"})
    statuses = s.run([Slice(READ, s.addr, t.addr("rel"), 4096), Slice(WRITE, s.addr, t.addr("rel"), 4096)])
    if Status.OK in statuses:
        raise CheckFailed(f"a slice into a released buffer succeeded ({[_status_name(x) for x in statuses]})")
    return f"after release: {', '.join(_status_name(x) for x in statuses)}"


def check_exactly_once_on_close(s: Session, kit: Kit) -> str:
    """close() with slices queued and in flight: by the time it returns every slice was reported
    exactly once, and nothing is reported afterwards."""
    s2 = kit.fresh()
    t = s2.target
    n, size = 256, 128 * KiB
    slices = [Slice(READ, s2.addr + (i % 32) * size, t.addr("back") + i * size % BUFFERS["back"][0], size)
              for i in range(n)]  # fmt: skip
    rc, batches = s2.submit(slices)
    if rc != 0:
        s2.close_transport()
        raise CheckFailed(f"submit() of the backlog returned {_status_name(rc)}")
    done = threading.Event()
    errors: list[str] = []

    def closer() -> None:
        try:
            s2.close_transport()  # its local memory stays mapped: a late write must not crash the kit
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        done.set()

    threading.Thread(target=closer, daemon=True).start()
    if not done.wait(CHECK_DEADLINE_S):
        raise CheckFailed(f"close() did not return within {CHECK_DEADLINE_S:.0f} s with slices outstanding")
    if errors:
        raise CheckFailed(f"close() raised {errors[0]}")
    s.books.drain_failures()
    unreported = [b for b in batches if b.remaining > 0]
    if unreported:
        raise CheckFailed(f"{len(unreported)} of {n} slice(s) not reported when close() returned")
    s.books.check_no_duplicates(batches, grace_s=CHECK_GRACE_S)
    statuses = [s.books.status(b) for b in batches]
    ok = sum(1 for st in statuses if st == Status.OK)
    return f"{n} slices: {ok} OK, {n - ok} failed, all reported once by close()"


# --------------------------------------------------------------------------- waiting READs
# A word as a source advances it: a version in the high bits, the bytes it holds in the low ones
# (refhub's progress word). Conditions: floor = the version, lo = the version | bytes needed.
WAIT_V = 5 << 40
WAIT_MASK = (1 << 40) - 1
WAIT_LONG_MS = 20_000  # a READ the kit releases itself by writing its word: parks this long at most
WAIT_SHORT_MS = 300  # a READ whose word never arrives
WAIT_BOUND = 2  # the parking bound the bound check sets (Transport.wait_config) ...
WAIT_EXTRA = 2  # ... and the READs it sends beyond it
WAIT_ROUNDS = 3  # tries of a check whose parked READ may end at its cap before the kit looked again
PARK_LOOK_S = 0.2  # a READ whose word is short must still be outstanding after this long
BOUND_REFUSE_S = 10.0  # READs beyond the bound must be answered (refused) within this, never parked
WORD_OFF = BUFFERS["rw"][0] - 4096  # the words live at the end of "rw", the bytes read at its start
DATA_OFF = 4096 + 5
DATA_N = 64 * KiB + 3


class WaitEnv:
    """A target and sessions for the waiting-READ checks, under the transport's
    :meth:`Transport.wait_config` (a low parking bound, a parking cap the kit outlasts) when it
    offers one; else the kit's own target and session, as configured."""

    def __init__(self, kit: Kit) -> None:
        self.kit = kit
        self.sessions: list[Session] = [kit.main]
        self.target = kit.main.target
        self.overlay: dict[str, Any] | None = None
        self._own: Target | None = None
        wanted = kit.main.transport.wait_config(WAIT_BOUND, WAIT_LONG_MS)
        if wanted:
            self.overlay = dict(wanted)
            self.config = {**kit.config, **self.overlay}
            self._own = self.target = Target(kit.name, MemoryKind.HOST, self.config, timeout=kit.start_timeout_s)
            self.sessions = []
        else:
            self.config = kit.config

    def session(self, i: int) -> Session:
        while len(self.sessions) <= i:
            sess = Session(self.kit.name, self.kit.entry, self.target, self.config, self.kit.books)
            self.kit.sessions.append(sess)  # closed with the kit's, before the targets
            self.sessions.append(sess)
        return self.sessions[i]

    def word(self) -> int:
        return self.target.addr("rw") + WORD_OFF

    def set_word(self, value: int, seed: int | None = None, n: int = 0) -> None:
        """The target writes pattern(n, seed) at DATA_OFF of "rw" (if n), then its word = value."""
        msg: dict[str, Any] = {"op": "write_word", "buf": "rw", "off": WORD_OFF, "value": value}
        if n:
            msg.update(data_off=DATA_OFF, len=n, seed=seed)
        self.target.call(msg)

    def close(self) -> None:
        if self._own is not None:
            self._own.close()


class Kit:
    """What a check may use besides the main session: more sessions against the same target
    (:meth:`fresh`), and the waiting-READ environment (:meth:`wait_env`, made on first use)."""

    def __init__(self, name: str, entry: TransportEntry, target: Target, config: dict[str, Any], books: Completions,
                 start_timeout_s: float) -> None:  # fmt: skip
        self.name, self.entry, self.target, self.config, self.books = name, entry, target, config, books
        self.start_timeout_s = start_timeout_s
        self.sessions: list[Session] = []
        self._wait: WaitEnv | None = None

    @property
    def main(self) -> Session:
        return self.sessions[0]

    def fresh(self) -> Session:
        sess = Session(self.name, self.entry, self.target, self.config, self.books)
        self.sessions.append(sess)
        return sess

    def wait_env(self) -> WaitEnv:
        """The waiting-READ environment; CheckSkipped where the transport does not declare them."""
        if not self.main.transport.wait_read:
            raise CheckSkipped("waiting READs are optional and this transport does not declare them (Transport.wait_read)")
        if self.target.buffers["rw"]["kind"] != MemoryKind.HOST.value:
            raise CheckSkipped("the waiting-READ checks need host memory at the target (a word it advances)")
        if self._wait is None:
            self._wait = WaitEnv(self)
        return self._wait

    def close(self) -> None:
        for sess in self.sessions:
            try:
                sess.close()
            except Exception:
                log.exception("closing a %s session failed", self.name)
        try:
            if self._wait is not None:
                self._wait.close()
        finally:
            self.target.close()


def _waiting(s: Session, cond: WaitCond, n: int = DATA_N, remote_off: int = DATA_OFF, local_off: int = 0) -> tuple[int, Any]:
    """Submit one waiting READ of n bytes of "rw" at remote_off; (rc, its counter)."""
    t = s.target
    (rc,), (b,) = s.submit_waiting([(Slice(READ, s.addr + local_off, t.addr("rw") + remote_off, n), cond)])
    if rc != 0:
        raise CheckFailed(f"submit() of a waiting READ returned {_status_name(rc)}")
    return rc, b


def _cond(env: WaitEnv, need: int, wait_ms: int = WAIT_LONG_MS) -> WaitCond:
    return WaitCond(env.word(), WAIT_V, WAIT_V | need, WAIT_V | WAIT_MASK, wait_ms)


def _serves_on(s: Session, what: str) -> None:
    """After `what`: a plain READ on the same rail moves exact bytes (the link and the target live)."""
    t = s.target
    s.arr[:4096] = 0
    s.run_ok([Slice(READ, s.addr, t.addr("ro"), 4096)], f"a plain READ after {what}")
    _expect_bytes(s.arr[:4096], t.expected("ro", 0, 4096), f"a plain READ after {what}")


def check_wait_read_parks(s: Session, kit: Kit) -> str:
    """A waiting READ whose word is short parks (nothing reported, nothing moved) until the target
    writes the word; then it completes OK with the bytes the target wrote before the word. One
    whose word is already in range is answered at once."""
    env = kit.wait_env()
    ws = env.session(0)
    n = DATA_N
    early: list[str] = []
    try:
        for rnd in range(WAIT_ROUNDS):
            seed = 700 + rnd
            env.set_word(WAIT_V)  # floor: nothing held yet
            ws.arr[:n] = 0xEE
            _, b = _waiting(ws, _cond(env, n))
            (st,) = ws.books.wait([b], PARK_LOOK_S)
            if st == Status.OK:
                raise CheckFailed("a waiting READ was answered OK while its word was short of its range")
            if st is not None and st != Status.E_NOT_READY:
                raise CheckFailed(f"a waiting READ whose word was short failed with {_status_name(st)} (want it parked)")
            if not (ws.arr[:n] == 0xEE).all():
                raise CheckFailed("bytes landed for a waiting READ whose word was short of its range")
            if st is not None:  # legal at its cap, but the kit asked for WAIT_LONG_MS: look again
                early.append(f"round {rnd + 1}: E_NOT_READY within {PARK_LOOK_S} s")
                continue
            env.set_word(WAIT_V | n, seed, n)  # the bytes land, then the word says so
            (st,) = ws.books.wait([b])
            if st is None:
                raise CheckFailed(f"a parked READ was not answered within {CHECK_DEADLINE_S:.0f} s of its word arriving")
            if st == Status.E_NOT_READY:
                early.append(f"round {rnd + 1}: E_NOT_READY as its word arrived")
                continue
            if st != Status.OK:
                raise CheckFailed(f"a parked READ failed with {_status_name(st)} once its word arrived")
            ws.books.check_no_duplicates([b])
            _expect_bytes(ws.arr[:n], pattern(n, seed), "a parked READ released by its word")
            break
        else:
            raise CheckFailed(f"a waiting READ asked to park up to {WAIT_LONG_MS} ms ended E_NOT_READY before its word "
                              f"arrived, {WAIT_ROUNDS} times ({'; '.join(early)})")  # fmt: skip
        ws.arr[:n] = 0  # its word is in range already: answered as a plain READ
        _, b = _waiting(ws, _cond(env, n))
        (st,) = ws.books.wait([b])
        if st != Status.OK:
            raise CheckFailed(f"a waiting READ whose word was already in range ended {_status_name(st)}")
        _expect_bytes(ws.arr[:n], pattern(n, 700 + rnd), "a waiting READ whose word was already in range")
    finally:
        env.target.call({"op": "fill", "buf": "rw", "seed": buffer_seed("rw")})
    return f"{n} bytes parked, then answered as the word arrived" + (f" (after {'; '.join(early)})" if early else "")


def check_wait_read_deadline(s: Session, kit: Kit) -> str:
    """A waiting READ whose word never arrives fails with E_NOT_READY (final, no bytes) at its
    deadline, not a hang and not a rail error; so does one whose word is above its range or below
    its floor. The link serves on."""
    env = kit.wait_env()
    ws = env.session(0)
    n = DATA_N
    far = WAIT_V | WAIT_MASK
    cases = [("its word never arrives", WAIT_V, WaitCond(env.word(), WAIT_V, far, far, WAIT_SHORT_MS)),
             ("its word is past its range (another version)", (WAIT_V + (1 << 40)) | 5, _cond(env, n)),
             ("its word is below its floor", 0, _cond(env, n))]  # fmt: skip
    took = 0.0
    try:
        for i, (what, value, cond) in enumerate(cases):
            env.set_word(value)
            ws.arr[:n] = 0xEE
            t0 = time.monotonic()
            _, b = _waiting(ws, cond)
            (st,) = ws.books.wait([b])
            if st is None:
                raise CheckFailed(f"a waiting READ ({what}) was not reported within {CHECK_DEADLINE_S:.0f} s")
            if st != Status.E_NOT_READY:
                kind = "a retryable rail error" if Status(st).retryable else "not E_NOT_READY"
                raise CheckFailed(f"a waiting READ ({what}) ended {_status_name(st)}: {kind}")
            if not (ws.arr[:n] == 0xEE).all():
                raise CheckFailed(f"a waiting READ ({what}) moved bytes although it failed")
            if i == 0:
                took = time.monotonic() - t0
                # its deadline is the kit's (the transport's cap is no shorter under wait_config)
                if env.overlay is not None and took < WAIT_SHORT_MS / 1000:
                    raise CheckFailed(f"a waiting READ asked to wait {WAIT_SHORT_MS} ms ended E_NOT_READY after "
                                      f"{took * 1000:.0f} ms, before its deadline")  # fmt: skip
            ws.books.check_no_duplicates([b])
        _serves_on(ws, "E_NOT_READY answers")
    finally:
        env.set_word(WAIT_V)
    return f"{len(cases)} cases E_NOT_READY; asked to wait {WAIT_SHORT_MS} ms, answered after {took * 1000:.0f} ms"


def check_wait_read_word_access(s: Session, kit: Kit) -> str:
    """A waiting READ's word is checked like any READ: outside registered memory fails with
    E_BOUNDS, in a buffer without READ permission with E_PERMISSION (where the link claims to
    refuse those, AccessControl), whatever the word would say; no bytes move, the target serves on."""
    env = kit.wait_env()
    ws, t = env.session(0), env.target
    ac = ws.transport.access_control(ws.link)
    top = max(int(b["addr"]) + int(b["length"]) for b in t.buffers.values()) & ~7
    cases = []
    if ac.bounds:  # (a buffer's end may be where the next one begins: the highest end is past them all)
        cases += [("just past the highest buffer's end", top, Status.E_BOUNDS),
                  ("far outside every registered buffer", top + (1 << 30), Status.E_BOUNDS)]  # fmt: skip
    if ac.permission:
        cases.append(("in a WRITE-only buffer", t.addr("wo"), Status.E_PERMISSION))
    if not cases:
        raise CheckSkipped(f"this link refuses neither bad ranges nor permissions itself: {ac.reason}")
    n = DATA_N
    for what, word, want in cases:
        ws.arr[:n] = 0xEE
        _, b = _waiting(ws, WaitCond(word, 0, 0, (1 << 64) - 1, WAIT_LONG_MS))  # any value would do
        (st,) = ws.books.wait([b])
        if st != want:
            raise CheckFailed(f"a waiting READ whose word lies {what}: expected {want.name}, got {_status_name(st)}")
        if not (ws.arr[:n] == 0xEE).all():
            raise CheckFailed(f"a waiting READ whose word lies {what} moved bytes")
        ws.books.check_no_duplicates([b])
    _serves_on(ws, "refused words")
    skipped = [] if ac.bounds and ac.permission else [f"not claimed: {ac.reason}"]
    return "; ".join([f"word {w}: {st.name}" for w, _, st in cases] + skipped)


def check_wait_read_malformed(s: Session, kit: Kit) -> str:
    """A malformed condition (word not 8-byte aligned, floor above lo, lo above hi, a wait of 0 ms)
    is refused at submit or answered E_PROTOCOL, never served, even with a word that would satisfy
    it; the target serves plain and waiting READs on."""
    env = kit.wait_env()
    ws = env.session(0)
    n = DATA_N
    w = env.word()
    v = WAIT_V | n
    cases = [("a word not 8-byte aligned", WaitCond(w + 3, WAIT_V, WAIT_V | 1, WAIT_V | WAIT_MASK, WAIT_LONG_MS)),
             ("floor above lo", WaitCond(w, WAIT_V | 2, WAIT_V | 1, WAIT_V | WAIT_MASK, WAIT_LONG_MS)),
             ("lo above hi", WaitCond(w, WAIT_V, WAIT_V | 2, WAIT_V | 1, WAIT_LONG_MS)),
             ("a wait of 0 ms", WaitCond(w, WAIT_V, WAIT_V | 1, WAIT_V | WAIT_MASK, 0))]  # fmt: skip
    outcomes = []
    try:
        env.set_word(v, 801, n)  # the bytes are there: only the malformation keeps them back
        for what, cond in cases:
            ws.arr[:n] = 0xEE
            (rc,), (b,) = ws.submit_waiting([(Slice(READ, ws.addr, env.target.addr("rw") + DATA_OFF, n), cond)])
            if rc != 0:
                outcomes.append(f"{what}: refused at submit ({_status_name(rc)})")
            else:
                (st,) = ws.books.wait([b])
                if st != Status.E_PROTOCOL:
                    raise CheckFailed(f"a waiting READ with {what}: expected E_PROTOCOL, got {_status_name(st)}")
                if not (ws.arr[:n] == 0xEE).all():
                    raise CheckFailed(f"a waiting READ with {what} moved bytes")
                ws.books.check_no_duplicates([b])
                outcomes.append(f"{what}: E_PROTOCOL")
            _serves_on(ws, f"a condition with {what}")
        ws.arr[:n] = 0
        _, b = _waiting(ws, _cond(env, n))
        (st,) = ws.books.wait([b])
        if st != Status.OK:
            raise CheckFailed(f"a valid waiting READ after the malformed ones ended {_status_name(st)}")
        _expect_bytes(ws.arr[:n], pattern(n, 801), "a valid waiting READ after the malformed ones")
    finally:
        env.target.call({"op": "fill", "buf": "rw", "seed": buffer_seed("rw")})
    return "; ".join(outcomes)


def check_wait_read_bound(s: Session, kit: Kit) -> str:
    """With the target's parking bound set low (Transport.wait_config): that many waiting READs
    park (from as many sessions); more, sent while they are parked, are answered E_NOT_READY at
    once, not parked or queued; the parked ones are then answered OK when their word arrives."""
    env = kit.wait_env()
    if env.overlay is None:
        raise CheckSkipped("the transport offers no config that sets its parking bound (Transport.wait_config)")
    sessions = [env.session(i) for i in range(WAIT_BOUND + WAIT_EXTRA)]
    firsts, extras = sessions[:WAIT_BOUND], sessions[WAIT_BOUND:]
    n, seed = DATA_N, 901
    env.set_word(WAIT_V)
    parked: list[Any] = []
    refused: list[Any] = []
    try:
        for ws in sessions:
            ws.arr[:n] = 0xEE
        for ws in firsts:
            parked.append(_waiting(ws, _cond(env, n))[1])
        st = s.books.wait(parked, PARK_LOOK_S)
        if any(x is not None for x in st):
            raise CheckFailed(f"of {WAIT_BOUND} waiting READs within the bound, some ended before their word arrived "
                              f"({[_status_name(x) for x in st]})")  # fmt: skip
        for ws in extras:
            refused.append(_waiting(ws, _cond(env, n))[1])
        st = s.books.wait(refused, BOUND_REFUSE_S)
        if any(x is None for x in st):
            raise CheckFailed(f"{sum(x is None for x in st)} of {WAIT_EXTRA} waiting READ(s) beyond the bound of "
                              f"{WAIT_BOUND} parked ones were not answered within {BOUND_REFUSE_S:.0f} s: parked or "
                              "queued, not refused")  # fmt: skip
        if any(x != Status.E_NOT_READY for x in st):
            raise CheckFailed(f"waiting READs beyond the bound ended {[_status_name(x) for x in st]}, "
                              "not E_NOT_READY")  # fmt: skip
        for ws in extras:
            if not (ws.arr[:n] == 0xEE).all():
                raise CheckFailed("a waiting READ refused for the bound moved bytes")
        st = [s.books.status(b) for b in parked]
        if any(x is not None for x in st):
            raise CheckFailed(f"parked READs within the bound ended before their word arrived ({[_status_name(x) for x in st]})")
    finally:  # release whatever is parked, so nothing outlives the check
        env.set_word(WAIT_V | n, seed, n)
        final = s.books.wait(parked + refused)
        env.target.call({"op": "fill", "buf": "rw", "seed": buffer_seed("rw")})
        env.set_word(WAIT_V)
    bad = [x for x in final[: len(parked)] if x != Status.OK]
    if bad:
        raise CheckFailed(f"parked READs ended {[_status_name(x) for x in bad]} once their word arrived")
    for ws in firsts:
        _expect_bytes(ws.arr[:n], pattern(n, seed), "a parked READ within the bound")
    s.books.check_no_duplicates(parked + refused)
    return f"bound {WAIT_BOUND} (config {env.overlay}): {WAIT_EXTRA} more refused, {WAIT_BOUND} parked answered OK"


CHECKS: dict[str, Callable[..., str]] = {
    "read_write_exact": check_read_write_exact,
    "zero_length": check_zero_length,
    "unaligned": check_unaligned,
    "bounds": check_bounds,
    "permission": check_permission,
    "concurrent": check_concurrent,
    "all_or_nothing_submit": check_all_or_nothing_submit,
    "abort_rail": check_abort_rail,
    "buffer_reach": check_buffer_reach,
    "release_buffer": check_release_buffer,
    "exactly_once_on_close": check_exactly_once_on_close,
    "wait_read_parks": check_wait_read_parks,
    "wait_read_deadline": check_wait_read_deadline,
    "wait_read_word_access": check_wait_read_word_access,
    "wait_read_malformed": check_wait_read_malformed,
    "wait_read_bound": check_wait_read_bound,
}
_TAKES_KIT = {"exactly_once_on_close", "wait_read_parks", "wait_read_deadline", "wait_read_word_access",
              "wait_read_malformed", "wait_read_bound"}  # fmt: skip


def _remote_kind(transport: Transport) -> tuple[MemoryKind | None, str]:
    caps = transport.capabilities()
    if not caps.same_host:
        return None, "the kit runs both processes on this host and the transport serves no same-host peer"
    for kind in (MemoryKind.HOST, MemoryKind.FILE):
        if (MemoryKind.HOST, kind) in caps.kind_pairs:
            return kind, ""
    pairs = ", ".join(sorted(f"{a.value}->{b.value}" for a, b in caps.kind_pairs))
    return None, f"the kit exercises host memory and files; this transport serves {pairs or 'nothing'}"


def run(name: str, config: dict[str, Any] | None = None, only: Sequence[str] | None = None,
        start_timeout_s: float = 60.0) -> Report:  # fmt: skip
    """Run the contract checks against installed transport `name` (its config section `config`);
    the target process has `start_timeout_s` to come up (emulated or loaded machines need more)."""
    config = dict(config or {})
    report = Report(name, config=config)
    unknown = sorted(set(only or ()) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; known: {list(CHECKS)}")
    selected = [c for c in CHECKS if not only or c in only]
    entry = discover().registry.entries.get(name)
    if entry is None:
        raise LookupError(f"transport {name!r} is not installed (see `tent plugins`)")
    probe_t, avail = instantiate(entry)
    if probe_t is not None:
        probe_t.resolve_config(config)  # a bad section is a usage error (ConfigError), before any process starts
    kind, why = _remote_kind(probe_t) if probe_t is not None and avail.available else (None, avail.reason)
    if kind is None:
        report.reason = f"unavailable here: {why}" if not avail.available else why
        report.checks = [CheckResult(c, "skipped", report.reason) for c in selected]
        return report
    report.kind_pair = f"host->{kind.value}"
    books = Completions()
    try:
        target = Target(name, kind, config, timeout=start_timeout_s)
    except (RuntimeError, OSError) as exc:
        report.reason = f"the target process failed: {exc}"
        report.checks = [CheckResult(c, "failed", report.reason) for c in selected]
        return report
    kit = Kit(name, entry, target, config, books, start_timeout_s)
    try:
        try:
            main = kit.fresh()
        except Exception as exc:
            report.reason = f"could not start and connect the transport: {type(exc).__name__}: {exc}"
            report.checks = [CheckResult(c, "failed", report.reason) for c in selected]
            return report
        for check in selected:
            t0 = time.monotonic()
            try:
                fn = CHECKS[check]
                detail = fn(main, kit) if check in _TAKES_KIT else fn(main)
                books.check_no_duplicates(books.all_batches(), CHECK_GRACE_S)  # late reports of any check
                result = CheckResult(check, "passed", detail)
            except CheckSkipped as exc:
                result = CheckResult(check, "skipped", str(exc))
            except CheckFailed as exc:
                result = CheckResult(check, "failed", str(exc))
            except Exception as exc:  # a crash inside the transport is a failure of this check, not of the kit
                log.debug("check %s raised", check, exc_info=True)
                result = CheckResult(check, "failed", f"raised {type(exc).__name__}: {exc}")
            result.seconds = round(time.monotonic() - t0, 3)
            report.checks.append(result)
            log.info("%s %s: %s", check, result.status, result.detail)
    finally:
        kit.close()
    return report
