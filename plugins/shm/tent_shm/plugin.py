"""The ``shm`` transport: one-sided same-host copies, no CPU on the target side.

Two data paths, chosen per peer at :meth:`ShmTransport.connect`:

``cma``
    ``process_vm_readv`` / ``process_vm_writev`` against the peer's pid, issued by the
    compiled executor's worker threads. Bounds and permissions are checked by the core
    against the peer's advertised buffer list before submitting (like RDMA rkeys).
``memfd``
    For hosts where cross-process memory access is not permitted (ptrace policy,
    different users, containers). Engine-allocated buffers are memfd-backed; each
    engine runs a small unix-domain (abstract namespace, SOCK_SEQPACKET) server that
    hands a peer the fd of a registered memfd buffer with SCM_RIGHTS: read-only buffers
    get an ``O_RDONLY`` fd, mapped ``PROT_READ``. The initiator maps the peer's memfds
    ``MAP_SHARED`` and the executor translates remote addresses through a per-peer
    mapping table; ranges outside every mapping fail with TENT_E_BOUNDS, writes into a
    read-only mapping with TENT_E_PERMISSION.

Security (SECURITY.md): every engine runs the memfd server, in every mode: it is also how a peer
verifies, before any same-host path is used, that the socket its descriptor names belongs to the
process and engine it claims (``SO_PEERCRED`` pid, the engine's control endpoint), that the peer
knows the cluster secret (the HMAC handshake of :mod:`tent_core.auth`, purpose ``shm``; without a
token, a per-engine secret handed to authenticated ``describe`` callers) and that it runs as an
allowed uid (our own, root, or ``allow_uids``). Read-only registrations are shared as ``O_RDONLY``
fds of memfds sealed ``F_SEAL_FUTURE_WRITE`` (a re-open through /proc cannot write either); every
shared memfd is sealed against shrinking (a peer cannot SIGBUS us). CMA bypasses the target, so it
is used only when both sides enable it (``mode`` "auto" or "cma") and both run as the same uid.

Config keys, with their defaults and meaning: :attr:`ShmTransport.config_keys`.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import functools
import ipaddress
import json
import logging
import os
import secrets
import socket
import struct
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tent_core.auth import AuthError, ClusterAuth, client_handshake, deny, server_handshake
from tent_core.errors import InvalidRequestError, PeerUnreachableError
from tent_core.executor import EXECUTOR_ABI_VERSION, Executor, PluginLibrary
from tent_core.plugin_spec import hookimpl
from tent_core.ratelog import RateLimitedLog
from tent_core.transport import AccessControl, Transport, TransportContext
from tent_core.types import (
    Availability,
    BufferInfo,
    CapabilityProfile,
    MemoryKind,
    PeerInfo,
    PeerLink,
    Permission,
    RailInfo,
)

from . import __version__

log = logging.getLogger(__name__)

MODE_CMA = 0
MODE_MEMFD = 1
_MODE_NAMES = {MODE_CMA: "cma", MODE_MEMFD: "memfd"}
MODES = ("auto", "cma", "memfd")
DEFAULT_MODE = "memfd"  # CMA bypasses the target: opt-in only
_MAX_MSG = 65536
F_SEAL_FUTURE_WRITE = 0x0010  # Linux 5.1; not in Python's fcntl module
_SEALS_ALL = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_SEALS_RO = _SEALS_ALL | F_SEAL_FUTURE_WRITE
HANDSHAKE_TIMEOUT_S = 5.0
_rlog = RateLimitedLog(log)


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket, as the kernel recorded them."""
    return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))


def _split_endpoint(engine_id: str) -> tuple[str, str]:
    host, _, port = engine_id.rpartition(":")
    return (host.strip("[]"), port) if host and port.isdigit() else ("", "")


def same_endpoint(dialed: str, claimed: str) -> bool:
    """Is `claimed` (the engine id a memfd server reports) the control endpoint we dialed?

    Same port and same address (names resolved); a server whose engine listens on a wildcard
    address owns that port on every address. Non host:port ids must be equal."""
    if dialed == claimed:
        return True
    dh, dp = _split_endpoint(dialed)
    ch, cp = _split_endpoint(claimed)
    if not dp or dp != cp:
        return False
    if ch in ("", "0.0.0.0", "::", "*"):
        return True

    def addr(h: str) -> str:
        try:
            return str(ipaddress.ip_address(h))
        except ValueError:
            try:
                return socket.gethostbyname(h)
            except OSError:
                return h

    return addr(dh) == addr(ch)


def seal_memfd(fd: int, writable: bool) -> str | None:
    """Seal a memfd before sharing it; None on success, else why it cannot be shared safely."""
    want = _SEALS_ALL if writable else _SEALS_RO
    try:
        have = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        if have & want != want:
            if have & fcntl.F_SEAL_SEAL:
                return "its seals are locked without the ones sharing needs (create it with MFD_ALLOW_SEALING)"
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, want & ~have)
    except OSError as exc:
        return f"cannot seal it ({os.strerror(exc.errno or 0)}: create it with MFD_ALLOW_SEALING)"
    return None


