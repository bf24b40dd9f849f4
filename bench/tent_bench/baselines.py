"""Peer and physical-limit baselines for ``tent bench``.

Every baseline runs the same sweep as the engine benchmark (block sizes x batch
sizes x READ/WRITE) and returns rows of the same shape, so the benchmark can
print ratios against them:

    {"engine", "transport", "op", "block_size", "batch_size", "gbps", "avg_us", "p50_us", "p99_us",
     "iters", "parallel", "verified_bytes"}

* ``socket``   -- plain TCP streams between two processes on loopback (the
                  physical limit of a TCP transport on this host), as many
                  streams as the engine has connections, each block cut over them.
* ``cma``      -- bare ``process_vm_readv``/``process_vm_writev`` between two
                  processes, 1 MiB pieces on as many threads as the shm executor
                  (limit for same-host one-sided copies).
* ``memcpy``   -- ``memmove`` between two buffers of one process, same pieces and
                  threads (limit for shared-memory copies).
* ``mooncake`` -- Mooncake Transfer Engine (PyPI ``mooncake-transfer-engine-non-cuda``)
                  over its TCP transport, target and initiator in separate processes;
                  ``mooncake_tune`` sweeps its TCP knobs and keeps the best setting.
* ``fio``      -- the real fio on the engine's file, same byte range, I/O size and count, page-
                  aligned buffers; ``fio_tune`` sweeps its I/O engine, jobs and depth within
                  the file executor's parallelism and keeps the best setting per point.

Every baseline first checks, on its own copy path, that it moves the right bytes (the
target holds ``tent_core.testing.pattern(size, seed)``); rows carry ``verified_bytes``.

A batch is ``batch_size`` blocks of ``block_size`` bytes; its latency is the
wall time of one batch as seen by the initiator (for a socket WRITE that
includes the target's 1-byte ack, for a socket READ the 1-request round trip);
``gbps`` is bytes moved / total timed time (1e9 bytes/s).

Every buffer is page-aligned anonymous memory, written once (pre-faulted) and
reused.  Consecutive blocks walk through the buffer (block ``i`` of a point lies
at ``(i % slots) * block_size``), so small blocks are not served from a hot
cache line set.  The buffer is ``max(block*batch)`` of the sweep, capped at
``BaselineSweep.max_buffer_bytes`` (blocks then wrap around).

All processes are started with the multiprocessing "spawn" context; every wait
has a timeout and child processes are always joined/terminated, even on error.
A baseline that cannot run here raises :class:`BaselineUnavailable`; numbers are
never made up.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import ipaddress
import json
import mmap
import multiprocessing as mp
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "BASELINES",
    "BaselineError",
    "BaselineSweep",
    "BaselineUnavailable",
    "available_baselines",
    "run_baseline",
]

KiB = 1 << 10
MiB = 1 << 20

_OPS = ("READ", "WRITE")
_STARTUP_TIMEOUT_S = 60.0
# The socket target's listener: how often its accept loop looks whether the parent still waits,
# and its backlog at least (the initiator's streams may connect at once).
_ACCEPT_POLL_S = 0.2
_LISTEN_BACKLOG = 128
_SOCK_CHUNK = 4 * MiB
# SO_SNDBUF/SO_RCVBUF for the socket baseline.  None (default) keeps the kernel's
# TCP buffer autotuning (tcp_rmem/tcp_wmem max, 32 MiB / 4 MiB here): setting the
# options explicitly disables autotuning, and forcing 16 or 32 MiB measured
# slower on loopback (2.3-2.6 vs 4.5-4.8 GB/s at 64 MiB blocks).  Override with the
# environment variable TENT_BASELINE_SOCKBUF=<bytes> (applied with SO_*BUFFORCE
# when permitted, so net.core.[rw]mem_max does not cap it).
SOCKET_BUFFER_BYTES: int | None = None

# Mooncake / glog environment applied in the mooncake child processes (setdefault:
# a value already in the environment wins).
MOONCAKE_ENV = {
    "MC_FORCE_TCP": "1",
    "MC_LOG_LEVEL": "ERROR",  # mooncake resets glog's minloglevel from this
    "GLOG_minloglevel": "2",
    "MC_YLT_LOG_LEVEL": "error",
}


class BaselineUnavailable(RuntimeError):
    """The baseline cannot run on this host (missing package, library, syscall...)."""

    def __init__(self, reason: str, name: str | None = None):
        self.reason = reason
        self.name = name
        super().__init__(f"{name} baseline unavailable: {reason}" if name else reason)


class BaselineError(RuntimeError):
    """The baseline started but failed or timed out while measuring."""


@dataclass
class BaselineSweep:
    block_sizes: list[int]
    batch_sizes: list[int]
    ops: list[str]
    iters: int
    warmup: int
    host: str = "127.0.0.1"
    # Wall-time cap per (op, block, batch) point, warmup included; at least one
    # timed batch is always run.  None = run all warmup + iters batches.
    time_budget_s: float | None = None
    # Cap of each side's buffer; blocks wrap around inside it.
    max_buffer_bytes: int = 256 * MiB
    # How long the parent waits for one point's row before giving up (None = derived).
    point_timeout_s: float | None = None
    # True: consecutive batches walk through the whole buffer (cache-cold, like
    # real traffic).  False: every batch reuses offsets 0..batch_size-1 (matches
    # a benchmark that always transfers the same region; small blocks stay cached).
    walk_buffer: bool = True
    # File baselines (fio) run against this file.
    file_path: str | None = None
    # Parallelism, matched to the engine's (the CLI sets them from the engine config):
    # copy threads of cma/memcpy (the shm executor's worker threads), the piece each thread copies
    # at a time, and the TCP streams of the socket baseline (the tcp transport's connections).
    threads: int = 2
    piece_bytes: int = 1 * MiB
    streams: int = 4
    # The target's buffer holds tent_core.testing.pattern(size, seed); every baseline checks
    # that its copy path moves those bytes (and a second pattern back) before timing anything.
    seed: int = 0
    # Mooncake: extra environment for its processes (one point of its knob sweep).
    mooncake_env: dict | None = None
    # fio: I/Os in flight per job at most (the file executor's queue depth per worker), the bytes
    # each measurement moves at least (file_point_requests) and the setting per point
    # ("OP BLOCK" -> {"ioengine", "numjobs", "iodepth"}, from fio_tune).
    depth: int = 16
    min_bytes: int = 0
    fio_settings: dict | None = None

    def validate(self) -> None:
        if not self.block_sizes or any(int(b) <= 0 for b in self.block_sizes):
            raise ValueError(f"block_sizes must be positive: {self.block_sizes!r}")
        if not self.batch_sizes or any(int(b) <= 0 for b in self.batch_sizes):
            raise ValueError(f"batch_sizes must be positive: {self.batch_sizes!r}")
        bad = [op for op in self.ops if op not in _OPS]
        if not self.ops or bad:
            raise ValueError(f"ops must be a non-empty subset of {_OPS}: {self.ops!r}")
        if self.iters < 1 or self.warmup < 0:
            raise ValueError("iters must be >= 1 and warmup >= 0")
        if self.threads < 1 or self.streams < 1 or self.piece_bytes < 4096:
            raise ValueError("threads and streams must be >= 1, piece_bytes >= 4096")

    def points(self) -> list[tuple[str, int, int]]:
        return [(op, int(bs), int(n)) for op in self.ops for bs in self.block_sizes for n in self.batch_sizes]

    def buffer_bytes(self) -> int:
        need = max(int(bs) * int(n) for bs in self.block_sizes for n in self.batch_sizes)
        return max(min(need, int(self.max_buffer_bytes)), max(int(b) for b in self.block_sizes))

    def row_timeout(self) -> float:
        if self.point_timeout_s is not None:
            return float(self.point_timeout_s)
        if self.time_budget_s is not None:
            return 3.0 * self.time_budget_s + 60.0
        return 600.0


# --------------------------------------------------------------------------- helpers


def _prefaulted(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """Page-aligned anonymous buffer with every page written once."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arr = np.frombuffer(m, dtype=np.uint8)
    arr.fill(0xA5)
    return m, arr


