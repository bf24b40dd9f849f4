"""ZeroMQ ROUTER loop around the pure ServerState.

One thread owns the socket and the state: it drains every ready frame, hands each request to the
state machine, groups the replies by destination and sends one frame per destination (a map when a
single reply, an array when several), then applies the timeouts (``tick``) at most every
``tick_s`` seconds. A malformed frame gets an error reply and a log line; the loop keeps serving.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from typing import Any

import zmq

from . import protocol
from .protocol import E_BAD_MESSAGE, ProtocolError
from .state import ServerState

log = logging.getLogger("refhub.server")

MAX_BATCH = 4096


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
    ) -> None:
        self.ctx = context or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(bind)
        self.address: str = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.state = ServerState(hb_timeout=hb_timeout, barrier_timeout=barrier_timeout, epoch=uuid.uuid4().hex[:12],
                                 pipeline=pipeline)
        self.tick_s = tick_s
        self._stop = threading.Event()
        self.frames = 0

    def stop(self) -> None:
        self._stop.set()

    def serve_forever(self) -> None:
        sock = self.sock
        state = self.state
        handle = state.handle
        unpack = protocol.unpack
        pack = protocol.pack
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        last_tick = time.monotonic()
        tick_ms = max(1, int(self.tick_s * 1000))
        log.info("refhub server %s listening on %s", state.epoch, self.address)
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
                        ident, payload = sock.recv_multipart(NOBLOCK)
                    except Again:
                        break
                    except ValueError:  # wrong number of frames
                        continue
                    self.frames += 1
                    try:
                        msg = unpack(payload)
                    except ProtocolError as exc:
                        state.errors += 1
                        log.warning("bad frame from %r: %s", ident, exc)
                        outq.setdefault(ident, []).append({"rid": 0, "ok": False, "err": E_BAD_MESSAGE, "msg": str(exc)})
                        continue
                    if type(msg) is list:
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
                for dest, reps in outq.items():
                    try:
                        sock.send_multipart((dest, pack(reps[0] if len(reps) == 1 else reps)), NOBLOCK)
                    except zmq.ZMQError as exc:  # peer gone or queue full: soft state, the client retries
                        log.debug("reply to %r dropped: %s", dest, exc)
            if now - last_tick >= self.tick_s:
                last_tick = now
                replies = state.tick(now)
                if replies:
                    self._send_all(replies)
        sock.close(0)
        log.info("refhub server %s stopped", state.epoch)

    def _send_all(self, replies: list) -> None:
        outq: dict[Any, list] = {}
        for dest, rep in replies:
            outq.setdefault(dest, []).append(rep)
        for dest, reps in outq.items():
            try:
                self.sock.send_multipart((dest, protocol.pack(reps[0] if len(reps) == 1 else reps)), zmq.NOBLOCK)
            except zmq.ZMQError:
                pass


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
          metrics_port: int = 0) -> None:
    srv = Server(bind, hb_timeout=hb_timeout, barrier_timeout=barrier_timeout, pipeline=pipeline)
    if metrics_port:
        from .metrics import expose

        expose(srv, metrics_port)
    print(f"refhub server listening on {srv.address} (pid {os.getpid()}, epoch {srv.state.epoch})", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
