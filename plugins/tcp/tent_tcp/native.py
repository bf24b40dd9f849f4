"""ctypes bindings for the TCP executor's private control functions.

The executor library (``_executor*.so``) exports the standard ``tent_executor_ops`` plus:

    int     tcp_listen(void *self, const char *ip, int port);          -> bound port or -errno
    int64_t tcp_register_region(void *self, uint64_t addr, uint64_t len, uint32_t perm);  -> id > 0
    int     tcp_unregister_region(void *self, int64_t id, int timeout_ms);
            removes exactly that registration; drains in-flight I/O, cutting its connections after
            timeout_ms (< 0: the executor's unregister_timeout_ms). 0, 1 (cut some), -ENOENT
    void    tcp_server_stats(void *self, uint64_t out[9]);
    void    tcp_wait_doorbell(void *self);
            out = [connections open, refused at max_conns, refused by auth, closed idle, cut]
    void    tcp_log_stats(uint64_t out[2]);   out = [log lines written, suppressed] (process-wide)
    int64_t tcp_add_peer(void *self, int nrails, const char **local_ips,
                         const char **remote_ips, const int *remote_ports);   -> handle > 0 or -errno
    void    tcp_remove_peer(void *self, int64_t peer);        (queued slices fail retryable at once)
    int     tcp_abort_rail(void *self, int64_t peer, int rail, int in_flight);
            -> queued slices handed back (in_flight: also cut the ones being served)
    int     tcp_get_rail_counters(void *self, int64_t peer, int rail, uint64_t *out, int nout);
            out = [bytes_ok, chunks_ok, errors, connects]
    void    tcp_peer_stats(void *self, uint64_t out[3]);
            out = [peers in the table, peers not yet freed, handle-table capacity]
    void    tcp_busy_poll_stats(void *self, uint64_t out[8]);
            out = [waits, polls, hits, lost] of client waiters, then of server connections
    void    tcp_busy_poll_replay(uint32_t cap_ns, int adaptive, uint64_t n, const uint64_t *poll_ns,
                                 const uint64_t *sleep_ns, const uint8_t *lost, uint32_t *budget_out,
                                 uint32_t out_state[6]);
            the adaptive busy-poll policy (tent/busy_poll.h) over a trace (tests)
    int     tcp_qos_bulk_level(int knob, int bulk, uint64_t now_ms, uint64_t small_until_ms);
            the level a thread runs its next work at (0 own, 1-19 nice, 20 SCHED_IDLE; tests)
    int     tcp_qos_bulk_nice(void *self);
            the qos_bulk_nice in force (0 when this process may not undo a demotion)
    uint64_t tcp_qos_piece(uint64_t piece, uint64_t want);
            bytes one system call of a demoted bulk thread moves of `want` (qos_bulk_piece; tests)
    void    tcp_qos_stats(void *self, uint64_t out[1]);
            out = [yields between the pieces of demoted bulk transfers]

perm bits: 1 = remote READ allowed, 2 = remote WRITE allowed (same values as tent_core.Permission).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tent_core.executor import Executor, find_extension, load_executor_library

PACKAGE_DIR = Path(__file__).parent

PERM_REMOTE_READ = 1
PERM_REMOTE_WRITE = 2

_c_char_pp = ctypes.POINTER(ctypes.c_char_p)


def executor_path() -> str:
    """Path of the compiled executor (raises FileNotFoundError when the plugin was not built)."""
    return find_extension(PACKAGE_DIR, "_executor")


def _bind(cdll: ctypes.CDLL) -> None:
    if getattr(cdll, "_tent_tcp_bound", False):
        return
    cdll.tcp_listen.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    cdll.tcp_listen.restype = ctypes.c_int
    cdll.tcp_register_region.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32]
    cdll.tcp_register_region.restype = ctypes.c_int64
    cdll.tcp_unregister_region.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    cdll.tcp_unregister_region.restype = ctypes.c_int
    cdll.tcp_server_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
    cdll.tcp_server_stats.restype = None
    cdll.tcp_wait_doorbell.argtypes = [ctypes.c_void_p]
    cdll.tcp_wait_doorbell.restype = None
    cdll.tcp_log_stats.argtypes = [ctypes.POINTER(ctypes.c_uint64)]
    cdll.tcp_log_stats.restype = None
    cdll.tcp_add_peer.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int,
        _c_char_pp,
        _c_char_pp,
        ctypes.POINTER(ctypes.c_int),
    ]
    cdll.tcp_add_peer.restype = ctypes.c_int64
    cdll.tcp_remove_peer.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    cdll.tcp_remove_peer.restype = None
    cdll.tcp_abort_rail.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    cdll.tcp_abort_rail.restype = ctypes.c_int
    cdll.tcp_get_rail_counters.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.c_int,
    ]
    cdll.tcp_get_rail_counters.restype = ctypes.c_int
    cdll.tcp_peer_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
    cdll.tcp_peer_stats.restype = None
    cdll.tcp_busy_poll_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
    cdll.tcp_busy_poll_stats.restype = None
    cdll.tcp_busy_poll_replay.argtypes = [ctypes.c_uint32, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p,
                                          ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                          ctypes.POINTER(ctypes.c_uint32)]  # fmt: skip
    cdll.tcp_busy_poll_replay.restype = None
    cdll.tcp_qos_bulk_level.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
    cdll.tcp_qos_bulk_level.restype = ctypes.c_int
    cdll.tcp_qos_bulk_nice.argtypes = [ctypes.c_void_p]
    cdll.tcp_qos_bulk_nice.restype = ctypes.c_int
    cdll.tcp_qos_piece.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
    cdll.tcp_qos_piece.restype = ctypes.c_uint64
    cdll.tcp_qos_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)]
    cdll.tcp_qos_stats.restype = None
    cdll._tent_tcp_bound = True


class TcpExecutor:
    """An executor instance plus typed access to its private control functions.

    `executor` is the core's :class:`tent_core.executor.Executor` (``ops``/``handle`` for
    the native submit path).
    """

    def __init__(self, config: dict[str, Any] | None = None, path: str | None = None) -> None:
        lib = load_executor_library(path or executor_path())
        _bind(lib.cdll)
        self._cdll = lib.cdll
        self.executor: Executor = lib.create(config or {})
        self._lock = threading.Lock()

    @property
    def ops(self) -> int:
        return self.executor.ops

    @property
    def handle(self) -> int:
        return self.executor.handle

    def _h(self) -> int:
        h = self.executor.handle
        if not h:
            raise RuntimeError("tcp executor is closed")
        return h

    def listen(self, ip: str, port: int = 0) -> int:
        rc = self._cdll.tcp_listen(self._h(), ip.encode(), port)
        if rc < 0:
            raise OSError(-rc, f"tcp_listen({ip}:{port}): {os.strerror(-rc)}")
        return int(rc)

    def register_region(self, addr: int, length: int, perm: int) -> int:
        """Register [addr, addr+length) for remote access with `perm`; returns the registration's id."""
        rc = self._cdll.tcp_register_region(self._h(), addr, length, perm)
        if rc < 0:
            raise OSError(-rc, f"tcp_register_region: {os.strerror(-rc)}")
        return int(rc)

    def unregister_region(self, region_id: int, timeout_s: float | None = None) -> bool:
        """Remove exactly registration `region_id` (another one covering the same bytes keeps its own
        permission). Blocks (GIL released) until no server thread touches it; I/O still running
        after `timeout_s` (default: the executor's unregister_timeout_ms) has its connection cut.
        False if unknown."""
        h = self.executor.handle
        if not h:
            return False
        ms = -1 if timeout_s is None else max(0, int(timeout_s * 1000))
        return self._cdll.tcp_unregister_region(h, region_id, ms) >= 0

    def server_stats(self) -> dict[str, int]:
        """Server side: connections open, refused at max_conns, refused by authentication, closed idle,
        cut by an unregister deadline; waiting READs parked now, answered after waiting, answered
        E_NOT_READY (word out of range, deadline, region gone), refused (malformed, or too many parked)."""
        out = (ctypes.c_uint64 * 9)()
        self._cdll.tcp_server_stats(self._h(), out)
        return {"open": out[0], "refused": out[1], "auth_failures": out[2], "idle_closed": out[3], "cut": out[4],
                "parked": out[5], "waits_served": out[6], "waits_not_ready": out[7], "waits_refused": out[8]}

    def wait_doorbell(self) -> None:
        """Parked waiting READs look at their words again now (the process advanced one)."""
        h = self.executor.handle
        if h:
            self._cdll.tcp_wait_doorbell(h)

    def log_stats(self) -> dict[str, int]:
        """Executor log lines written and suppressed by the rate limit (process-wide)."""
        out = (ctypes.c_uint64 * 2)()
        self._cdll.tcp_log_stats(out)
        return {"lines": out[0], "suppressed": out[1]}

    def add_peer(self, local_ips: Sequence[str], remote_ips: Sequence[str], remote_ports: Sequence[int]) -> int:
        n = len(remote_ips)
        if n == 0 or len(local_ips) != n or len(remote_ports) != n:
            raise ValueError("add_peer: local_ips, remote_ips and remote_ports must have the same non-zero length")
        lips = (ctypes.c_char_p * n)(*[s.encode() for s in local_ips])
        rips = (ctypes.c_char_p * n)(*[s.encode() for s in remote_ips])
        ports = (ctypes.c_int * n)(*remote_ports)
        h = self._cdll.tcp_add_peer(self._h(), n, lips, rips, ports)
        if h <= 0:
            raise OSError(-h, f"tcp_add_peer: {os.strerror(-h)}")
        return int(h)

    def remove_peer(self, peer: int) -> None:
        h = self.executor.handle
        if h:
            self._cdll.tcp_remove_peer(h, peer)

    def abort_rail(self, peer: int, rail: int, in_flight: bool = True) -> int:
        h = self.executor.handle
        return int(self._cdll.tcp_abort_rail(h, peer, rail, int(in_flight))) if h else 0

    def rail_counters(self, peer: int, rail: int) -> dict[str, int]:
        out = (ctypes.c_uint64 * 4)()
        rc = self._cdll.tcp_get_rail_counters(self._h(), peer, rail, out, 4)
        if rc < 0:
            raise ValueError(f"no rail {rail} on peer {peer}")
        return {"bytes": out[0], "slices": out[1], "errors": out[2], "connects": out[3]}

    def peer_stats(self) -> dict[str, int]:
        """Peers in the handle table, peers not freed yet (removed ones still draining), table size."""
        out = (ctypes.c_uint64 * 3)()
        self._cdll.tcp_peer_stats(self._h(), out)
        return {"live": out[0], "allocated": out[1], "capacity": out[2]}

    def busy_poll_stats(self) -> dict[str, dict[str, int]]:
        """Busy-poll outcomes per side: waits (that could poll), polls, hits (bytes within the poll
        on a core nobody else wanted), polls that lost their core."""
        out = (ctypes.c_uint64 * 8)()
        self._cdll.tcp_busy_poll_stats(self._h(), out)
        keys = ("waits", "polls", "hits", "lost")
        return {side: {k: int(out[i * 4 + j]) for j, k in enumerate(keys)} for i, side in enumerate(("client", "server"))}

    def qos_bulk_nice(self) -> int:
        """The qos_bulk_nice in force: the configured one, or 0 where this process may not undo a
        demotion (no CAP_SYS_NICE, RLIMIT_NICE too low)."""
        return int(self._cdll.tcp_qos_bulk_nice(self._h()))

    def qos_yields(self) -> int:
        """Yields between the pieces of bulk transfers moved while small requests were active
        (`qos_bulk_piece`), both sides of this executor."""
        out = (ctypes.c_uint64 * 1)()
        self._cdll.tcp_qos_stats(self._h(), out)
        return int(out[0])

    def close(self) -> None:
        with self._lock:
            self.executor.close()