def _addr(arr: np.ndarray) -> int:
    return int(arr.ctypes.data)


def _pattern(n: int, seed: int) -> np.ndarray:
    from tent_core.testing import pattern

    return pattern(n, seed)


class _Team:
    """`n` threads, the caller being one of them, each running its share of a batch.

    The calls they make (process_vm_*, memmove, socket I/O) release the GIL, so the shares
    really run in parallel, like the engine's executor threads."""

    def __init__(self, n: int):
        import queue
        import threading

        self.n = n
        self._jobs: list = [queue.SimpleQueue() for _ in range(n - 1)]
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._loop, args=(q,), daemon=True) for q in self._jobs]
        for t in self._threads:
            t.start()

    def _loop(self, q) -> None:
        while True:
            fn = q.get()
            if fn is None:
                return
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to run()
                self._done.put(e)
            else:
                self._done.put(None)

    def run(self, shares: list[Callable[[], None]]) -> None:
        if len(shares) > self.n:
            raise ValueError("more shares than threads")
        for q, fn in zip(self._jobs, shares[1:], strict=False):
            q.put(fn)
        err: BaseException | None = None
        try:
            if shares:
                shares[0]()
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the others finished
            err = e
        for _ in shares[1:]:
            e = self._done.get(timeout=_STARTUP_TIMEOUT_S * 5)
            err = err or e
        if err is not None:
            raise err

    def close(self) -> None:
        for q in self._jobs:
            q.put(None)
        for t in self._threads:
            t.join(timeout=5)


def _pieces(offsets: list[int], block: int, piece: int) -> list[tuple[int, int]]:
    """(offset, length) of every piece of `piece` bytes of the blocks at `offsets`."""
    return [(off + p, min(piece, block - p)) for off in offsets for p in range(0, block, piece)]


def _shares(items: list, n: int) -> list[list]:
    """`items` dealt into at most `n` contiguous, near-equal shares (none empty)."""
    n = max(1, min(n, len(items)))
    k, extra = divmod(len(items), n)
    out, i = [], 0
    for j in range(n):
        m = k + (1 if j < extra else 0)
        out.append(items[i : i + m])
        i += m
    return out


def _check_bytes(name: str, got: np.ndarray, expect: np.ndarray, what: str) -> None:
    if not np.array_equal(got, expect):
        bad = int(np.flatnonzero(got != expect)[0])
        raise BaselineError(f"{name}: {what} moved wrong bytes (first bad byte at {bad})")


def _verify_path(name: str, buf: np.ndarray, seed: int, read_all: Callable[[], None], write_all: Callable[[], None]) -> int:
    """READ the target's pattern into `buf`, WRITE a second pattern, READ it back: both checked.
    The target keeps the second pattern (timed runs only move bytes). Returns the bytes checked."""
    n = len(buf)
    buf.fill(0)
    read_all()
    _check_bytes(name, buf, _pattern(n, seed), "READ")
    second = _pattern(n, seed + 1)
    buf[:] = second
    write_all()
    buf.fill(0)
    read_all()
    _check_bytes(name, buf, second, "WRITE then READ")
    return 3 * n


