"""ZeroMQ ROUTER loop around the pure ServerState.

One thread owns the socket and the state: it drains every ready frame, hands each request to the
state machine, groups the replies by destination and sends one frame per destination (a map when a
single reply, an array when several), then applies the timeouts (``tick``) at most every
``tick_s`` seconds. A malformed frame gets an error reply and a (rate-limited) log line; the loop
keeps serving.

Authentication (SECURITY.md): with a cluster token (``--auth-token-file``, ``REFHUB_AUTH_TOKEN`` or
``TENT_AUTH_TOKEN``) every client runs the challenge-response of :mod:`tent_core.auth` first and tags
every frame after it; the state machine sees only authenticated requests. A token is required as
soon as the server binds a non-loopback address.

Bounded: frames over ``max_msg_bytes`` drop the connection (ZMQ_MAXMSGSIZE); each client's reply
queue holds ``send_hwm`` frames and replies beyond it are dropped (counted in ``stats``: a client
that never reads cannot grow the server); each client's inbound queue holds ``recv_hwm`` frames.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import zmq

from tent_core.auth import ClusterAuth, ZmqServerAuth, load_token, resolve
from tent_core.ratelog import RateLimitedLog

from . import protocol
from .protocol import E_BAD_MESSAGE, ProtocolError
from .state import ServerState

log = logging.getLogger("refhub.server")

MAX_BATCH = 4096
MAX_MSG_BYTES = 64 << 20  # a publish carries a layout and per-tensor checksums: large models need MiBs
# Reply frames queued per client, each at most FRAME_BYTES unless a single reply is larger (a reference,
# <= protocol.MAX_REF_BYTES): what a client that never reads can pin in this process is bounded by
# about SEND_HWM x FRAME_BYTES; replies beyond it are dropped and counted.
SEND_HWM = 100
FRAME_BYTES = 1 << 20
RECV_HWM = 10000  # request frames queued per client before ZeroMQ stops reading its socket
HANDSHAKE_MS = 5000
FROM_ENV: Any = object()


def server_auth(bind: str, token: str = "", token_file: str = "", require: str | None = None,
                env: Mapping[str, str] | None = None) -> ClusterAuth | None:
    """The refhub server's auth: a token from the arguments, $REFHUB_AUTH_TOKEN[_FILE] or $TENT_AUTH_TOKEN[_FILE]."""
    env = os.environ if env is None else env
    tok = load_token(token, token_file, env, env_prefix="REFHUB") or load_token(env=env)
    req = require or env.get("REFHUB_REQUIRE_AUTH") or env.get("TENT_REQUIRE_AUTH") or "non_loopback"
    return resolve(tok, [bind], require=req, what="refhub server")


def client_auth(env: Mapping[str, str] | None = None) -> ClusterAuth | None:
    """A refhub client's auth from the environment (same variables as the server)."""
    env = os.environ if env is None else env
    tok = load_token(env=env, env_prefix="REFHUB") or load_token(env=env)
    return ClusterAuth.from_token(tok) if tok else None


