"""Embedded peer-to-peer metadata exchange.

Every engine answers metadata queries on its own control port (ZeroMQ ROUTER,
msgpack messages): nothing else to start. A peer asks ``describe`` and gets the
engine's host identity, its transports' descriptors and its segments' buffers.
Malformed messages get an error reply and are logged; the server keeps serving.

A handler may return a `concurrent.futures.Future` instead of a reply (target staging's copies):
the server keeps serving and sends the future's result when it completes (at most
`MAX_DEFERRED` replies outstanding; beyond that a request is refused as busy).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import msgpack
import zmq

from .errors import PeerUnreachableError, ProtocolError

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
MAX_DEFERRED = 4096


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


class ControlServer:
    """Serves `handler(request) -> reply` on a ROUTER socket in a daemon thread."""

    def __init__(
        self, host: str, port: int, handler: Callable[[dict[str, Any]], dict[str, Any] | Future[dict[str, Any]]]
    ) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
        else:
            port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.host, self.port = host, port
        self._handler = handler
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tent-control-{port}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)  # deferred replies ready
        poller.register(wake_r, zmq.POLLIN)
        deferred: list[tuple[bytes, Any, Future[dict[str, Any]]]] = []

        def ready(_: Future[dict[str, Any]]) -> None:
            try:
                os.write(wake_w, b"x")
            except OSError:
                pass  # pipe full: the server is awake already, or closed

        try:
            while not self._stop.is_set():
                events = dict(poller.poll(100))
                if wake_r in events:
                    try:
                        os.read(wake_r, 4096)
                    except OSError:
                        pass
                if deferred:
                    still = []
                    for ident, rid, fut in deferred:
                        if fut.done():
                            self._send(ident, _deferred_reply(fut, rid))
                        else:
                            still.append((ident, rid, fut))
                    deferred = still
                if self._sock not in events:
                    continue
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK)
                except zmq.ZMQError:
                    continue
                ident, payload = frames[0], frames[-1]
                reply = self._dispatch(payload)
                if isinstance(reply, _Deferred):
                    if len(deferred) >= MAX_DEFERRED:
                        self._send(ident, {"ok": False, "error": "busy: too many replies outstanding", "id": reply.rid})
                        continue
                    deferred.append((ident, reply.rid, reply.future))
                    reply.future.add_done_callback(ready)
                    continue
                self._send(ident, reply)
        finally:
            for ident, rid, _ in deferred:
                self._send(ident, {"ok": False, "error": "engine closing", "id": rid})
            self._sock.close(0)
            os.close(wake_r)
            os.close(wake_w)

    def _send(self, ident: bytes, reply: dict[str, Any]) -> None:
        try:
            self._sock.send_multipart([ident, b"", msgpack.packb(reply, use_bin_type=True)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            log.debug("control reply dropped: %s", exc)

    def _dispatch(self, payload: bytes) -> dict[str, Any] | _Deferred:
        try:
            msg = msgpack.unpackb(payload, raw=False, strict_map_key=True)
        except Exception as exc:
            log.warning("control: undecodable message (%d bytes): %s", len(payload), exc)
            return {"ok": False, "error": "malformed: not msgpack"}
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            log.warning("control: malformed message %r", type(msg).__name__)
            return {"ok": False, "error": "malformed: expected a map with an 'op' string"}
        rid = msg.get("id")
        try:
            reply = self._handler(msg)
        except ProtocolError as exc:
            log.warning("control: bad request %s: %s", msg.get("op"), exc)
            reply = {"ok": False, "error": str(exc)}
        except Exception as exc:  # keep serving whatever happens
            log.exception("control: handler failed for %s", msg.get("op"))
            reply = {"ok": False, "error": f"internal: {type(exc).__name__}: {exc}"}
        if isinstance(reply, Future):
            return _Deferred(reply, rid)
        reply["id"] = rid
        return reply

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class _Deferred:
    __slots__ = ("future", "rid")

    def __init__(self, future: Future[dict[str, Any]], rid: Any) -> None:
        self.future, self.rid = future, rid


def _deferred_reply(fut: Future[dict[str, Any]], rid: Any) -> dict[str, Any]:
    try:
        reply = dict(fut.result(0))
    except Exception as exc:
        log.exception("control: a deferred reply failed")
        reply = {"ok": False, "error": f"internal: {type(exc).__name__}: {exc}"}
    reply["id"] = rid
    return reply


class ControlClient:
    """Request/reply to one peer's control port, every call with a deadline."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._ctx = zmq.Context.instance()
        self._lock = threading.Lock()
        self._sock: zmq.Socket | None = None
        self._next_id = 0

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            s = self._ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(f"tcp://{self.endpoint}")
            self._sock = s
        return self._sock

    def call(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            self._next_id += 1
            rid = self._next_id
            msg = dict(msg, id=rid, v=PROTOCOL_VERSION)
            sock = self._socket()
            sock.send_multipart([b"", msgpack.packb(msg, use_bin_type=True)])
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000) + 1):
                    # drop the socket: a late reply must not be read as the next call's answer
                    sock.close(0)
                    self._sock = None
                    raise PeerUnreachableError(f"engine {self.endpoint} did not answer {msg['op']!r} within {timeout:g}s")
                frames = sock.recv_multipart()
                try:
                    reply = msgpack.unpackb(frames[-1], raw=False)
                except Exception as exc:
                    raise ProtocolError(f"engine {self.endpoint} sent an undecodable reply") from exc
                if isinstance(reply, dict) and reply.get("id") == rid:
                    return reply

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(0)
                self._sock = None