class _Slots:
    """Offsets of the blocks of consecutive batches inside a buffer."""

    def __init__(self, buf_bytes: int, block: int, walk: bool = True):
        self.block = block
        self.n = max(1, buf_bytes // block)
        self.i = 0
        self.walk = walk

    def batch(self, count: int) -> list[int]:
        """Offsets of the next batch: walking through the buffer, or always from 0."""
        start = self.i if self.walk else 0
        self.i = start + count
        return [((start + j) % self.n) * self.block for j in range(count)]


def _measure(engine: str, transport: str, op: str, block: int, batch: int, sweep: BaselineSweep, run_batch,
             verified: int = 0, parallel: int = 1) -> dict:  # fmt: skip
    deadline = None if sweep.time_budget_s is None else time.perf_counter() + sweep.time_budget_s
    for _ in range(sweep.warmup):
        if deadline is not None and time.perf_counter() >= deadline:
            break
        run_batch()
    lat: list[float] = []
    for _ in range(sweep.iters):
        t0 = time.perf_counter()
        run_batch()
        lat.append(time.perf_counter() - t0)
        if deadline is not None and time.perf_counter() >= deadline:
            break
    arr = np.asarray(lat, dtype=np.float64)
    total = float(arr.sum())
    nbytes = block * batch * len(lat)
    return {
        "engine": engine,
        "transport": transport,
        "op": op,
        "block_size": block,
        "batch_size": batch,
        "gbps": nbytes / total / 1e9 if total > 0 else float("inf"),
        "avg_us": float(arr.mean()) * 1e6,
        "p50_us": float(np.percentile(arr, 50)) * 1e6,
        "p99_us": float(np.percentile(arr, 99)) * 1e6,
        "iters": len(lat),
        "parallel": parallel,  # threads (cma, memcpy) or streams (socket) moving each batch
        "verified_bytes": verified,
    }


def _wait_parent_stop(conn, parent_pid: int) -> None:
    """Target side: block until the parent says stop, closes the pipe, or dies."""
    while True:
        try:
            if conn.poll(0.5):
                conn.recv()
                return
        except (EOFError, OSError):
            return
        if os.getppid() != parent_pid:
            return


def _child_entry(role: str, conn, sweep: BaselineSweep, info: dict | None, log_path: str | None, env: dict | None):
    """Entry point of every spawned child: run ``_ROLES[role]`` and report errors."""
    if env:
        for k, v in env.items():
            os.environ.setdefault(k, v)
    for k, v in (sweep.mooncake_env or {}).items() if role.startswith("mooncake") else ():
        os.environ[k] = str(v)  # the knob setting under test wins over the environment
    if log_path:  # keep native log noise (glog) out of the parent's terminal
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    try:
        _ROLES[role](conn, sweep, info or {})
    except BaselineUnavailable as e:
        _safe_send(conn, ("unavailable", e.reason))
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        _safe_send(conn, ("error", f"{role}: {type(e).__name__}: {e}\n{traceback.format_exc()}"))
    finally:
        try:
            conn.close()
        except OSError:
            pass


def _safe_send(conn, msg) -> None:
    try:
        conn.send(msg)
    except (OSError, EOFError, BrokenPipeError):
        pass


def _log_tail(log_path: str | None, n: int = 15) -> str:
    if not log_path:
        return ""
    try:
        with open(log_path, errors="replace") as f:
            lines = f.read().splitlines()[-n:]
    except OSError:
        return ""
    return ("\n--- child log tail ---\n" + "\n".join(lines)) if lines else ""


def _recv(conn, proc, timeout: float, what: str, name: str, log_path: str | None):
    """Receive one message from a child, with a timeout and dead-child detection."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ready = conn.poll(0.2)
        except (EOFError, OSError):
            ready = True
        if ready:
            try:
                msg = conn.recv()
            except (EOFError, OSError) as e:
                raise BaselineError(
                    f"{name}: {what}: child closed the pipe (exit code {proc.exitcode})" + _log_tail(log_path)
                ) from e
            kind = msg[0]
            if kind == "unavailable":
                raise BaselineUnavailable(msg[1], name)
            if kind == "error":
                raise BaselineError(f"{name}: {msg[1]}" + _log_tail(log_path))
            return msg
        if not proc.is_alive():
            # drain a message that raced with the exit
            if conn.poll(0):
                continue
            raise BaselineError(f"{name}: {what}: child exited with code {proc.exitcode}" + _log_tail(log_path))
        if time.monotonic() > deadline:
            raise BaselineError(f"{name}: {what}: timed out after {timeout:.0f}s" + _log_tail(log_path))


def _target_error(t_conn) -> str | None:
    """An error the target child sent while nobody read its pipe (the parent reads the initiator's)."""
    if t_conn is None:
        return None
    try:
        if t_conn.poll(0):
            msg = t_conn.recv()
            if msg and msg[0] in ("error", "unavailable"):
                return str(msg[1])
    except (EOFError, OSError):
        pass
    return None


def _stop_procs(procs) -> None:
    for p in procs:
        p.join(timeout=5)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=3)
        if p.is_alive():
            p.kill()
            p.join(timeout=3)


def _run_procs(
    name: str,
    sweep: BaselineSweep,
    initiator_role: str,
    target_role: str | None = None,
    env: dict | None = None,
    capture_log: bool = False,
) -> list[dict]:
    """Spawn (target +) initiator children, collect the initiator's rows."""
    sweep.validate()
    ctx = mp.get_context("spawn")
    procs: list = []
    pipes: list = []
    log_path = None
    if capture_log:
        fd, log_path = tempfile.mkstemp(prefix=f"tent-baseline-{name}-", suffix=".log")
        os.close(fd)
    try:
        info: dict = {"parent_pid": os.getpid()}
        t_conn = t_proc = None
        if target_role is not None:
            t_conn, child_end = ctx.Pipe()
            pipes.append(t_conn)
            t_proc = ctx.Process(
                target=_child_entry,
                args=(target_role, child_end, sweep, {"parent_pid": os.getpid()}, log_path, env),
                name=f"tent-baseline-{name}-target",
                daemon=True,
            )
            t_proc.start()
            procs.append(t_proc)
            child_end.close()
            msg = _recv(t_conn, t_proc, _STARTUP_TIMEOUT_S, "waiting for target", name, log_path)
            if msg[0] != "ready":
                raise BaselineError(f"{name}: unexpected message from target: {msg!r}")
            info.update(msg[1])
        i_conn, child_end = ctx.Pipe()
        pipes.append(i_conn)
        i_proc = ctx.Process(
            target=_child_entry,
            args=(initiator_role, child_end, sweep, info, log_path, env),
            name=f"tent-baseline-{name}-initiator",
            daemon=True,
        )
        i_proc.start()
        procs.append(i_proc)
        child_end.close()
        rows: list[dict] = []
        n_points = len(sweep.points())
        timeout = _STARTUP_TIMEOUT_S + sweep.row_timeout()  # first row includes start-up
        while True:
            try:
                msg = _recv(i_conn, i_proc, timeout, f"point {len(rows) + 1}/{n_points}", name, log_path)
            except BaselineError as e:  # the target's own failure, if it had one, is the cause to report
                why = _target_error(t_conn)
                if why:
                    raise BaselineError(f"{e}\n(the target failed first: {why})") from e
                raise
            timeout = sweep.row_timeout()
            if msg[0] == "row":
                rows.append(msg[1])
            elif msg[0] == "done":
                break
            else:
                raise BaselineError(f"{name}: unexpected message from initiator: {msg!r}")
        if t_conn is not None:
            _safe_send(t_conn, ("stop",))
        return rows
    finally:
        for c in pipes:
            _safe_send(c, ("stop",))
        _stop_procs(procs)
        for c in pipes:
            try:
                c.close()
            except OSError:
                pass
        if log_path:  # private (mkstemp); its tail is in the error message when the baseline failed
            try:
                os.unlink(log_path)
            except OSError:
                pass


# --------------------------------------------------------------------------- socket

# command (b"W" / b"R" / b"Q"), offset, length, padded to 64 bytes: a WRITE's payload follows its
# header in the kernel's socket buffer pages, and 17 bytes put a page-aligned payload 17 bytes ahead
# of its source (mod 4 KiB), where the kernel's copy runs 2-3x slower (4K aliasing;
# plugins/tcp/tools/copy_alias.py): a baseline slowed by an accident of its framing is no limit.
_SOCK_HDR = struct.Struct("<c7xQQ40x")
_MSG_MORE = getattr(socket, "MSG_MORE", 0)


def _socket_buffer_bytes() -> int | None:
    env = os.environ.get("TENT_BASELINE_SOCKBUF")
    if env:
        return int(env)
    return SOCKET_BUFFER_BYTES


def _tune_socket(s: socket.socket) -> None:
    size = _socket_buffer_bytes()
    if size:
        for opt, force in ((socket.SO_SNDBUF, 32), (socket.SO_RCVBUF, 33)):  # SO_*BUFFORCE
            try:
                s.setsockopt(socket.SOL_SOCKET, force, size)
            except OSError:
                try:
                    s.setsockopt(socket.SOL_SOCKET, opt, size)
                except OSError:
                    pass
    if s.family in (socket.AF_INET, socket.AF_INET6):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _loopback_congestion(s)


def _loopback_congestion(s: socket.socket) -> None:
    """A connected stream to a loopback peer takes the congestion control the tcp transport gives its
    own loopback connections (its loopback_congestion default: the first name the kernel accepts),
    so the baseline is not paced by a host default (BBR) the engine avoids there."""
    try:
        host = s.getpeername()[0]
    except OSError:
        return  # not connected (the listener): its accepted streams are set one by one
    if not ipaddress.ip_address(host).is_loopback:
        return
    try:
        from tent_tcp.transport import TcpTransport
    except ImportError:
        return  # no tcp transport here: nothing to match
    for name in str(TcpTransport.config_keys["loopback_congestion"] or "").split(","):
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
            return
        except OSError:
            continue


def _recv_exact_into(s: socket.socket, mv: memoryview) -> None:
    got, n = 0, len(mv)
    while got < n:
        k = s.recv_into(mv[got : min(n, got + _SOCK_CHUNK)])
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k


def _socket_io_timeout(sweep: BaselineSweep) -> float:
    return max(30.0, sweep.row_timeout())


def _socket_serve(s: socket.socket, mv: memoryview) -> None:
    """One stream of the target: W = receive into [off, off+len) then ack, R = send it, Q = quit."""
    hdr = bytearray(_SOCK_HDR.size)
    while True:
        _recv_exact_into(s, memoryview(hdr))
        cmd, off, n = _SOCK_HDR.unpack(hdr)
        if cmd == b"Q":
            return
        if off + n > len(mv):
            raise BaselineError(f"socket target: [{off}, {off + n}) outside the buffer")
        if cmd == b"W":
            _recv_exact_into(s, mv[off : off + n])
            s.sendall(b"A")
        elif cmd == b"R":
            s.sendall(mv[off : off + n])
        else:
            raise BaselineError(f"socket target: bad command {cmd!r}")


def _parent_gone(conn, parent_pid: int | None) -> bool:
    """The parent stopped waiting for us: it said stop, closed the pipe, or died."""
    try:
        if conn.poll(0):
            return True
    except (EOFError, OSError):
        return True
    return parent_pid is not None and os.getppid() != parent_pid


def _accept_streams(ls: socket.socket, n: int, conn, parent_pid: int | None, sweep: BaselineSweep) -> list[socket.socket]:
    """Accept the initiator's n streams. The parent starts the initiator only after our "ready" (a
    spawned interpreter: imports, a prefaulted buffer, then its connects), so however long that
    takes on a loaded host, the listener stays open until all n arrived or the parent gave up (its
    own deadlines bound this wait). A fixed accept deadline here used to close the listener first,
    and the initiator's connect got ECONNREFUSED."""
    streams: list[socket.socket] = []
    ls.settimeout(_ACCEPT_POLL_S)
    try:
        while len(streams) < n:
            try:
                s, _ = ls.accept()
            except TimeoutError:
                if _parent_gone(conn, parent_pid):
                    raise BaselineError(f"socket target: the parent stopped waiting after {len(streams)} of {n} "
                                        "streams connected") from None  # fmt: skip
                continue
            streams.append(s)
            _tune_socket(s)
            s.settimeout(_socket_io_timeout(sweep))
    except BaseException:
        for s in streams:
            s.close()
        raise
    return streams


def _socket_target(conn, sweep: BaselineSweep, info: dict) -> None:
    import threading

    _m, buf = _prefaulted(sweep.buffer_bytes())
    buf[:] = _pattern(len(buf), sweep.seed)
    mv = memoryview(buf)
    fam = socket.AF_INET6 if ":" in sweep.host else socket.AF_INET
    ls = socket.socket(fam, socket.SOCK_STREAM)
    try:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _tune_socket(ls)
        ls.bind((sweep.host, 0))
        # room for every stream at once: connects beyond the backlog wait for a SYN retransmission (1 s+)
        ls.listen(max(sweep.streams, _LISTEN_BACKLOG))
        conn.send(("ready", {"port": ls.getsockname()[1]}))
        streams = _accept_streams(ls, sweep.streams, conn, info.get("parent_pid"), sweep)
    finally:
        ls.close()
    errors: list[BaseException] = []

    def serve(s: socket.socket) -> None:
        try:
            _socket_serve(s, mv)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=serve, args=(s,), daemon=True) for s in streams]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for s in streams:
        s.close()
    if errors:
        raise errors[0]