class Server:
    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        hb_timeout: float = 5.0,
        barrier_timeout: float = 30.0,
        tick_s: float = 0.1,
        context: zmq.Context | None = None,
        pipeline: bool = True,
        auth: ClusterAuth | None = FROM_ENV,
        max_msg_bytes: int = MAX_MSG_BYTES,
        send_hwm: int = SEND_HWM,
        recv_hwm: int = RECV_HWM,
    ) -> None:
        if auth is FROM_ENV:
            auth = server_auth(bind)
        self.auth: ClusterAuth | None = auth
        self.sessions = ZmqServerAuth(auth.key("refhub") if auth else None)
        self.ctx = context or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # mandatory: a reply to a client whose queue is full raises EAGAIN (counted, dropped) instead
        # of vanishing silently
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.SNDHWM, send_hwm)
        self.sock.setsockopt(zmq.RCVHWM, recv_hwm)
        self.sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)  # a silent TCP connection is dropped by then
        self.sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
        try:
            self.sock.bind(bind)
        except BaseException:
            self.sock.close(0)
            raise
        self.address: str = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.state = ServerState(hb_timeout=hb_timeout, barrier_timeout=barrier_timeout, epoch=uuid.uuid4().hex[:12],
                                 pipeline=pipeline)
        self.tick_s = tick_s
        self._stop = threading.Event()
        self.frames = 0
        self.dropped = 0  # replies not sent: the client's queue was full or it is gone
        self.rlog = RateLimitedLog(log)
        self.state.stats_hook = self._io_stats

    def _io_stats(self) -> dict[str, Any]:
        return {"frames": self.frames, "dropped": self.dropped, "denied": self.sessions.denied,
                "sessions": self.sessions.session_count(), "auth": self.auth is not None,
                "log_suppressed": self.rlog.suppressed_total + self.state.rlog.suppressed_total}

    def stop(self) -> None:
        self._stop.set()

    def stats(self) -> dict[str, Any]:
        return self.state.stats()

    def serve_forever(self) -> None:
        sock = self.sock
        state = self.state
        handle = state.handle
        unpack = protocol.unpack
        accept = self.sessions.accept
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        last_tick = time.monotonic()
        tick_ms = max(1, int(self.tick_s * 1000))
        log.info("refhub server %s listening on %s (auth %s)", state.epoch, self.address,
                 f"on, token {self.auth.fingerprint}" if self.auth else "off")
        NOBLOCK = zmq.NOBLOCK
        Again = zmq.Again
        while not self._stop.is_set():
            if not poller.poll(tick_ms):
                now = time.monotonic()
            else:
                now = time.monotonic()
                outq: dict[Any, list] = {}
                for _ in range(MAX_BATCH):
                    try:
                        frames = sock.recv_multipart(NOBLOCK)
                    except Again:
                        break
                    self.frames += 1
                    ident = frames[0]
                    payload, refusal = accept(ident, frames[1:], now)
                    if refusal is not None:
                        if refusal[0].startswith(b"TENTDENY"):
                            self.rlog.warning("auth", "refused a client: %s", self.sessions.last_denial)
                        self._send(ident, refusal)
                        continue
                    try:
                        msg = unpack(payload)
                    except ProtocolError as exc:
                        state.errors += 1
                        self.rlog.warning("bad-frame", "bad frame from %.40r: %s", ident, exc)
                        outq.setdefault(ident, []).append({"rid": 0, "ok": False, "err": E_BAD_MESSAGE, "msg": str(exc)})
                        continue
                    if type(msg) is list:
                        if len(msg) > MAX_BATCH:
                            state.errors += 1
                            outq.setdefault(ident, []).append(
                                {"rid": 0, "ok": False, "err": E_BAD_MESSAGE, "msg": f"more than {MAX_BATCH} requests in a frame"})
                            continue
                        for m in msg:
                            for dest, rep in handle(ident, m, now):
                                q = outq.get(dest)
                                if q is None:
                                    outq[dest] = [rep]
                                else:
                                    q.append(rep)
                    else:
                        for dest, rep in handle(ident, msg, now):
                            q = outq.get(dest)
                            if q is None:
                                outq[dest] = [rep]
                            else:
                                q.append(rep)
                self._flush(outq)
            if now - last_tick >= self.tick_s:
                last_tick = now
                self.sessions.expire(now)
                replies = state.tick(now)
                if replies:
                    self._send_all(replies)
        sock.close(0)
        log.info("refhub server %s stopped", state.epoch)

    def _send(self, dest: Any, body: list[bytes]) -> None:
        try:
            self.sock.send_multipart((dest, *body), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # queue full or peer gone: soft state, the client retries
            self.dropped += 1
            self.rlog.info("dropped", "reply to %.40r dropped: %s", dest, exc)

    def _flush(self, outq: dict[Any, list]) -> None:
        wrap = self.sessions.wrap
        for dest, reps in outq.items():
            for data in _frames(reps):
                self._send(dest, wrap(dest, data))

    def _send_all(self, replies: list) -> None:
        outq: dict[Any, list] = {}
        for dest, rep in replies:
            outq.setdefault(dest, []).append(rep)
        self._flush(outq)


def _array(parts: list[bytes]) -> bytes:
    """A msgpack array of already packed items (no repacking)."""
    n = len(parts)
    head = bytes([0x90 | n]) if n < 16 else (b"\xdc" + n.to_bytes(2, "big") if n < 65536 else b"\xdd" + n.to_bytes(4, "big"))
    return head + b"".join(parts)


def _frames(reps: list) -> Iterator[bytes]:
    """The replies packed into frames of at most FRAME_BYTES (a single larger reply stays whole); each
    reply is packed once, and only one frame's worth is held at a time."""
    pack = protocol.pack
    if len(reps) == 1:
        yield pack(reps[0])
        return
    batch: list[bytes] = []
    size = 0
    for rep in reps:
        b = pack(rep)
        if batch and size + len(b) > FRAME_BYTES:
            yield _array(batch) if len(batch) > 1 else batch[0]
            batch, size = [], 0
        batch.append(b)
        size += len(b)
    if batch:
        yield _array(batch) if len(batch) > 1 else batch[0]


_embedded: list[tuple[Server, threading.Thread]] = []


def start_embedded(bind: str = "tcp://127.0.0.1:0", **kw: Any) -> str:
    """Start a server in a daemon thread of this process; return its address (single-host case)."""
    srv = Server(bind, context=zmq.Context(), **kw)
    t = threading.Thread(target=srv.serve_forever, name=f"refhub-server-{srv.address}", daemon=True)
    t.start()
    _embedded.append((srv, t))
    return srv.address


def stop_embedded(address: str | None = None) -> None:
    for srv, t in list(_embedded):
        if address is None or srv.address == address:
            srv.stop()
            t.join(timeout=5)
            _embedded.remove((srv, t))


def serve(bind: str, hb_timeout: float = 5.0, barrier_timeout: float = 30.0, pipeline: bool = True,
          auth: ClusterAuth | None = FROM_ENV, metrics_port: int = 0) -> None:
    srv = Server(bind, hb_timeout=hb_timeout, barrier_timeout=barrier_timeout, pipeline=pipeline, auth=auth)
    if metrics_port:
        from .metrics import expose

        expose(srv, metrics_port)
    print(f"refhub server listening on {srv.address} (pid {os.getpid()}, epoch {srv.state.epoch})", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