# --------------------------------------------------------------------------- library
u64, i32, i64, u32, vp = ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_void_p


class _Lib(PluginLibrary):
    """The compiled executor library plus ctypes prototypes of its private functions."""

    PREFIX = "tent_shm_"
    PROTOTYPES: ClassVar[dict[str, tuple[Any, list[Any]]]] = {
        "peer_add": (u64, [vp, i32, i32]),
        "peer_remove": (i32, [vp, u64]),
        "peer_set_dead": (i32, [vp, u64]),
        "map_add": (i32, [vp, u64, u64, u64, u64, i32]),
        "map_remove": (i32, [vp, u64, u64]),
        "cma_probe": (i32, [i32, u64, u64, u64]),
        "mmap_fd": (i64, [i32, u64, u64, i32, i32]),
        "munmap": (i32, [u64, u64]),
        "threads": (u32, [vp]),
        "chunk": (u64, [vp]),
    }

    peer_add: Any
    peer_remove: Any
    peer_set_dead: Any
    map_add: Any
    map_remove: Any
    cma_probe: Any
    mmap_fd: Any
    munmap: Any
    threads: Any
    chunk: Any


@functools.cache
def get_lib() -> _Lib:
    return _Lib(Path(__file__).parent)


# --------------------------------------------------------------------------- control messages
def _send(sock: socket.socket, msg: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(msg).encode()
    if fds:
        socket.send_fds(sock, [data], fds)
    else:
        sock.send(data)


def _recv(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the fds it carried; (None, []) on EOF."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    try:
        msg = json.loads(data)
        if not isinstance(msg, dict):
            raise ValueError("not an object")
    except ValueError:
        for fd in fds:
            os.close(fd)
        raise
    return msg, fds


_BIND_ATTEMPTS = 8


def _abstract(name: str) -> str:
    return "\0" + name


# --------------------------------------------------------------------------- server side
@dataclass
class _Export:
    addr: int
    length: int
    fd: int  # the engine's memfd (not ours to close)
    offset: int  # offset of `addr` inside the memfd
    writable: bool
    ro_fd: int = -1  # our O_RDONLY re-open, handed out for read-only buffers

    def close(self) -> None:
        if self.ro_fd >= 0:
            os.close(self.ro_fd)
            self.ro_fd = -1


class _ServerConn:
    def __init__(self, sock: socket.socket, pid: int, uid: int) -> None:
        self.sock = sock
        self.pid = pid
        self.uid = uid
        self.send_lock = threading.Lock()
        self.fetched: set[int] = set()
        self.acks: dict[int, threading.Event] = {}


class _ShmServer:
    """Hands registered memfd buffers to authenticated same-host peers (control path only)."""

    def __init__(
        self, engine_id: str, key: bytes, *, allow_cma: bool, allow_uids: frozenset[int] = frozenset(), max_conns: int = 256
    ) -> None:
        self.engine_id = engine_id
        self._key = key
        self.allow_cma = allow_cma
        self.allow_uids = frozenset({os.getuid(), 0}) | allow_uids
        self.max_conns = max_conns
        self._lock = threading.Lock()
        self._exports: dict[int, _Export] = {}
        self._conns: set[_ServerConn] = set()
        self._active = 0
        self.refused = 0
        self._closed = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        # an abstract name: nothing in the file system, gone with the socket; random, so another
        # process (of any user) holding a name never collides with ours, and if one did we pick again
        for attempt in range(_BIND_ATTEMPTS):
            self.name = f"tent-shm-{os.getpid()}-{secrets.token_hex(6)}"
            try:
                self._sock.bind(_abstract(self.name))
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == _BIND_ATTEMPTS - 1:
                    self._sock.close()
                    raise
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._accept_loop, name="tent-shm-server", daemon=True)
        self._thread.start()

    def export(self, buf: BufferInfo) -> bool:
        """Offer a memfd-backed buffer to peers; False if it cannot be shared safely (not offered)."""
        writable = bool(Permission(buf.perm) & Permission.WRITE)
        why = seal_memfd(buf.memfd, writable)
        if why is not None:
            log.warning("shm: buffer %#x (%s) is not shared through its memfd: %s", buf.addr,
                        "read-write" if writable else "read-only", why)
            return False
        exp = _Export(buf.addr, buf.length, buf.memfd, int(buf.extra.get("memfd_offset", 0)), writable)
        if not writable:
            exp.ro_fd = os.open(f"/proc/self/fd/{buf.memfd}", os.O_RDONLY | os.O_CLOEXEC)
        with self._lock:
            old = self._exports.pop(buf.addr, None)
            self._exports[buf.addr] = exp
        if old:
            old.close()
        return True

    def release(self, addr: int, timeout: float) -> None:
        """Stop handing `addr` out and ask every peer that mapped it to unmap; waits for their acks."""
        with self._lock:
            exp = self._exports.pop(addr, None)
            conns = [c for c in self._conns if addr in c.fetched]
        if exp is None:
            return
        waits = []
        for c in conns:
            ev = threading.Event()
            c.acks[addr] = ev
            try:
                with c.send_lock:
                    _send(c.sock, {"op": "revoke", "addr": addr})
                waits.append((c, ev))
            except OSError:
                c.acks.pop(addr, None)  # peer gone: its mappings went with it
        for c, ev in waits:
            if not ev.wait(timeout):
                log.warning("shm: peer pid %d did not unmap buffer %#x within %.1fs", c.pid, addr, timeout)
            c.acks.pop(addr, None)
            c.fetched.discard(addr)
        exp.close()

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            if self._closed:
                sock.close()
                return
            with self._lock:
                full = self._active >= self.max_conns
                if not full:
                    self._active += 1
            if full:
                self.refused += 1
                _rlog.warning("conn-cap", "shm: refused a control connection (%d open, the cap)", self.max_conns)
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock,), name="tent-shm-conn", daemon=True).start()

    def _admit(self, sock: socket.socket) -> _ServerConn | None:
        """Credentials, then the handshake, then hello: the connection is trusted after this."""
        try:
            pid, uid, _gid = peer_credentials(sock)
        except OSError:
            return None
        if uid not in self.allow_uids:
            self.refused += 1
            _rlog.warning("uid", "shm: refused pid %d: uid %d may not map this engine's memory", pid, uid)
            try:
                sock.recv(_MAX_MSG)  # the client's HELLO: answer it, so the client sees why
                sock.send(deny(f"uid {uid} may not map this engine's memory (allow_uids)"))
            except OSError:
                pass
            return None
        try:
            server_handshake(sock, self._key, timeout=HANDSHAKE_TIMEOUT_S)
        except AuthError as exc:
            self.refused += 1
            _rlog.warning("auth", "shm: refused pid %d (uid %d): %s", pid, uid, exc)
            return None
        msg, fds = _recv(sock)
        for fd in fds:
            os.close(fd)
        if not msg or msg.get("op") != "hello":
            return None
        _send(sock, {"op": "hello", "ok": True, "pid": os.getpid(), "uid": os.getuid(),
                     "engine_id": self.engine_id, "cma": self.allow_cma})
        return _ServerConn(sock, pid, uid)

    def _serve(self, sock: socket.socket) -> None:
        conn: _ServerConn | None = None
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            conn = self._admit(sock)
            if conn is None:
                return
            sock.settimeout(None)
            with self._lock:
                self._conns.add(conn)
            while True:
                msg, fds = _recv(sock)
                for fd in fds:
                    os.close(fd)
                if msg is None:
                    return
                op = msg.get("op")
                if op == "get":
                    self._handle_get(conn, msg)
                elif op == "revoked":
                    ev = conn.acks.get(int(msg.get("addr", -1)))
                    if ev:
                        ev.set()
                else:
                    _rlog.warning("bad-op", "shm: unknown control op %.40r from pid %d", op, conn.pid)
        except (OSError, ValueError, TypeError) as exc:
            log.debug("shm: control connection ended: %s", exc)
        finally:
            with self._lock:
                self._active -= 1
                if conn is not None:
                    self._conns.discard(conn)
            if conn is not None:
                for ev in list(conn.acks.values()):
                    ev.set()
            sock.close()

    def _handle_get(self, conn: _ServerConn, msg: dict[str, Any]) -> None:
        rid, addr = msg.get("id"), int(msg.get("addr", -1))
        with self._lock:  # under the lock: a concurrent release() revokes after this reply
            exp = self._exports.get(addr)
            with conn.send_lock:
                if exp is None:
                    _send(conn.sock, {"op": "reply", "id": rid, "ok": False, "error": "not a memfd-backed buffer"})
                    return
                _send(
                    conn.sock,
                    {
                        "op": "reply",
                        "id": rid,
                        "ok": True,
                        "addr": exp.addr,
                        "length": exp.length,
                        "offset": exp.offset,
                        "writable": exp.writable,
                    },
                    [exp.fd if exp.writable else exp.ro_fd],
                )
            conn.fetched.add(addr)

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
            exports = list(self._exports.values())
            self._exports.clear()
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for e in exports:
            e.close()