def _socket_initiator(conn, sweep: BaselineSweep, info: dict) -> None:
    _m, buf = _prefaulted(sweep.buffer_bytes())
    mv = memoryview(buf)
    streams = []
    for _ in range(sweep.streams):
        s = socket.create_connection((sweep.host, info["port"]), timeout=_STARTUP_TIMEOUT_S)
        _tune_socket(s)
        s.settimeout(_socket_io_timeout(sweep))
        streams.append(s)
    team = _Team(len(streams))

    def write_share(s: socket.socket, parts: list[tuple[int, int]]) -> None:
        for off, n in parts:  # pipelined: every piece sent, then every ack read
            s.sendall(_SOCK_HDR.pack(b"W", off, n), _MSG_MORE)
            s.sendall(mv[off : off + n])
        acks = bytearray(len(parts))
        _recv_exact_into(s, memoryview(acks))

    def read_share(s: socket.socket, parts: list[tuple[int, int]]) -> None:
        s.sendall(b"".join(_SOCK_HDR.pack(b"R", off, n) for off, n in parts))
        for off, n in parts:
            _recv_exact_into(s, mv[off : off + n])

    def move(op: str, offsets: list[int], block: int) -> None:
        # each block cut into one piece per stream (as the engine slices a request over its connections)
        piece = max(4096, -(-block // len(streams)))
        parts = _pieces(offsets, block, piece)
        per_stream: list[list[tuple[int, int]]] = [parts[k :: len(streams)] for k in range(len(streams))]
        fn = write_share if op == "WRITE" else read_share
        team.run([lambda s=s, p=p: fn(s, p) for s, p in zip(streams, per_stream, strict=True) if p])

    try:
        size = len(buf)
        verified = _verify_path("socket", buf, sweep.seed, lambda: move("READ", [0], size), lambda: move("WRITE", [0], size))
        for op, block, batch in sweep.points():
            slots = _Slots(len(buf), block, sweep.walk_buffer)

            def run(op=op, slots=slots, block=block, batch=batch):
                move(op, slots.batch(batch), block)

            conn.send(("row", _measure("socket", "tcp", op, block, batch, sweep, run, verified, len(streams))))
        for s in streams:
            s.sendall(_SOCK_HDR.pack(b"Q", 0, 0))
    finally:
        team.close()
        for s in streams:
            s.close()
    conn.send(("done",))


def socket_baseline(sweep: BaselineSweep) -> list[dict]:
    """Plain TCP streams between two processes (the TCP physical limit): `sweep.streams`
    connections, each block cut into one piece per connection, each connection driven by its own
    thread on both sides (the engine's tcp transport slices a request over its connections)."""
    return _run_procs("socket", sweep, "socket_initiator", "socket_target")


# --------------------------------------------------------------------------- cma


class _IOVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc_cma():
    if not sys.platform.startswith("linux"):
        raise BaselineUnavailable("process_vm_readv/writev need Linux", "cma")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fns = []
    for fname in ("process_vm_readv", "process_vm_writev"):
        try:
            fn = getattr(libc, fname)
        except AttributeError as e:
            raise BaselineUnavailable(f"libc has no {fname}", "cma") from e
        fn.argtypes = [
            ctypes.c_int,
            ctypes.POINTER(_IOVec),
            ctypes.c_ulong,
            ctypes.POINTER(_IOVec),
            ctypes.c_ulong,
            ctypes.c_ulong,
        ]
        fn.restype = ctypes.c_ssize_t
        fns.append(fn)
    return libc, fns[0], fns[1]


def _cma_unavailable_reason() -> str | None:
    try:
        _libc, readv, _writev = _libc_cma()
    except BaselineUnavailable as e:
        return e.reason
    except OSError as e:
        return f"cannot load libc: {e}"
    src = ctypes.create_string_buffer(b"tent-cma", 8)
    dst = ctypes.create_string_buffer(8)
    lio = _IOVec(ctypes.cast(dst, ctypes.c_void_p), 8)
    rio = _IOVec(ctypes.cast(src, ctypes.c_void_p), 8)
    n = readv(os.getpid(), ctypes.byref(lio), 1, ctypes.byref(rio), 1, 0)
    if n != 8:
        err = ctypes.get_errno()
        return f"process_vm_readv failed: {os.strerror(err)} (errno {err}; seccomp/ptrace policy?)"
    return None


def _cma_target(conn, sweep: BaselineSweep, info: dict) -> None:
    _m, buf = _prefaulted(sweep.buffer_bytes())
    buf[:] = _pattern(len(buf), sweep.seed)
    try:  # allow a non-ancestor to process_vm_*() us under Yama ptrace_scope=1
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)  # PR_SET_PTRACER, ANY
    except (OSError, AttributeError):
        pass
    conn.send(("ready", {"pid": os.getpid(), "addr": _addr(buf), "size": len(buf)}))
    _wait_parent_stop(conn, info["parent_pid"])


def _cma_initiator(conn, sweep: BaselineSweep, info: dict) -> None:
    _libc, readv, writev = _libc_cma()
    _m, buf = _prefaulted(sweep.buffer_bytes())
    pid, raddr, size = info["pid"], info["addr"], info["size"]
    laddr = _addr(buf)
    size = min(size, len(buf))

    def copy_share(fn, parts: list[tuple[int, int]]) -> None:
        lio, rio = _IOVec(), _IOVec()  # per thread
        plio, prio = ctypes.byref(lio), ctypes.byref(rio)
        for off, n in parts:
            done = 0
            while done < n:
                lio.iov_base, lio.iov_len = laddr + off + done, n - done
                rio.iov_base, rio.iov_len = raddr + off + done, n - done
                k = fn(pid, plio, 1, prio, 1, 0)
                if k <= 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"{fn.__name__}: {os.strerror(err)}")
                done += k

    team = _Team(sweep.threads)

    def move(fn, offsets: list[int], block: int) -> None:
        parts = _pieces(offsets, block, sweep.piece_bytes)
        team.run([lambda p=p: copy_share(fn, p) for p in _shares(parts, sweep.threads)])

    try:
        verified = _verify_path("cma", buf[:size], sweep.seed, lambda: move(readv, [0], size), lambda: move(writev, [0], size))
        for op, block, batch in sweep.points():
            slots = _Slots(size, block, sweep.walk_buffer)
            fn = readv if op == "READ" else writev

            def run(fn=fn, slots=slots, block=block, batch=batch):
                move(fn, slots.batch(batch), block)

            conn.send(("row", _measure("cma", "cma", op, block, batch, sweep, run, verified, sweep.threads)))
    finally:
        team.close()
    conn.send(("done",))


