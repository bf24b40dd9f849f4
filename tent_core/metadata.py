"""Embedded peer-to-peer metadata exchange.

Every engine answers metadata queries on its own control port (ZeroMQ ROUTER,
msgpack messages): nothing else to start. A peer asks ``describe`` and gets the
engine's host identity, its transports' descriptors and its segments' buffers.
Malformed messages get an error reply and are logged (rate-limited); the server keeps serving.

Authentication (SECURITY.md): with a cluster token every peer runs the challenge-response of
:mod:`tent_core.auth` before its first request and every frame after it carries a session tag;
an unauthenticated caller gets a refusal and nothing else (no pid, no addresses, no descriptors).
Bounded: requests over `control_max_request_bytes` drop the connection (ZMQ_MAXMSGSIZE), each
peer's reply queue holds `control_send_hwm` messages, handshakes and sessions are capped.

A handler may return a `concurrent.futures.Future` or a `BatchReply` instead of a reply: the
server keeps serving and sends the reply when the future or the batch completes (at most
`MAX_DEFERRED` replies outstanding; beyond that a request is refused as busy). A `BatchReply`
(target staging's copies) needs no thread of its own: the thread that finishes its batch signals
the server's eventfd (`_native.Notifier`) and the serving thread builds and sends the reply.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import msgpack
import zmq

from . import _native
from .auth import AuthError, ClusterAuth, HandshakeTimeout, SessionLost, ZmqClientAuth, ZmqServerAuth, default_auth
from .config import EngineConfig
from .errors import PeerUnreachableError, ProtocolError
from .ratelog import RateLimitedLog

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
_DEFAULTS = EngineConfig()
# auth=FROM_ENV: take the cluster token from $TENT_AUTH_TOKEN[_FILE] (components built without an engine config)
FROM_ENV: Any = object()
RECV_HWM = 1000  # messages queued from one peer before ZeroMQ stops reading its socket
MAX_DEFERRED = 4096  # deferred replies outstanding before requests are refused as busy


def host_identity() -> str:
    """Same kernel and pid namespace = same host (network namespaces don't matter for CMA)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "unknown-boot"
    try:
        pidns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        pidns = 0
    return f"{boot}/{pidns}"


_LIVE_SERVERS: weakref.WeakSet[ControlServer] = weakref.WeakSet()


def _stop_servers_at_exit() -> None:
    """Stop the serving threads of engines never closed before the interpreter finalizes: a daemon
    thread that returns from a ZeroMQ poll during finalization is ended with pthread_exit, and the
    unwinding through the C++ frames of the binding aborts the process ("terminate called without an
    active exception", exit status 134) after all its work was done."""
    servers = list(_LIVE_SERVERS)
    for srv in servers:
        srv._stop.set()
    for srv in servers:
        srv._thread.join(timeout=2)


atexit.register(_stop_servers_at_exit)


class ControlServer:
    """Serves `handler(request) -> reply` on a ROUTER socket in a daemon thread.

    With `auth` (a ClusterAuth), only peers that completed the handshake reach `handler`.
    """

    def __init__(
        self,
        host: str,
        port: int,
        handler: Callable[[dict[str, Any]], dict[str, Any] | Future[dict[str, Any]] | BatchReply],
        *,
        auth: ClusterAuth | None = FROM_ENV,
        max_request_bytes: int = _DEFAULTS.control_max_request_bytes,
        send_hwm: int = _DEFAULTS.control_send_hwm,
        handshake_ms: int = _DEFAULTS.control_handshake_ms,
    ) -> None:
        if auth is FROM_ENV:
            auth = default_auth([host], what="engine control port")
        self.auth: ClusterAuth | None = auth
        self._sessions = ZmqServerAuth(auth.key("control") if auth else None)
        self._rlog = RateLimitedLog(log)
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_request_bytes)
        self._sock.setsockopt(zmq.SNDHWM, send_hwm)
        self._sock.setsockopt(zmq.RCVHWM, RECV_HWM)
        self._sock.setsockopt(zmq.HANDSHAKE_IVL, handshake_ms)
        try:
            if port:
                self._sock.bind(f"tcp://{host}:{port}")
            else:
                port = self._sock.bind_to_random_port(f"tcp://{host}")
        except BaseException:
            self._sock.close(0)
            raise
        self.host, self.port = host, port
        self._handler = handler
        self._stop = threading.Event()
        self.requests = 0
        self._thread = threading.Thread(target=self._run, name=f"tent-control-{port}", daemon=True)
        self._thread.start()
        _LIVE_SERVERS.add(self)

    @property
    def denied(self) -> int:
        """Requests and handshakes refused for lack of authentication."""
        return self._sessions.denied

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # deferred replies ready
        poller.register(wake_r, zmq.POLLIN)
        notifier = self._notifier = _native.Notifier()  # batches of BatchReplies finished
        poller.register(notifier.fileno(), zmq.POLLIN)
        self._deferred: list[tuple[bytes, Any, Future[dict[str, Any]] | BatchReply]] = []
        self._wake_w = wake_w
        last_expire = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if now - last_expire > 1.0:
                    last_expire = now
                    self._sessions.expire(now)
                events = dict(poller.poll(100))
                if wake_r in events:
                    try:
                        os.read(wake_r, 4096)
                    except OSError:
                        pass
                if notifier.fileno() in events:
                    notifier.drain()
                # every tick too: a BatchReply's done() also enforces its batch's deadline
                if self._deferred:
                    self._flush_deferred()
                if self._sock not in events:
                    continue
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:
                    continue
                try:
                    self._serve_one(frames)
                except Exception:  # keep serving whatever happens
                    log.exception("control: failed to serve a request")
        finally:
            for ident, rid, _ in self._deferred:
                self._send_reply(ident, {"ok": False, "error": "engine closing", "id": rid})
            self._deferred = []
            self._sock.close(0)
            # the eventfd closes once no armed batch holds it any more (now, unless copies still run)
            del self._notifier, notifier
            os.close(wake_r)
            os.close(wake_w)

    def _wake(self, _: Future[dict[str, Any]]) -> None:
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass  # pipe full: the server is awake already, or closed

    def _flush_deferred(self) -> None:
        still = []
        for ident, rid, fut in self._deferred:
            try:
                ready = fut.done()
            except Exception as exc:  # a BatchReply's own code: keep serving, the caller hears of it
                log.exception("control: a deferred reply failed")
                self._send_reply(ident, {"ok": False, "error": f"internal: {type(exc).__name__}: {exc}", "id": rid})
                continue
            if ready:
                self._send_reply(ident, _deferred_reply(fut, rid))
            else:
                still.append((ident, rid, fut))
        self._deferred = still

    def _serve_one(self, frames: list[bytes]) -> None:
        ident = frames[0]
        # DEALER peers send [b"", payload(, tag)]; tolerate a missing delimiter
        body = frames[2:] if len(frames) >= 3 and frames[1] == b"" else frames[1:]
        payload, refusal = self._sessions.accept(ident, body)
        if refusal is not None:
            if refusal[0].startswith(b"TENTDENY"):
                self._rlog.warning("auth", "control: refused a peer: %s", self._sessions.last_denial)
            self._send(ident, refusal)
            return
        assert payload is not None
        self.requests += 1
        reply = self._dispatch(payload)
        if isinstance(reply, _Deferred):
            if len(self._deferred) >= MAX_DEFERRED:
                self._send_reply(ident, {"ok": False, "error": "busy: too many replies outstanding", "id": reply.rid})
                return
            self._deferred.append((ident, reply.rid, reply.future))
            if isinstance(reply.future, BatchReply):
                reply.future.arm(self._notifier)
            else:
                reply.future.add_done_callback(self._wake)
            return
        self._send_reply(ident, reply)

    def _send_reply(self, ident: bytes, reply: dict[str, Any]) -> None:
        self._send(ident, self._sessions.wrap(ident, msgpack.packb(reply, use_bin_type=True)))

    def _send(self, ident: bytes, body: list[bytes]) -> None:
        try:
            self._sock.send_multipart([ident, b"", *body], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("control reply dropped: %s", exc)

    def _dispatch(self, payload: bytes) -> dict[str, Any] | _Deferred:
        try:
            msg = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        except Exception as exc:
            self._rlog.warning("malformed", "control: undecodable message (%d bytes): %s", len(payload), exc)
            return {"ok": False, "error": "malformed: not msgpack"}
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            self._rlog.warning("malformed", "control: malformed message %r", type(msg).__name__)
            return {"ok": False, "error": "malformed: expected a map with an 'op' string"}
        rid = msg.get("id")
        try:
            reply = self._handler(msg)
        except ProtocolError as exc:
            self._rlog.warning("bad-request", "control: bad request %.40r: %s", msg.get("op"), exc)
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # keep serving whatever happens
            if self._rlog.allow("internal")[0]:
                log.exception("control: handler failed for %.40r", msg.get("op"))
            reply = {"ok": False, "error": f"internal: {type(exc).__name__}: {exc}"}
        rid = rid if isinstance(rid, int) else None
        if isinstance(reply, (Future, BatchReply)):
            return _Deferred(reply, rid)
        reply["id"] = rid
        return reply

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class BatchReply:
    """A reply deferred until `batch` (a `_native.Batch`, e.g. a BatchHandle) finishes. The server
    arms the batch with its notifier, so the thread that finishes the batch wakes the serving thread
    directly. Subclasses give `reply()`, called once on the serving thread after `done()` answered
    True; `done()` never blocks, and the server also asks it every poll tick (100 ms), so a subclass
    can end a batch that outlives its deadline there."""

    __slots__ = ("batch",)

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def arm(self, notifier: Any) -> None:
        """Called once by the server: signal `notifier` when the reply is ready (a subclass whose
        batch starts later arms it then)."""
        self.batch.notify(notifier)

    def done(self) -> bool:
        return bool(self.batch.remaining == 0)

    def reply(self) -> dict[str, Any]:
        raise NotImplementedError


class _Deferred:
    __slots__ = ("future", "rid")

    def __init__(self, future: Future[dict[str, Any]] | BatchReply, rid: Any) -> None:
        self.future, self.rid = future, rid


def _deferred_reply(fut: Future[dict[str, Any]] | BatchReply, rid: Any) -> dict[str, Any]:
    try:
        reply = dict(fut.reply() if isinstance(fut, BatchReply) else fut.result(0))
    except Exception as exc:
        log.exception("control: a deferred reply failed")
        reply = {"ok": False, "error": f"internal: {type(exc).__name__}: {exc}"}
    reply["id"] = rid
    return reply


class ControlClient:
    """Request/reply to one peer's control port, every call with a deadline.

    With `auth`, the first call authenticates (and a call the server refuses for a lost session
    re-authenticates once); a peer that cannot prove the cluster secret raises AuthError.
    """

    def __init__(
        self,
        endpoint: str,
        *,
        auth: ClusterAuth | None = FROM_ENV,
        max_reply_bytes: int = _DEFAULTS.control_max_reply_bytes,
        send_hwm: int = _DEFAULTS.control_send_hwm,
    ) -> None:
        if auth is FROM_ENV:
            auth = default_auth((), what="engine control client")
        self.endpoint = endpoint
        self._auth = ZmqClientAuth(auth.key("control") if auth else None)
        self._max_reply = max_reply_bytes
        self._send_hwm = send_hwm
        self._ctx = zmq.Context.instance()
        self._lock = threading.Lock()
        self._sock: zmq.Socket | None = None
        self._next_id = 0
        self._poller: zmq.Poller | None = None  # `replies` with a wake_fd: the socket and that fd
        self._poller_key: tuple[int, int] | None = None

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.MAXMSGSIZE, self._max_reply)
            s.setsockopt(zmq.SNDHWM, self._send_hwm)
            s.setsockopt(zmq.RCVHWM, self._send_hwm)
            s.connect(f"tcp://{self.endpoint}")
            self._sock = s
            self._auth.reset()
        return self._sock

    def _drop_socket(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        self._poller = self._poller_key = None
        self._auth.reset()

    def call(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            deadline = time.monotonic() + timeout
            for attempt in range(2):
                try:
                    sock, rid = self._post(msg, deadline - time.monotonic(), timeout)
                    return self._await(sock, rid, msg["op"], deadline, timeout)
                except SessionLost as exc:
                    self._auth.reset()
                    if attempt == 0 and self._auth.enabled:
                        continue  # the server dropped our session (restart, eviction): authenticate again
                    raise AuthError(f"engine {self.endpoint} refused {msg['op']!r}: {exc}") from None
                except AuthError as exc:
                    self._drop_socket()
                    raise AuthError(f"engine {self.endpoint}: {exc}") from None
            raise AssertionError("unreachable")

    def _await(self, sock: zmq.Socket, rid: int, op: str, deadline: float, timeout: float) -> dict[str, Any]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000) + 1):
                # drop the socket: a late reply must not be read as the next call's answer
                self._drop_socket()
                raise PeerUnreachableError(f"engine {self.endpoint} did not answer {op!r} within {timeout:g}s")
            reply = self._decode(sock.recv_multipart())
            if isinstance(reply, dict) and reply.get("id") == rid:
                return reply

    def _decode(self, frames: list[bytes]) -> Any:
        """A reply's message; None for one that does not authenticate (dropped, logged). A lost
        session (SessionLost) is the caller's to handle."""
        body = frames[1:] if frames and frames[0] == b"" else frames
        try:
            payload = self._auth.unwrap(body)
        except SessionLost:
            raise
        except AuthError as exc:
            log.warning("control: dropped a reply from %s that does not authenticate: %s", self.endpoint, exc)
            return None
        try:
            return msgpack.unpackb(payload, raw=False)
        except Exception as exc:
            raise ProtocolError(f"engine {self.endpoint} sent an undecodable reply") from exc

    # ---- several requests in flight (one owner thread): send now, collect the replies later ---------

    def send(self, msg: dict[str, Any], timeout: float) -> int:
        """Send one request without waiting for its reply; returns its id, whose reply a later
        `replies` hands back. For one thread that keeps several requests with the peer at once
        (target staging's chunk copies) without a thread per request in flight. `timeout` bounds
        only the authentication of a new connection."""
        with self._lock:
            try:
                return self._post(msg, timeout, timeout)[1]
            except AuthError as exc:
                self._drop_socket()
                raise AuthError(f"engine {self.endpoint}: {exc}") from None

    def _post(self, msg: dict[str, Any], handshake_s: float, timeout: float) -> tuple[zmq.Socket, int]:
        """(Under the lock.) Send one request, authenticating a new connection first (within
        `handshake_s`); its socket and id."""
        self._next_id += 1
        rid = self._next_id
        out = dict(msg, id=rid, v=PROTOCOL_VERSION)
        sock = self._socket()
        try:
            if not self._auth.ready:
                self._auth.handshake(sock, max(0.001, handshake_s), prefix=[b""])
        except HandshakeTimeout:
            self._drop_socket()
            raise PeerUnreachableError(f"engine {self.endpoint} did not answer {out['op']!r} within {timeout:g}s") from None
        sock.send_multipart([b"", *self._auth.wrap(msgpack.packb(out, use_bin_type=True))])
        return sock, rid

    def replies(self, timeout: float, wake_fd: int | None = None) -> list[dict[str, Any]]:
        """The replies that have arrived to `send`s, waiting up to `timeout` for the first one
        (0: only those already here). Each carries its request's ``id``. With `wake_fd`, the wait
        also ends once that descriptor is readable (a `_native.Notifier` that the caller's batches
        signal), so one thread sleeps on its replies and its data legs at once; the caller drains it."""
        out: list[dict[str, Any]] = []
        with self._lock:
            sock = self._sock
            if sock is None:
                return out
            if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # nothing queued: wait (or not) for it
                if timeout <= 0:
                    return out
                ms = max(1, int(timeout * 1000 + 0.999))  # a sub-millisecond wait must not become a busy poll
                if wake_fd is None:
                    if not sock.poll(ms):
                        return out
                else:
                    if self._poller is None or self._poller_key != (id(sock), wake_fd):
                        self._poller = zmq.Poller()
                        self._poller.register(sock, zmq.POLLIN)
                        self._poller.register(wake_fd, zmq.POLLIN)
                        self._poller_key = (id(sock), wake_fd)
                    if sock not in dict(self._poller.poll(ms)):
                        return out
            while True:
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    return out
                try:
                    reply = self._decode(frames)
                except SessionLost as exc:
                    self._auth.reset()
                    raise AuthError(f"engine {self.endpoint} dropped our session: {exc}") from None
                if isinstance(reply, dict):
                    out.append(reply)
                if not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # no exception to end the drain
                    return out

    def close(self) -> None:
        with self._lock:
            self._drop_socket()