# --------------------------------------------------------------------------- client side
@dataclass
class _Mapping:
    remote: int
    length: int
    local: int  # 0 = known but not mappable (not memfd-backed)
    writable: bool


@dataclass
class _Link:
    engine_id: str
    pid: int
    mode: int
    handle: int
    conn: _ClientConn | None = None
    maps: dict[int, _Mapping] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: bool = False
    why_cma: str = ""  # memfd mode: why CMA was not used (for buffer_unreachable's explanation)


class _ClientConn:
    """Persistent control connection to a peer's memfd server (replies + revoke pushes)."""

    def __init__(
        self, name: str, key: bytes, engine_id: str, claimed_pid: int, timeout: float, on_revoke: Any, on_close: Any
    ) -> None:
        """Connect to memfd server `name` and verify it belongs to engine `engine_id` (the control
        endpoint we dialed), running as `claimed_pid`: the kernel's SO_PEERCRED, the handshake and
        the server's own account must agree, or no same-host path is used (a hostile describe could
        otherwise point us at a third engine's memory: a confused deputy)."""
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        self.timeout = timeout
        self._on_revoke = on_revoke
        self._on_close = on_close
        self._send_lock = threading.Lock()
        self._cv = threading.Condition()
        self._replies: dict[int, tuple[dict[str, Any], list[int]]] = {}
        self._next_id = 0
        self._closed = False
        try:
            self.sock.settimeout(timeout)
            self.sock.connect(_abstract(name))
            pid, uid, _gid = peer_credentials(self.sock)
            if claimed_pid and pid != claimed_pid:
                raise PeerUnreachableError(
                    f"shm: the memfd server {engine_id} names is process {pid or '(not visible here)'}, not the "
                    f"pid {claimed_pid} it claims: refusing the same-host path"
                )
            client_handshake(self.sock, key, timeout=timeout)
            _send(self.sock, {"op": "hello", "pid": os.getpid()})
            msg, fds = _recv(self.sock)
            for fd in fds:
                os.close(fd)
            if not msg or not msg.get("ok"):
                raise ConnectionError("memfd server refused the hello")
            served = str(msg.get("engine_id", ""))
            if not same_endpoint(engine_id, served):
                raise PeerUnreachableError(
                    f"shm: the memfd server {engine_id} names belongs to engine {served!r} (pid {pid}), not to "
                    f"{engine_id}: refusing the same-host path"
                )
            self.sock.settimeout(None)
        except BaseException:
            self.sock.close()
            raise
        self.peer_pid = pid  # as the kernel sees it, in our pid namespace
        self.peer_uid = uid
        self.peer_allows_cma = bool(msg.get("cma"))
        self._thread = threading.Thread(target=self._reader, name="tent-shm-client", daemon=True)
        self._thread.start()

    def get(self, addr: int) -> tuple[dict[str, Any], int]:
        """Ask for the memfd of remote buffer `addr`: (reply, fd or -1)."""
        with self._cv:
            self._next_id += 1
            rid = self._next_id
        with self._send_lock:
            _send(self.sock, {"op": "get", "id": rid, "addr": addr})
        with self._cv:
            if not self._cv.wait_for(lambda: rid in self._replies or self._closed, self.timeout):
                raise TimeoutError(f"memfd server did not answer within {self.timeout}s")
            if rid not in self._replies:
                raise ConnectionError("memfd control connection closed")
            msg, fds = self._replies.pop(rid)
        for extra in fds[1:]:
            os.close(extra)
        return msg, (fds[0] if fds else -1)

    def _reader(self) -> None:
        try:
            while True:
                msg, fds = _recv(self.sock)
                if msg is None:
                    break
                if msg.get("op") == "revoke":
                    for fd in fds:
                        os.close(fd)
                    # off the reader thread: connect() may hold the link lock while waiting for a reply
                    threading.Thread(
                        target=self._revoke, args=(int(msg.get("addr", -1)),), name="tent-shm-revoke", daemon=True
                    ).start()
                elif msg.get("op") == "reply":
                    with self._cv:
                        self._replies[int(msg.get("id", -1))] = (msg, fds)
                        self._cv.notify_all()
                else:
                    for fd in fds:
                        os.close(fd)
        except (OSError, ValueError) as exc:
            log.debug("shm: control connection read ended: %s", exc)
        finally:
            with self._cv:
                was_closed = self._closed
                self._closed = True
                self._cv.notify_all()
            if not was_closed:
                self._on_close()

    def _revoke(self, addr: int) -> None:
        try:
            self._on_revoke(addr)
        except Exception:
            log.exception("shm: unmapping revoked buffer %#x failed", addr)
        try:
            with self._send_lock:
                _send(self.sock, {"op": "revoked", "addr": addr})
        except OSError:
            pass

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for _msg, fds in self._replies.values():
            for fd in fds:
                os.close(fd)
        self._replies.clear()