def cma_baseline(sweep: BaselineSweep) -> list[dict]:
    """Bare process_vm_readv (READ) / process_vm_writev (WRITE) between two processes: each block cut
    into `sweep.piece_bytes` pieces copied by `sweep.threads` threads (the shm executor's shape)."""
    reason = _cma_unavailable_reason()
    if reason is not None:
        raise BaselineUnavailable(reason, "cma")
    return _run_procs("cma", sweep, "cma_initiator", "cma_target")


# --------------------------------------------------------------------------- memcpy


def _memcpy_initiator(conn, sweep: BaselineSweep, info: dict) -> None:
    nbytes = sweep.buffer_bytes()
    _ml, local = _prefaulted(nbytes)
    _mr, remote = _prefaulted(nbytes)
    remote[:] = _pattern(nbytes, sweep.seed)
    team = _Team(sweep.threads)

    def move(src: np.ndarray, dst: np.ndarray, offsets: list[int], block: int) -> None:
        s0, d0 = _addr(src), _addr(dst)
        parts = _pieces(offsets, block, sweep.piece_bytes)

        def share(p: list[tuple[int, int]]) -> None:
            for off, n in p:
                ctypes.memmove(d0 + off, s0 + off, n)  # a ctypes call: the GIL is released

        team.run([lambda p=p: share(p) for p in _shares(parts, sweep.threads)])

    try:
        verified = _verify_path("memcpy", local, sweep.seed, lambda: move(remote, local, [0], nbytes),
                                lambda: move(local, remote, [0], nbytes))  # fmt: skip
        for op, block, batch in sweep.points():
            slots = _Slots(nbytes, block, sweep.walk_buffer)
            src, dst = (remote, local) if op == "READ" else (local, remote)

            def run(src=src, dst=dst, slots=slots, block=block, batch=batch):
                move(src, dst, slots.batch(batch), block)

            conn.send(("row", _measure("memcpy", "memcpy", op, block, batch, sweep, run, verified, sweep.threads)))
    finally:
        team.close()
    conn.send(("done",))