def busy_poll_replay(cap_us: int, poll_us: Sequence[float], lost: Sequence[bool] | None = None,
                     sleep_us: Sequence[float] | None = None, wake_us: float = 20.0, adaptive: bool = True,
                     path: str | None = None) -> tuple[list[float], dict[str, int]]:  # fmt: skip
    """The executor's busy-poll policy over a trace (for tests and tuning; no sockets): wait i's
    bytes are there `poll_us[i]` after it begins if it polls (and a poll during it loses its core
    iff `lost[i]`), `sleep_us[i]` (default: `poll_us[i] + wake_us`, the wake-up) if it sleeps.
    Returns what each wait polled (us; 0 = slept at once) and the final state."""
    import numpy as np

    cdll = load_executor_library(path or executor_path()).cdll
    _bind(cdll)
    n = len(poll_us)
    polled = np.asarray(poll_us, np.float64)
    slept = polled + wake_us if sleep_us is None else np.asarray(sleep_us, np.float64)
    lost_a = np.ascontiguousarray(np.zeros(n, np.uint8) if lost is None else np.asarray(lost, np.uint8))
    if len(lost_a) != n or len(slept) != n:
        raise ValueError("poll_us, sleep_us and lost must have the same length")
    p_ns = np.ascontiguousarray(polled * 1000, np.uint64)
    s_ns = np.ascontiguousarray(slept * 1000, np.uint64)
    budgets = np.zeros(n, np.uint32)
    state = (ctypes.c_uint32 * 6)()
    cdll.tcp_busy_poll_replay(int(cap_us) * 1000, int(adaptive), n, p_ns.ctypes.data, s_ns.ctypes.data,
                              lost_a.ctypes.data, budgets.ctypes.data, state)  # fmt: skip
    keys = ("budget_ns", "score", "probe_gap", "until_probe", "poll_ns", "sleep_ns")
    return [float(b) / 1000 for b in budgets], dict(zip(keys, (int(x) for x in state), strict=True))


def qos_bulk_level(knob: int, bulk: bool, now_ms: int, small_until_ms: int, path: str | None = None) -> int:
    """The executor's QoS demotion policy (no threads touched): the level a thread runs its next
    work at, 0 (its own), 1-19 (a nice value) or 20 (SCHED_IDLE), for `qos_bulk_nice` = `knob`."""
    cdll = load_executor_library(path or executor_path()).cdll
    _bind(cdll)
    return int(cdll.tcp_qos_bulk_level(int(knob), int(bulk), int(now_ms), int(small_until_ms)))


def qos_piece(piece: int, want: int, path: str | None = None) -> int:
    """The executor's QoS piece policy: how many of `want` bytes one system call of a demoted bulk
    thread moves, for `qos_bulk_piece` = `piece` (0: all of them)."""
    cdll = load_executor_library(path or executor_path()).cdll
    _bind(cdll)
    return int(cdll.tcp_qos_piece(int(piece), int(want)))