# --------------------------------------------------------------------------- transport
def _field(d: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if n in d:
            return d[n]
    return default


class ShmTransport(Transport):
    name = "shm"
    version = __version__
    config_keys = {
        # "memfd" (peers map our sealed memfds, the target enforces), "auto" (CMA when both sides allow it,
        # run as one uid and a probe read works, else memfd), "cma" (CMA only). CMA bypasses the target.
        "mode": DEFAULT_MODE,
        "allow_uids": None,  # further uids (besides ours and root) allowed to map our memfd buffers (list or "1,2")
        "max_conns": 256,  # concurrent control connections the memfd server accepts
        "threads": 2,  # executor worker threads
        "chunk": 1 << 20,  # slices longer than this are split across workers (bytes; 0 = never): 4 MiB uses both cores
        # requests up to this long are copied by the submitting thread (no hand-off, no wake-up),
        # alongside the workers for those longer than one chunk (bytes; 0 = never)
        "inline_bytes": 4 << 20,
        "inline_budget": 4 << 20,  # bytes the submitting thread copies per submit beyond its first piece
        "populate": True,  # MAP_POPULATE peer memfd mappings at connect
        "connect_timeout": 5.0,  # seconds for the memfd control exchange
        "revoke_timeout": 2.0,  # seconds release_buffer waits for peers to unmap a buffer
    }

    def __init__(self) -> None:
        self._lib: _Lib | None = None
        self._executor: Executor | None = None
        self._server: _ShmServer | None = None
        self._host_id = ""
        self._mode = DEFAULT_MODE
        self._auth: ClusterAuth | None = None
        self._engine_id = ""
        self._populate = True
        self._connect_timeout = 5.0
        self._revoke_timeout = 2.0
        self._secret = secrets.token_hex(16)
        self._links: dict[str, _Link] = {}
        self._by_handle: dict[int, _Link] = {}
        self._lock = threading.RLock()
        self._probe_magic = os.urandom(16)
        self._probe_buf = ctypes.create_string_buffer(self._probe_magic, len(self._probe_magic))

    # -- discovery
    def probe(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability.unavailable("shm transport needs Linux (process_vm_readv, memfd)")
        try:
            get_lib()
        except Exception as exc:  # not built, wrong ABI...
            return Availability.unavailable(f"shm executor library unusable: {exc}")
        return Availability.ok()

    def capabilities(self) -> CapabilityProfile:
        return CapabilityProfile(
            kind_pairs=frozenset({(MemoryKind.HOST, MemoryKind.HOST)}), same_host=True, cross_host=False, rank=10
        )

    # -- lifecycle
    def start(self, ctx: TransportContext) -> None:
        cfg = self.resolve_config(ctx.config)
        mode = str(cfg["mode"]).lower()
        if mode not in MODES:
            raise InvalidRequestError(f"shm: config mode must be one of {MODES}, got {mode!r}")
        allow_uids = cfg["allow_uids"] or []
        if isinstance(allow_uids, str):
            allow_uids = [u for u in allow_uids.split(",") if u.strip()]
        try:
            uids = frozenset(int(u) for u in allow_uids)
        except (TypeError, ValueError):
            raise InvalidRequestError(f"shm: allow_uids must be a list of uids, got {allow_uids!r}") from None
        self._mode = mode
        self._auth = ctx.auth
        self._engine_id = ctx.engine_id
        self._populate = bool(cfg["populate"])
        self._connect_timeout = float(cfg["connect_timeout"])
        self._revoke_timeout = float(cfg["revoke_timeout"])
        self._host_id = ctx.host_id
        self._lib = get_lib()
        ex_cfg = {"threads": int(cfg["threads"]), "chunk": int(cfg["chunk"]), "inline_budget": int(cfg["inline_budget"])}
        self.inline_bytes = max(0, int(cfg["inline_bytes"]))
        # submit_inline copies one slice of at most one chunk on the caller's thread, reported before
        # it returns (shm_executor.c); a longer one is shared with the workers
        chunk = int(cfg["chunk"])
        self.inline_completes_bytes = min(self.inline_bytes, chunk) if chunk > 0 else self.inline_bytes
        # with a digest armed the caller copies its READs itself, whole, and a memfd copy folds them
        # into the digest as it goes (CMA copies are left to the caller to fold)
        self.inline_digest = mode != "cma" and self.inline_bytes > 0
        self._executor = self._lib.library.create(ex_cfg)
        # the server runs in every mode: peers verify who we are through it before any same-host path
        self._server = _ShmServer(
            ctx.engine_id,
            self._auth.key("shm") if self._auth else self._secret.encode(),
            allow_cma=mode in ("auto", "cma"),
            allow_uids=uids,
            max_conns=int(cfg["max_conns"]),
        )
        log.info(
            "shm transport started: mode=%s threads=%d chunk=%d sock=%s",
            mode,
            self._lib.threads(self._executor.handle),
            self._lib.chunk(self._executor.handle),
            self._server.name if self._server else None,
        )

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            raise RuntimeError("shm transport not started")
        return self._executor

    @property
    def mode(self) -> str:
        """The configured mode: "auto", "cma" or "memfd"."""
        return self._mode

    def link_mode(self, link_or_handle: PeerLink | int) -> str:
        """The data path ("cma" or "memfd") a connected peer uses."""
        h = link_or_handle.handle if isinstance(link_or_handle, PeerLink) else int(link_or_handle)
        with self._lock:
            link = self._by_handle.get(h)
        if link is None:
            raise KeyError(f"shm: no peer link with handle {h:#x}")
        return _MODE_NAMES[link.mode]

    def mapped_address(self, link_or_handle: PeerLink | int, remote_addr: int) -> int:
        """Where a memfd peer's buffer at `remote_addr` is mapped in this process (0: not mapped),
        for tools that compare the engine with a bare memcpy between the same mappings."""
        h = link_or_handle.handle if isinstance(link_or_handle, PeerLink) else int(link_or_handle)
        with self._lock:
            link = self._by_handle.get(h)
        if link is None:
            raise KeyError(f"shm: no peer link with handle {h:#x}")
        with link.lock:
            for m in link.maps.values():
                if m.local and m.remote <= remote_addr < m.remote + m.length:
                    return m.local + (remote_addr - m.remote)
        return 0

    def local_descriptor(self) -> dict[str, Any]:
        desc = {
            "pid": os.getpid(),
            "sock": self._server.name if self._server else "",
            "probe_addr": ctypes.addressof(self._probe_buf),
            "probe_len": len(self._probe_magic),
            "probe_magic": self._probe_magic.hex(),
            "mode": self._mode,
            "version": __version__,
        }
        if self._auth is None:
            # no cluster secret (loopback only): peers that may describe us authenticate with this one;
            # it grants the registered memfd buffers with their permissions, to allowed uids, nothing more
            desc["secret"] = self._secret
        return desc

    def rail_names(self) -> list[str]:
        return ["cma", "memfd"] if self._mode == "auto" else [self._mode]

    # -- buffers
    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        if buf.kind != MemoryKind.HOST:
            return None
        shared = buf.memfd >= 0 and self._server is not None and self._server.export(buf)
        return {"memfd": bool(shared)}

    def release_buffer(self, buf: BufferInfo) -> None:
        if self._server is not None:
            self._server.release(buf.addr, self._revoke_timeout)

    # -- peers
    def can_reach(self, peer: PeerInfo) -> str | None:
        if self.name not in peer.transports:
            return f"peer does not offer {self.name}"
        if not self._host_id or peer.host_id != self._host_id:
            return f"peer {peer.engine_id} is on another host ({peer.host_id} != {self._host_id})"
        return None

    def buffer_unreachable(self, peer: PeerInfo, buffer: Mapping[str, Any], link: PeerLink | None) -> str | None:
        """A peer's buffer that is not shared through a memfd (plain process memory registered with
        engine.register(), or a memfd that could not be sealed) is out of reach of memfd mappings;
        only CMA reaches it. Known before connecting when we never use CMA (mode memfd), else once
        the link says which data path it took."""
        desc = buffer.get("desc")
        mine = desc.get(self.name) if isinstance(desc, Mapping) else None
        if not isinstance(mine, Mapping) or mine.get("memfd", True):
            return None  # memfd-backed, or not exported by our peer's shm (device memory: capabilities decide)
        mode = link.extra.get("mode") if link is not None else ("memfd" if self._mode == "memfd" else None)
        if mode != "memfd":
            return None  # CMA reaches any of the peer's memory (or connecting has not told yet)
        if self._mode == "memfd":
            cma = 'CMA, which reaches any memory, is off (transports.shm.mode = "memfd"; "auto" on both engines, same user, allows it)'
        else:
            cma = f"CMA to this peer is not possible: {link.extra.get('why_cma') or 'see the shm log'}" if link else ""
        return ("shm (memfd mode) maps only engine-allocated memory, and this buffer is plain process memory "
                f"(registered with engine.register(), not engine.allocate()); {cma}"
                "; allocate the buffer with engine.allocate(), or load a transport that reaches any memory (tcp)")

    def _probe_cma(self, desc: dict[str, Any], pid: int) -> str | None:
        """None if process_vm_readv reaches the peer (and reads its advertised magic), else why not."""
        assert self._lib is not None
        addr, n = int(desc.get("probe_addr", 0)), int(desc.get("probe_len", 0))
        if not addr or n <= 0 or n > 4096:
            return "peer advertises no probe buffer"
        out = ctypes.create_string_buffer(n)
        rc = self._lib.cma_probe(pid, addr, ctypes.addressof(out), n)
        if rc != 0:
            return f"process_vm_readv(pid {pid}) failed: {os.strerror(-rc)}"
        if out.raw.hex() != desc.get("probe_magic"):
            return f"pid {pid} is not the peer (probe magic differs: another pid namespace?)"
        return None

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        if self._executor is None or self._lib is None:
            raise RuntimeError("shm transport not started")
        reason = self.can_reach(peer)
        if reason:
            raise PeerUnreachableError(f"shm: cannot reach {peer.engine_id}: {reason}")
        desc = peer.transports[self.name]
        pid = int(desc.get("pid", peer.pid))
        with self._lock:
            link = self._links.get(peer.engine_id)
            if link is not None and (link.pid != pid or link.dead):
                self._teardown(link)
                link = None
            if link is None:
                link = self._new_link(peer, desc, pid)
        if link.mode == MODE_MEMFD:
            try:
                self._sync_mappings(link, remote_buffers)
            except BaseException:
                with self._lock:
                    self._teardown(link)
                raise
        extra = {"mode": _MODE_NAMES[link.mode]}
        if link.mode == MODE_MEMFD:
            extra["why_cma"] = link.why_cma
        return PeerLink(handle=link.handle, rails=[RailInfo(0, _MODE_NAMES[link.mode])], extra=extra)

    def access_control(self, link: PeerLink) -> AccessControl:
        if link.extra.get("mode") == "memfd":
            return AccessControl()  # the executor only reaches the peer's mapped memfds, with their modes
        return AccessControl(
            bounds=False,
            permission=False,
            revocation=False,
            reason="CMA (process_vm_readv/writev) reaches the peer's whole address space: the core's "
            "initiator-side check is the only one (mode=memfd enforces them)",
        )

    def _new_link(self, peer: PeerInfo, desc: dict[str, Any], pid: int) -> _Link:
        assert self._executor is not None and self._lib is not None
        sock = desc.get("sock") or ""
        if not sock:
            raise PeerUnreachableError(f"shm: cannot reach {peer.engine_id}: it runs no memfd server (an older tent-shm?)")
        if self._auth is not None:
            key = self._auth.key("shm")
        else:
            key = str(desc.get("secret", "")).encode()
            if not key:
                raise PeerUnreachableError(
                    f"shm: {peer.engine_id} advertises no shm secret: it has an auth token and we do not "
                    "(configure the same TENT_AUTH_TOKEN on both)"
                )
        link = _Link(peer.engine_id, pid, MODE_MEMFD, 0)
        try:
            link.conn = _ClientConn(
                sock,
                key,
                peer.engine_id,
                pid,
                self._connect_timeout,
                on_revoke=lambda addr, lk=link: self._revoke(lk, addr),
                on_close=lambda lk=link: self._peer_closed(lk),
            )
        except PeerUnreachableError:
            raise
        except AuthError as exc:
            raise PeerUnreachableError(f"shm: {peer.engine_id}: the memfd server did not authenticate: {exc}") from exc
        except (OSError, ConnectionError) as exc:
            raise PeerUnreachableError(
                f"shm: cannot reach {peer.engine_id}: memfd server {sock!r} unreachable ({exc}; other network namespace?)"
            ) from exc
        why_cma = "mode=memfd configured"
        if self._mode in ("auto", "cma"):
            conn = link.conn
            if not conn.peer_allows_cma:
                why_cma = "the peer does not allow CMA (its shm mode is memfd)"
            elif conn.peer_uid != os.getuid():
                why_cma = f"the peer runs as uid {conn.peer_uid}, we as {os.getuid()} (CMA only within one user)"
            else:
                why = self._probe_cma(desc, conn.peer_pid)
                why_cma = why or ""
            if not why_cma:
                link.mode = MODE_CMA
                link.pid = conn.peer_pid
                return self._register_link(link)
            if self._mode == "cma":
                link.conn.close()
                raise PeerUnreachableError(f"shm: CMA to {peer.engine_id} not possible: {why_cma}")
        log.info("shm: %s uses memfd mappings (CMA: %s)", peer.engine_id, why_cma)
        link.why_cma = why_cma
        return self._register_link(link)

    def _register_link(self, link: _Link) -> _Link:
        assert self._executor is not None and self._lib is not None
        # the server reports its pid as seen from our pid namespace
        pid = link.conn.peer_pid if link.conn is not None and link.conn.peer_pid else link.pid
        h = self._lib.peer_add(self._executor.handle, pid, link.mode)
        if not h:
            if link.conn is not None:
                link.conn.close()
            raise PeerUnreachableError(f"shm: executor could not add peer {link.engine_id}")
        link.handle = h
        self._links[link.engine_id] = link
        self._by_handle[h] = link
        log.debug("shm: peer %s pid %d mode %s handle %#x", link.engine_id, pid, _MODE_NAMES[link.mode], h)
        return link

    def _sync_mappings(self, link: _Link, remote_buffers: list[dict[str, Any]]) -> None:
        """Map the peer's memfd buffers not mapped yet; unmap those gone from its list."""
        assert self._lib is not None and self._executor is not None and link.conn is not None
        wanted: dict[int, int] = {}
        no_memfd: set[int] = set()  # the peer said so in its per-buffer descriptor: skip the round trip
        for d in remote_buffers:
            addr, length = _field(d, "addr", "address"), _field(d, "length", "size", "len")
            if addr is None or length is None or int(length) <= 0:
                continue
            if str(d.get("kind", MemoryKind.HOST.value)) not in (MemoryKind.HOST.value, str(MemoryKind.HOST)):
                continue  # device memory is not ours to map
            wanted[int(addr)] = int(length)
            desc = d.get("desc")
            if isinstance(desc, dict) and isinstance(desc.get(self.name), dict) and not desc[self.name].get("memfd"):
                no_memfd.add(int(addr))
        with link.lock:
            for addr in [a for a, m in link.maps.items() if wanted.get(a) != m.length]:
                self._unmap(link, link.maps.pop(addr))
            mapped = sum(1 for m in link.maps.values() if m.local)
            for addr, length in wanted.items():
                if addr in link.maps:
                    continue
                m = self._map_one(link, addr, length, ask=addr not in no_memfd)
                link.maps[addr] = m
                mapped += 1 if m.local else 0
        if wanted and mapped == 0:
            raise PeerUnreachableError(
                f"shm: cannot reach {link.engine_id}: CMA is not permitted and none of its "
                f"{len(wanted)} buffers is memfd-backed (register engine-allocated buffers, or use another transport)"
            )

    def _map_one(self, link: _Link, addr: int, length: int, ask: bool = True) -> _Mapping:
        assert self._lib is not None and self._executor is not None and link.conn is not None
        reply: dict[str, Any] = {"ok": False}
        fd = -1
        if ask:
            try:
                reply, fd = link.conn.get(addr)
            except (OSError, TimeoutError) as exc:
                raise PeerUnreachableError(f"shm: memfd exchange with {link.engine_id} failed: {exc}") from exc
        m = _Mapping(addr, length, 0, False)
        if reply.get("ok") and fd >= 0:
            try:
                rlen = int(reply["length"])
                writable = bool(reply["writable"])
                if rlen < length:
                    log.warning(
                        "shm: %s buffer %#x: advertised %d bytes, memfd holds %d", link.engine_id, addr, length, rlen
                    )
                res = self._lib.mmap_fd(fd, int(reply.get("offset", 0)), rlen, int(writable), int(self._populate))
            finally:
                os.close(fd)
            if res < 0:
                log.warning("shm: mmap of %s buffer %#x failed: %s", link.engine_id, addr, os.strerror(-res))
            else:
                m = _Mapping(addr, rlen, int(res), writable)
        elif fd >= 0:
            os.close(fd)
        # local == 0 records "registered there but not memfd-backed": slices fail retryable (TENT_E_CONNECT)
        rc = self._lib.map_add(self._executor.handle, link.handle, m.remote, m.length, m.local, int(m.writable))
        if rc != 0:
            if m.local:
                self._lib.munmap(m.local, m.length)
            raise PeerUnreachableError(f"shm: mapping {link.engine_id} buffer {addr:#x} failed: {os.strerror(-rc)}")
        return m

    def _unmap(self, link: _Link, m: _Mapping) -> None:
        assert self._lib is not None and self._executor is not None
        self._lib.map_remove(self._executor.handle, link.handle, m.remote)  # waits for copies in flight
        if m.local:
            self._lib.munmap(m.local, m.length)

    def _revoke(self, link: _Link, addr: int) -> None:
        with link.lock:
            m = link.maps.pop(addr, None)
            if m is not None:
                self._unmap(link, m)
        log.debug("shm: %s revoked buffer %#x", link.engine_id, addr)

    def _peer_closed(self, link: _Link) -> None:
        """The peer's control connection dropped: it died or closed. Fail its slices, drop mappings."""
        if self._executor is None or self._lib is None:
            return
        link.dead = True
        self._lib.peer_set_dead(self._executor.handle, link.handle)
        with link.lock:
            for m in list(link.maps.values()):
                self._unmap(link, m)
            link.maps.clear()
        log.info("shm: memfd peer %s went away", link.engine_id)

    def _teardown(self, link: _Link) -> None:
        """Remove a link (caller holds self._lock)."""
        assert self._lib is not None and self._executor is not None
        self._links.pop(link.engine_id, None)
        self._by_handle.pop(link.handle, None)
        if link.conn is not None:
            link.conn.close()
        self._lib.peer_remove(self._executor.handle, link.handle)  # waits for copies in flight
        with link.lock:
            for m in link.maps.values():
                if m.local:
                    self._lib.munmap(m.local, m.length)
            link.maps.clear()

    def disconnect(self, link: PeerLink) -> None:
        with self._lock:
            lk = self._by_handle.get(link.handle)
            if lk is not None:
                self._teardown(lk)

    def close(self) -> None:
        with self._lock:
            if self._executor is None:
                return
            for lk in list(self._links.values()):
                self._teardown(lk)
            if self._server is not None:
                self._server.close()
                self._server = None
            self._executor.close()
            self._executor = None


@hookimpl
def tent_register_transports(registry: Any) -> None:
    registry.add(
        "shm",
        ShmTransport,
        abi_version=EXECUTOR_ABI_VERSION,
        version=__version__,
        description="same-host copies: process_vm_readv/writev (CMA) or memfd mappings",
    )