def memcpy_baseline(sweep: BaselineSweep) -> list[dict]:
    """memmove between two pre-faulted buffers of one (child) process, each block cut into
    `sweep.piece_bytes` pieces copied by `sweep.threads` threads."""
    return _run_procs("memcpy", sweep, "memcpy_initiator")


# --------------------------------------------------------------------------- mooncake

_MOONCAKE_PIP = "mooncake-transfer-engine-non-cuda"
_mooncake_reason_cache: list = []


def _mooncake_unavailable_reason(refresh: bool = False) -> str | None:
    """Checked in a subprocess so the parent never loads mooncake's native libs."""
    if _mooncake_reason_cache and not refresh:
        return _mooncake_reason_cache[0]
    reason: str | None
    if importlib.util.find_spec("mooncake") is None:
        reason = f"python package 'mooncake' not installed (pip install {_MOONCAKE_PIP})"
    else:
        try:
            p = subprocess.run(
                [sys.executable, "-c", "from mooncake.engine import TransferEngine"],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, **{k: v for k, v in MOONCAKE_ENV.items() if k not in os.environ}},
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            reason = f"importing mooncake.engine failed: {e}"
        else:
            if p.returncode == 0:
                reason = None
            else:
                lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
                last = lines[-1] if lines else f"exit code {p.returncode}"
                reason = f"importing mooncake.engine failed: {last}"
                if "libibverbs" in last:
                    reason += " (install the system package libibverbs1, e.g. apt-get install libibverbs1)"
    _mooncake_reason_cache[:] = [reason]
    return reason


def _mooncake_engine(host: str):
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        raise BaselineUnavailable(f"importing mooncake.engine failed: {e}", "mooncake") from e
    te = TransferEngine()
    rc = te.initialize(host, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise BaselineError(f"TransferEngine.initialize({host!r}, 'P2PHANDSHAKE', 'tcp', '') returned {rc}")
    return te


def _mooncake_register(te, buf: np.ndarray) -> int:
    addr = _addr(buf)
    rc = te.register_memory(addr, len(buf))
    if rc != 0:
        raise BaselineError(f"TransferEngine.register_memory returned {rc}")
    return addr


def _mooncake_target(conn, sweep: BaselineSweep, info: dict) -> None:
    te = _mooncake_engine(sweep.host)
    _m, buf = _prefaulted(sweep.buffer_bytes())
    buf[:] = _pattern(len(buf), sweep.seed)
    addr = _mooncake_register(te, buf)
    host = f"[{sweep.host}]" if ":" in sweep.host else sweep.host
    conn.send(("ready", {"segment": f"{host}:{te.get_rpc_port()}", "addr": addr, "size": len(buf)}))
    _wait_parent_stop(conn, info["parent_pid"])
    te.unregister_memory(addr)
    del te


def _mooncake_initiator(conn, sweep: BaselineSweep, info: dict) -> None:
    te = _mooncake_engine(sweep.host)
    _m, buf = _prefaulted(sweep.buffer_bytes())
    laddr = _mooncake_register(te, buf)
    seg, raddr = info["segment"], info["addr"]
    size = min(info["size"], len(buf))
    # open the segment (P2P handshake + TCP connect) outside of any timing
    rc = te.transfer_sync_read(seg, laddr, raddr, min(4096, size))
    if rc != 0:
        raise BaselineError(f"transfer_sync_read to {seg} returned {rc} (handshake)")

    def whole(fn) -> None:
        rc = fn(seg, laddr, raddr, size)
        if rc != 0:
            raise BaselineError(f"{fn.__name__} of {size} bytes returned {rc}")

    verified = _verify_path("mooncake", buf[:size], sweep.seed, lambda: whole(te.transfer_sync_read),
                            lambda: whole(te.transfer_sync_write))  # fmt: skip
    for op, block, batch in sweep.points():
        slots = _Slots(size, block, sweep.walk_buffer)
        if batch == 1:
            fn = te.transfer_sync_read if op == "READ" else te.transfer_sync_write

            def run(fn=fn, slots=slots, block=block):
                (off,) = slots.batch(1)
                rc = fn(seg, laddr + off, raddr + off, block)
                if rc != 0:
                    raise BaselineError(f"{fn.__name__} returned {rc}")

        else:
            fn = te.batch_transfer_sync_read if op == "READ" else te.batch_transfer_sync_write
            lengths = [block] * batch

            def run(fn=fn, slots=slots, batch=batch, lengths=lengths):
                offs = slots.batch(batch)
                rc = fn(seg, [laddr + o for o in offs], [raddr + o for o in offs], lengths)
                if rc != 0:
                    raise BaselineError(f"{fn.__name__} returned {rc}")

        row = _measure("mooncake", "tcp", op, block, batch, sweep, run, verified)
        row["parallel"] = None  # Mooncake's own (its lanes: see mooncake_env)
        row["mooncake_env"] = dict(sweep.mooncake_env or {})
        conn.send(("row", row))
    conn.send(("done",))
    te.unregister_memory(laddr)


def mooncake_baseline(sweep: BaselineSweep) -> list[dict]:
    """Mooncake Transfer Engine (TCP transport, P2P handshake) between two processes."""
    reason = _mooncake_unavailable_reason()
    if reason is not None:
        raise BaselineUnavailable(reason, "mooncake")
    return _run_procs("mooncake", sweep, "mooncake_initiator", "mooncake_target", env=MOONCAKE_ENV, capture_log=True)


# Mooncake's TCP knobs (names from its 0.3.13 library): lanes (connections) per peer, the slice
# each lane carries, the connection pool. The sweep runs every setting and keeps the best.
MOONCAKE_KNOBS: list[dict[str, str]] = [
    {},
    {"MC_TCP_ENABLE_CONNECTION_POOL": "1", "MC_TCP_LANES_PER_PEER": "4"},
    {"MC_TCP_ENABLE_CONNECTION_POOL": "1", "MC_TCP_LANES_PER_PEER": "4", "MC_TCP_SLICE_SIZE": str(1 * MiB)},
    {"MC_TCP_ENABLE_CONNECTION_POOL": "1", "MC_TCP_LANES_PER_PEER": "8", "MC_TCP_SLICE_SIZE": str(1 * MiB)},
]


def knob_score(gbps: Sequence[float]) -> float:
    """How a knob setting ranks in a sweep: the geometric mean GB/s over its points (every point
    counts alike, small blocks as much as large ones)."""
    if not gbps:
        raise ValueError("no points")
    return float(np.exp(np.mean([np.log(max(float(g), 1e-9)) for g in gbps])))


def mooncake_tune(sweep: BaselineSweep, knobs: list[dict[str, str]] | None = None) -> tuple[dict[str, str], list[dict]]:
    """Run the sweep once under every knob setting; return the setting with the best geometric
    mean GB/s over the sweep's points, and every row (each with its `mooncake_env`)."""
    from dataclasses import replace

    best: tuple[float, dict[str, str]] | None = None
    rows: list[dict] = []
    errors: list[str] = []
    for env in knobs if knobs is not None else MOONCAKE_KNOBS:
        try:
            got = mooncake_baseline(replace(sweep, mooncake_env=env))
        except BaselineError as e:  # a setting this build rejects is not the best one
            errors.append(f"{env}: {e}")
            continue
        rows += got
        score = knob_score([r["gbps"] for r in got])
        if best is None or score > best[0]:
            best = (score, env)
    if best is None:
        raise BaselineError("mooncake: no knob setting ran: " + "; ".join(errors))
    return best[1], rows


# --------------------------------------------------------------------------- registry

_ROLES: dict[str, Callable] = {
    "socket_target": _socket_target,
    "socket_initiator": _socket_initiator,
    "cma_target": _cma_target,
    "cma_initiator": _cma_initiator,
    "memcpy_initiator": _memcpy_initiator,
    "mooncake_target": _mooncake_target,
    "mooncake_initiator": _mooncake_initiator,
}

# fio's I/O engines swept for the file baseline: sync pread/pwrite, io_uring and libaio (buffered
# libaio submits synchronously, but it is fio's classic choice and costs little to try).
FIO_ENGINES = ("psync", "io_uring", "libaio")
FIO_DEPTHS = (1, 4, 16)
FIO_DEFAULT = {"ioengine": "psync", "numjobs": 1, "iodepth": 1}  # where no tuned setting is given


def file_point_requests(iters: int, min_bytes: int, block: int, batch: int = 1, threads: int = 1) -> int:
    """How many requests one file measurement makes (ours and fio's alike): at least `iters`, and
    enough for `min_bytes` in all, so that every measurement runs long enough to be timed (40
    requests of 1 MiB are a few milliseconds, shorter than fio's start-up)."""
    per = max(1, int(block) * int(batch) * int(threads))
    return max(int(iters), -(-int(min_bytes) // per))


def fio_settings(block: int, piece: int = 1 * MiB, threads: int = 2, depth: int = 16) -> list[dict]:
    """fio settings within the engine's parallelism for one request of `block` bytes: at most
    `threads` jobs, at most `depth` I/Os in flight per job, never more I/Os in flight than the
    request has pieces of `piece` bytes; each I/O of block / (jobs x depth) bytes (never smaller
    than the engine's pieces), so that fio's buffers add up to the request: like the engine, fio
    moves the block into (or out of) `block` bytes of memory. (fio's buffers are one I/O size per
    I/O in flight: with 1 MiB I/Os at depth 1, fio would read a 64 MiB block into the same
    cache-resident 1 MiB over and over, a copy no application reading a 64 MiB block makes; at
    64 MiB that was 1.4x faster than reading into 64 MiB here, measured with a bare pread loop.)
    psync runs one I/O per job."""
    unit = min(int(block), int(piece))
    pieces = max(1, int(block) // unit)
    out = []
    for engine in FIO_ENGINES:
        for jobs in sorted({j for j in (1, 2, threads) if 1 <= j <= min(threads, pieces)}):
            for d in [1] if engine == "psync" else [d for d in FIO_DEPTHS if d <= depth]:
                bs = int(block) // (jobs * d)
                if jobs * d <= pieces and bs >= unit and bs * jobs * d == int(block) and bs % 4096 == 0:
                    out.append({"ioengine": engine, "numjobs": jobs, "iodepth": d})
    return out


def fio_command(fio: str, path: str, op: str, block: int, requests: int, setting: dict | None = None) -> list[str]:
    """fio moving the bytes the engine's point moves: `requests` times the range [0, block) of the
    same file, buffered, the range split between `numjobs` jobs, each with `iodepth` I/Os in
    flight, of block / (numjobs x iodepth) bytes each (`fio_settings`: fio's buffers add up to the
    block, like the engine's memory). Default: psync, one job, one I/O of the whole block.

    fio's buffers are page-aligned (--iomem_align=4096), like the engine's: by default fio takes
    them from malloc, which returns addresses 16 bytes past a page boundary, and the kernel's copy
    into such a destination (a buffered READ) runs an order of magnitude slower on this machine
    (measured: 1.0 vs 13.8 GB/s for 1 MiB pread into page+16 vs page+0), which made fio's buffered
    READs look 4x slower than its WRITEs."""
    setting = setting or FIO_DEFAULT
    jobs, depth = max(1, int(setting["numjobs"])), max(1, int(setting["iodepth"]))
    per_job = int(block) // jobs
    bs = max(4096, per_job // depth)
    return [
        fio, "--name=tent-baseline", f"--filename={path}", f"--ioengine={setting['ioengine']}",
        f"--rw={'read' if op == 'READ' else 'write'}", f"--bs={bs}", f"--size={per_job}",
        f"--offset_increment={per_job}", f"--io_size={per_job * int(requests)}", f"--numjobs={jobs}",
        f"--iodepth={depth}", "--direct=0", "--thread", "--group_reporting", "--invalidate=0",
        "--iomem_align=4096", "--output-format=json",
    ]  # fmt: skip


def fio_span(job_logs: list[list[str]]) -> tuple[float, float]:
    """(seconds from the first I/O's start to the last I/O's end over all jobs, seconds between
    the first and the last job's first I/O) from fio's per-job latency logs written with
    `--write_lat_log` and `--log_unix_epoch=1` (lines "end ms since the epoch, latency ns, ...").

    fio's own rate for several jobs divides their bytes by the longest job's runtime, and each job's
    clock starts when that job starts: a job that starts late (its buffers still being filled, or no
    core free for it) leaves a stretch where one job ran alone that no job's runtime covers, and the
    rate comes out higher than the bytes over the time they took (measured here under load: jobs
    started up to 0.44 s apart in a 3.5 s run, 1.36 GB/s reported for 1.22 GB/s moved). The
    engine's rate is its bytes over the wall time from its first submit to its last completion;
    this is fio's over the same span."""
    starts, ends = [], []
    for lines in job_logs:
        rows = [ln.split(",") for ln in lines if ln.strip()]
        if not rows:
            raise BaselineError("fio wrote an empty latency log")
        starts.append(min(int(r[0]) - int(r[1]) / 1e6 for r in rows))
        ends.append(max(int(r[0]) for r in rows))
    if not starts:
        raise BaselineError("fio wrote no latency log")
    return max((max(ends) - min(starts)) / 1e3, 1e-3), (max(starts) - min(starts)) / 1e3


def _fio_run(fio: str, path: str, op: str, block: int, requests: int, setting: dict | None,
             extra: tuple[str, ...] = (), prefix: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """One fio run (`fio_command` plus `extra` options, under the `prefix` command, e.g. chrt);
    its rate is its bytes over the span of its I/Os (`fio_span`), fio's own figure kept beside."""
    setting = setting or FIO_DEFAULT
    cmd = fio_command(fio, path, op, block, requests, setting)
    logs = tempfile.mkdtemp(prefix="tent-fio-logs-")
    try:
        full = [*prefix, *cmd, *extra, f"--write_lat_log={os.path.join(logs, 'io')}", "--log_unix_epoch=1"]
        try:
            ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run(full, capture_output=True, text=True, timeout=300)
            ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        except subprocess.TimeoutExpired as exc:
            raise BaselineError(f"fio ({setting}) did not finish in 300 s") from exc
        if out.returncode != 0:
            raise BaselineError(f"fio ({setting}) failed: {out.stderr.strip()[-500:]}")
        job_logs = []
        for name in sorted(os.listdir(logs)):
            if name.startswith("io_lat.") and name.endswith(".log"):
                with open(os.path.join(logs, name)) as f:
                    job_logs.append(f.readlines())
        span_s, skew_s = fio_span(job_logs)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    job = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    side = job["read" if op == "READ" else "write"]
    clat = side.get("clat_ns", {}).get("percentile", {})
    opt = dict(a[2:].split("=", 1) for a in cmd[1:] if a.startswith("--") and "=" in a)
    return {
        "engine": "fio", "transport": setting["ioengine"], "op": op, "block_size": block, "batch_size": 1,
        "gbps": round(side["io_bytes"] / span_s / 1e9, 4),
        "fio_reported_gbps": round(side["bw_bytes"] / 1e9, 4),  # bytes / the longest job's runtime
        "fio_job_start_skew_ms": round(skew_s * 1e3, 1),
        "avg_us": round(side.get("clat_ns", {}).get("mean", 0.0) / 1e3, 2),
        "p99_us": round(float(clat.get("99.000000", 0.0)) / 1e3, 2),
        "bytes": int(side["io_bytes"]), "ios": int(side["total_ios"]), "runtime_ms": int(side.get("runtime", 0)),
        # the job threads' own CPU (fio's usr/sys are percentages of the jobs' summed run time)
        "cpu_s_per_gb": round((job.get("usr_cpu", 0.0) + job.get("sys_cpu", 0.0)) / 100 * job.get("job_runtime", 0) / 1e3
                              / max(side["io_bytes"] / 1e9, 1e-9), 4),
        # fio's whole process, start-up included: its job threads' figure above leaves out the kernel
        # threads io_uring hands I/O to (io-wq: every buffered WRITE on ext4, which cannot be done
        # without blocking), threads of fio's process that do the copy for those jobs
        "fio_process_cpu_s_per_gb": round((ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime)
                                          / max(side["io_bytes"] / 1e9, 1e-9), 4),
        "fio_bs": int(opt["bs"]), "fio_setting": {**setting, "numjobs": int(opt["numjobs"])},
    }  # fmt: skip


def _fio_ready(sweep: BaselineSweep) -> tuple[str, str, int]:
    path = sweep.file_path
    if not path or not os.path.exists(path):
        raise BaselineUnavailable("fio needs the benchmark file (run with a file transport, e.g. --transport gds)")
    fio = shutil.which("fio")
    if fio is None:
        raise BaselineUnavailable("fio is not installed (apt-get install -y fio)")
    return fio, path, os.path.getsize(path)


def fio_baseline(sweep: BaselineSweep) -> list[dict]:
    """The real `fio` on the engine's own file, per op and block size: the same byte range, the same
    number of requests (`file_point_requests`: `sweep.iters`, raised to `sweep.min_bytes`), the
    same cache state (the file was just written; both go through the page cache), each point at
    its setting in `sweep.fio_settings` (from `fio_tune`; psync with one job where none is given)."""
    fio, path, size = _fio_ready(sweep)
    rows = []
    for op in sweep.ops:
        for block in sweep.block_sizes:
            if block > size:
                continue
            setting = (sweep.fio_settings or {}).get(f"{op} {int(block)}")
            requests = file_point_requests(sweep.iters, sweep.min_bytes, block)
            rows.append(_fio_run(fio, path, op, block, requests, setting))
    return rows


def fio_tune(sweep: BaselineSweep, settings: list[dict] | None = None) -> tuple[dict[str, dict], list[dict]]:
    """Run every fio setting within the engine's parallelism (`fio_settings`, or `settings`) once
    at every point; return the fastest setting per point ("OP BLOCK" -> setting) and every row."""
    fio, path, size = _fio_ready(sweep)
    best: dict[str, tuple[float, dict]] = {}
    rows = []
    for op in sweep.ops:
        for block in sweep.block_sizes:
            if block > size:
                continue
            requests = file_point_requests(sweep.iters, sweep.min_bytes, block)
            for setting in settings or fio_settings(block, sweep.piece_bytes, sweep.threads, sweep.depth):
                row = _fio_run(fio, path, op, block, requests, setting)
                rows.append(row)
                key = f"{op} {int(block)}"
                if key not in best or row["gbps"] > best[key][0]:
                    best[key] = (row["gbps"], setting)
    return {k: v[1] for k, v in best.items()}, rows


BASELINES: dict[str, Callable[[BaselineSweep], list[dict]]] = {
    "socket": socket_baseline,
    "cma": cma_baseline,
    "memcpy": memcpy_baseline,
    "mooncake": mooncake_baseline,
    "fio": fio_baseline,
}


def available_baselines(refresh: bool = False) -> dict[str, str | None]:
    """Baseline name -> None if it can run here, else the reason it cannot."""
    return {
        "socket": None,
        "cma": _cma_unavailable_reason(),
        "memcpy": None,
        "mooncake": _mooncake_unavailable_reason(refresh),
        "fio": None if shutil.which("fio") else "fio is not installed",
    }


def run_baseline(name: str, sweep: BaselineSweep) -> list[dict]:
    try:
        fn = BASELINES[name]
    except KeyError:
        raise ValueError(f"unknown baseline {name!r}; known: {sorted(BASELINES)}") from None
    return fn(sweep)
