"""refhub client library: shard handles over a ZeroMQ connection, bytes moved by tent_core.

``refhub.open(model, replica=..., shard=..., num_shards=..., server=...)`` returns a ShardHandle.
Publishing passes a reference (the tensors stay where they are, registered with the engine); a
replicate READs the version straight from a peer's registered memory into this handle's tensors.

Layout of a shard as served to peers: one engine segment per handle holding, in this order, a
64-byte progress word, one contiguous *pack* buffer for every tensor under 2 MB, then each large
tensor registered in place (direct mode: zero copy). The byte stream a reader copies is the pack
followed by the large tensors sorted by name; the progress word ``(version << 40) | bytes`` says
how much of that stream a *receiving* replica already holds (pipeline replication).

Copy mode (``register(name, t, mode="copy")``): a tensor the application reallocates often is not
registered with the engine at all. Its bytes are served slice by slice through a few staging
buffers pre-registered once per handle: the reader asks the holder's *stager* (a small ZeroMQ
ROUTER next to the engine) to copy a slice into a free staging slot, READs the slot, and releases
it. A receiving copy-mode tensor lands in a registered landing buffer and is copied into place.

Verification: the publisher hashes every tensor once at publish (xxh3_64 when ``xxhash`` is
installed, adler32 otherwise); the reader hashes the bytes that landed in its own buffers and
compares. Where the path copies a one-piece READ on the submitting thread (the same-host transport),
one lane per core READs its tensors piece by piece and hashes each piece right after it landed,
while it is still in that core's cache (fused copy + hash); where that path also hashes inside its
own copy loop (``Transport.inline_digest``: the READ carries the tensor's running digest,
``engine.submit(..., digest=)``, tent/digest.h), the lanes READ 4 MiB pieces and hash nothing in
Python but what the copy did not fold. The digest stays the publisher's xxh3_64 of the whole
tensor (streamed equals one-shot): nothing changes on the wire or at publish. Elsewhere (tcp) a reader keeps a window
of READ batches in flight, each armed with the running digests of the large tensors it touches (one
``Digest(start, end)`` per tensor, ``RECV_DIGEST``): a transport that receives READ answers on its own
threads (``Transport.receive_digest``: tcp) folds every received run into its tensor's digest right
after it landed, in stream order across its connections; the worker lanes fold what it did not,
batch by batch as the bytes arrive, and compare each tensor once the prefix covers it; the pack of
tiny tensors once the prefix covers it. End-to-end verification of every byte overlaps with the
transfer.

Device tensors (CUDA, NPU, the tests' simulated device; `refhub.device`): registered in place in
direct mode (a reader's engine reaches them with a GPU-capable transport, or through the holder's
pinned staging), staged from the device into the stager's pinned slots in copy mode, landed in a
pinned buffer and copied onto the device by a copy-mode receiver. Their checksum is wsum64,
computed on the device (published as ``["wsum64", value]``) and checked where the received copy is:
on the receiving device, or on the landing buffer as each chunk passes.
"""

from __future__ import annotations

import atexit
import bisect
import itertools
import logging
import os
import queue
import threading
import time
import weakref
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

from tent_core import DIGESTS_PER_SUBMIT
from tent_core.auth import (
    AuthError,
    AuthRequiredError,
    ClusterAuth,
    HandshakeTimeout,
    SessionLost,
    ZmqClientAuth,
    ZmqServerAuth,
    is_loopback,
)
from tent_core.errors import NotReadyError
from tent_core.ratelog import RateLimitedLog
from tent_core.request import WaitWord

from .device import DeviceView, StreamHash, checksum_entry, device_view, wsum64_bytes
from .protocol import PackedMap
from .protocol import pack as _pack
from .server import client_auth
from .window import RequestDelay, full_read_in_order

log = logging.getLogger("refhub.client")
_rlog = RateLimitedLog(log)
_FROM_ENV: Any = object()

TINY = 2 * 1024 * 1024
MB = 1024 * 1024
CHUNK = int(float(os.environ.get("REFHUB_CHUNK_MB", "4")) * MB)  # one READ request at most
BATCH = int(float(os.environ.get("REFHUB_BATCH_MB", "16")) * MB)  # bytes per submitted batch at most
BATCH_S = float(os.environ.get("REFHUB_BATCH_S", "0.02"))  # ... and about this many seconds of the measured
# rate (>= 1 MB): a reader's progress word (what readers of its partial copy see) advances once a batch has
# landed, so on a slow link every hop of a pipeline chain trails the one before by about one batch. (5 ms
# batches, four times as many, made a 6-hop chain slower on a loaded 2-core host: docs/benchmarks.md)
MIN_BATCH = MB
# Reading a partial copy: batches of about PARTIAL_BATCH_S of the measured rate (>= PARTIAL_MIN_BATCH)
PARTIAL_BATCH_S = float(os.environ.get("REFHUB_PARTIAL_BATCH_S", "0.005"))
PARTIAL_MIN_BATCH = 256 << 10
WINDOW = int(os.environ.get("REFHUB_WINDOW", "2"))  # batches in flight at least (the oldest is verified meanwhile)
# ... and up to this many seconds of measured rate, reading a complete copy. Its round trips are short (the
# request delay measured on the burst testbed: 2-7 ms mean per batch, refhub.window), but its own process is
# descheduled now and then (largest request delays 30-60 ms on a loaded 2-core host) and the source's link
# idles once the window has drained: at 50 ms the publisher's reader of a 6-hop chain took 1.26 s where
# one alone took 1.15 s, at 120 ms 1.17 s (interleaved; docs/benchmarks.md, "Burst"). What is in flight
# queues on the source's uplink only, so it delays no other hop of a chain (with 0.5 s for every reader,
# partial ones included, each hop trailed the one before by ~0.4 s: see PARTIAL_INFLIGHT_S).
INFLIGHT_S = float(os.environ.get("REFHUB_INFLIGHT_S", "0.12"))
# Reading a partial copy, a reader learns what its source holds from the progress word its batches read
# along, a word as old as what it has in flight (the batch queued behind it on the source's uplink); and it
# issues only what the source held: so each hop of a chain trails the one before by about twice its
# in-flight time plus the source's batch (100 ms instead of 50: each later hop trailed by 0.09-0.13 s
# instead of 0.05). But a partial reader needs enough in flight to keep its own link busy: with 10 ms, the
# second hop of a chain trailed by 0.25-0.5 s. PARTIAL_INFLIGHT_S of its rate, at least RTT_WINDOWS round
# trips of a tiny read (a long link's bandwidth-delay product) and PARTIAL_MIN_WINDOW.
PARTIAL_INFLIGHT_S = float(os.environ.get("REFHUB_PARTIAL_INFLIGHT_S", "0.05"))
RTT_WINDOWS = 3
PARTIAL_MIN_WINDOW = int(float(os.environ.get("REFHUB_PARTIAL_MIN_WINDOW_MB", "2")) * MB)
MAX_INFLIGHT = 1 << 30  # bytes in flight at most
# A partial reader that has issued all its source held ("caught up") learns more only when its oldest
# batch lands, with a progress word as old as that batch's wait behind the rest of its window. With
# PROGRESS_PROBE it also reads the word alone (one tiny READ outstanding at most, waited for up to
# PROBE_WAIT_S before it waits for the oldest batch), whose answer queues behind the link's backlog only.
PROGRESS_PROBE = os.environ.get("REFHUB_PROGRESS_PROBE", "1") != "0"
PROBE_WAIT_S = 0.02
PROBE_POLL_S = 0.001
# Waiting READs from a partial copy (engine.submit_when, where every transport to the source declares
# Transport.wait_read): each READ names the source's progress word and the stream position it needs,
# and the source's transport answers it once its own bytes are there. So the reader posts its window
# ahead of what the source holds (parked READs cost no link bytes) and the bytes leave the source as they
# land, instead of once the reader learned of them (a progress word as old as its window) and its request
# crossed its own uplink's queue. WAIT_INFLIGHT_S of the measured rate in flight (at least
# PARTIAL_MIN_WINDOW); a READ waits at most WAIT_TIMEOUT_S at the source, then fails NotReady and the
# pull re-issues from what landed (or goes on as before if the source no longer holds the version).
WAIT_READ = os.environ.get("REFHUB_WAIT_READ", "1") != "0"
WAIT_INFLIGHT_S = float(os.environ.get("REFHUB_WAIT_INFLIGHT_S", "0.1"))
WAIT_TIMEOUT_S = float(os.environ.get("REFHUB_WAIT_TIMEOUT_S", "0.2"))
# ... in READs of at most this many KiB: a connection parks one READ at a time and serves those behind
# it in order, so what a reader has parked at its source is its connections x the requests pipelined on
# each; requests up to the engine's small_request_bytes are pipelined (the tcp executor sends several
# on one connection), larger ones take a connection each (4: 20 ms of the link parked in 312 KB READs)
WAIT_PIECE = int(float(os.environ.get("REFHUB_WAIT_PIECE_KB", "256")) * 1024)
# ... and a reader of a complete copy too (its word already covers everything, so nothing waits): its
# READs then travel as the waiting ones do, in order on the transport's few waiting connections, so
# its own progress word (what its pipeline readers wait on) follows its landed bytes closely. Spread
# over all connections they land out of order and the word trails by what is in service at once
# (WAIT_FULL_SPREAD: the tcp transport's 4 bulk connections x RECV_DIGEST_PIECE): ~67 ms on a
# 500 Mbit/s link, every later hop of a chain inherits it; but in order costs a fast path ~40%
# (loopback tcp). "auto": in order once the server said a reader was routed to this copy (its "serving"
# event) and while the measured rate makes the spread lag by more than WAIT_FULL_LAG_S
# (refhub.window.full_read_in_order, re-judged as the rate is measured); "0": never;
# anything else (as before "auto" was the default): always
WAIT_FULL = os.environ.get("REFHUB_WAIT_FULL", "auto").strip().lower()
WAIT_FULL_LAG_S = float(os.environ.get("REFHUB_WAIT_FULL_LAG_S", "0.02"))
WAIT_FULL_SPREAD = 4 * MB
# A source whose every path has failed (stopped, or its links cut) is given up after this much silence
# and the bytes are read from another copy. The engine itself keeps such a request waiting until its
# deadline (a peer that comes back in time loses nothing), which for a pull is up to 10 s; refhub has
# other copies, so it asks each batch how long its peer has been silent while it waits
# (BatchHandle.silent_for). Silence starts once the engine has cut the stalled slices (~0.3-0.5 s).
SOURCE_SILENCE_S = float(os.environ.get("REFHUB_SOURCE_SILENCE_S", "0.5"))
SILENCE_POLL_S = 0.05  # how often a waiting pull asks
# the receive-side checksums run in a worker thread (xxhash releases the GIL) while this thread keeps the
# window of READs full; 0: inline, between batches
VERIFY_THREAD = os.environ.get("REFHUB_VERIFY_THREAD", "1") != "0"
# large host tensors are hashed batch by batch as their bytes land (streamed xxh3_64, the same digest as
# the whole tensor's), not once a whole tensor is in: the bytes are still in the CPU's cache; 0: whole
STREAM_VERIFY = os.environ.get("REFHUB_STREAM_VERIFY", "1") != "0"
HASH_PIECE = 256 << 10  # bytes per hash update
VERIFY_THREADS = int(os.environ.get("REFHUB_VERIFY_THREADS", "0"))  # hashing lanes; 0: one per core (at most 4)
# Fused copy + hash: when the path copies a READ of one piece on the submitting thread (the same-host
# transport runs a slice no longer than its chunk inline), each lane READs its tensors piece by piece and
# hashes every piece right after it landed, while it is in that core's cache: hashing from cache costs
# about a third of hashing from memory, and the copy then carries its own check. A path that does not
# complete a piece inside submit (tcp: the answer comes later) keeps the windowed pull. 0: off.
FUSED_VERIFY = os.environ.get("REFHUB_FUSED_VERIFY", "1") != "0"
FUSED_PIECE = int(float(os.environ.get("REFHUB_FUSED_PIECE_KB", "1024")) * 1024)  # <= the shm executor's chunk
FUSED_MAX_SHARE = 4  # fused only if no large tensor exceeds 1/(this x lanes) of the large bytes
# ... and where every route of the probe folds what it copies into a digest armed for the submit
# (Transport.inline_digest: the shm executor copies in 64 KiB runs and hashes each right after it
# landed, in C; tent/digest.h), a lane READs pieces of up to this many KiB (at most the transport's
# inline_bytes: it must copy them inside submit) and never touches the bytes in Python. 0: off (the
# lanes hash each FUSED_PIECE in Python).
DIGEST_PIECE = int(float(os.environ.get("REFHUB_DIGEST_PIECE_KB", "4096")) * 1024)
# ... and a lane READs whole tensors, as many as this many MiB hold, in one submit (a digest armed per
# tensor, at most FUSED_GROUP_MAX of them): one submit, one wait and one wake-up of the pulling thread
# per group instead of per piece. Groups shrink to 1/(FUSED_TAIL x lanes) of what is left, so the lanes
# finish together. 0: one tensor per submit.
FUSED_GROUP = int(float(os.environ.get("REFHUB_FUSED_GROUP_MB", "16")) * MB)
FUSED_GROUP_MAX = DIGESTS_PER_SUBMIT  # digests armed per submit at most (tent_core's limit)
FUSED_TAIL = 4
# The windowed pull (tcp) arms each batch with the digests of the large tensors it touches (one
# tent_core.Digest per tensor, bounded to its bytes): a transport that receives READ answers on its
# own threads (Transport.receive_digest) folds every received run into its tensor's digest right
# after it landed, in stream order; the verify lanes then fold only what was not (Digest.land) and
# compare. The digest is the same xxh3_64 of the whole tensor. 0: off (the lanes hash every byte).
RECV_DIGEST = os.environ.get("REFHUB_RECV_DIGEST", "1") != "0"
# ... and then a batch's READs are pieces of this many KiB (the tcp transport's slice), the tensors'
# pieces in turns: one stream's pieces spread over all connections at once land out of order, and
# what lands ahead of the stream is hashed later, from another core's cache (measured: ~45-80% of the
# bytes with 4-16 MiB of one tensor per batch, ~3-9% in turns)
RECV_DIGEST_PIECE = int(float(os.environ.get("REFHUB_RECV_DIGEST_PIECE_KB", "1024")) * 1024)
# ... and a tensor whose digest the transport folded whole is compared on the pulling thread when
# its last batch lands (a C call: no hop to a verify lane, no lane thread competing for the GIL with
# the submits); the lanes keep what the transport did not fold. 0: every check in the lanes.
INLINE_CHECK = os.environ.get("REFHUB_INLINE_CHECK", "1") != "0"
# Reading a partial copy, every batch also reads the source's progress word (into its own slot): each
# completion brings a fresh view of what the source holds, without a blocking round trip that would
# queue behind the batches on the wire and stall this reader's own progress (and its readers' after it).
PROGRESS_SLOTS = 256  # batches in flight at most while reading a partial copy
STAGE_SLOT = int(float(os.environ.get("REFHUB_STAGE_MB", "4")) * MB)  # copy mode: one staging slot
STAGE_SLOTS = int(os.environ.get("REFHUB_STAGE_SLOTS", "4"))  # copy mode: staging slots per handle
STAGE_DEPTH = 2  # copy mode: stage requests a reader keeps outstanding
STAGE_MAX_MSG = 64 << 10  # stage/release requests and replies are tiny
STAGE_HWM = 1000
MODES = ("direct", "copy")
OUTBOX_MAX = 100_000  # requests queued per connection (in the inproc queue, or while authenticating)
REOPEN_ATTEMPTS = 50  # a handle re-registering after a failover tries this often (each bounded by its request timeout)
MAX_REPLY_BYTES = 64 << 20  # a server reply (a list, a replicate with the source's layout)
VERSION_SHIFT = 40
BYTES_MASK = (1 << VERSION_SHIFT) - 1

try:  # optional, faster
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - depends on the environment
    _xxhash = None


class RefhubError(RuntimeError):
    def __init__(self, code: str, msg: str) -> None:
        super().__init__(f"{code}: {msg}")
        self.code = code


class VersionUnavailable(RefhubError):
    pass


class ServerFailover(RefhubError):
    pass


class ChecksumError(RefhubError):
    pass


def checksum(arr: np.ndarray | memoryview) -> int:
    mv = memoryview(arr).cast("B") if not isinstance(arr, np.ndarray) else memoryview(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))
    if _xxhash is not None:
        return _xxhash.xxh3_64_intdigest(mv)
    return zlib.adler32(mv) ^ (len(mv) << 32)


# --------------------------------------------------------------------------- connection


class _Worker:
    """One daemon thread running a connection's callbacks (server events, re-opens) in order.

    Not a ThreadPoolExecutor: the interpreter joins those at exit, and a re-open retrying against a
    server that is gone (the process is done with refhub but never closed a handle) would hold the
    exit for as long as its retries run."""

    def __init__(self, name: str) -> None:
        self._q: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if not self._stopped:
            self._q.put((fn, args))

    def shutdown(self) -> None:
        self._stopped = True
        self._q.put(None)

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None or self._stopped:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:
                log.exception("refhub: %s failed", getattr(fn, "__name__", fn))


class _Slot:
    __slots__ = ("ev", "reply")

    def __init__(self) -> None:
        self.ev = threading.Event()
        self.reply: Any = None


class Connection:
    """One DEALER connection to the reference server (with an optional backup), shared by handles.

    With a cluster token (``REFHUB_AUTH_TOKEN`` / ``TENT_AUTH_TOKEN``[``_FILE``], or `auth`) the I/O
    thread authenticates before anything else is sent, and again after a failover or when the server
    lost the session (then the handles re-register, as after a server restart). Every request
    carries this connection's client id ``cid``: the credential that makes it the owner of the
    handles it opens, across reconnects (SECURITY.md).
    """

    def __init__(self, server: str, backup: str | None = None, *, hb_interval: float = 0.5, failover_after: float = 2.0,
                 auth: ClusterAuth | None = _FROM_ENV) -> None:
        if auth is _FROM_ENV:
            auth = client_auth()
        self.auth: ClusterAuth | None = auth
        self._auth = ZmqClientAuth(auth.key("refhub") if auth else None)
        self._auth_error: Exception | None = None
        self._next_auth = 0.0
        self._outbox: deque = deque(maxlen=OUTBOX_MAX)  # requests waiting for the handshake
        self.cid = os.urandom(16)
        self.addresses = [server] + ([backup] if backup else [])
        self.idx = 0
        self.hb_interval = hb_interval
        self.failover_after = failover_after
        self.ctx = zmq.Context()
        self._rid = itertools.count(1)
        self._pending: dict[int, _Slot] = {}
        self._plock = threading.Lock()
        self.handles: dict[int, ShardHandle] = {}
        self.epoch: str | None = None
        self.generation = 0  # bumps on every failover
        self._inproc = f"inproc://refhub-{id(self)}"
        self._pull = self.ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, OUTBOX_MAX)
        self._pull.bind(self._inproc)
        self._push = self.ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, OUTBOX_MAX)
        self._push.connect(self._inproc)
        self._push_lock = threading.Lock()
        self._stop = threading.Event()
        self.events = _Worker("refhub-events")
        self._dealer = self._connect(self.addresses[0])
        self._thread = threading.Thread(target=self._io, name="refhub-io", daemon=True)
        self._thread.start()

    @property
    def server(self) -> str:
        return self.addresses[self.idx]

    def _connect(self, addr: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        s.setsockopt(zmq.SNDHWM, OUTBOX_MAX)
        s.setsockopt(zmq.RCVHWM, OUTBOX_MAX)
        s.connect(addr)
        self._auth.reset()
        return s

    def request(self, msg: dict, timeout: float = 30.0) -> dict:
        """Send one request and wait for its reply (deadline `timeout`). Raises RefhubError on error replies."""
        rid = next(self._rid)
        msg["rid"] = rid
        msg["cid"] = self.cid
        slot = _Slot()
        with self._plock:
            self._pending[rid] = slot
        # the layout in a pull/publish carries its encoding (PackedMap): spliced in, not packed again
        data = _pack(msg, msgpack.packb)
        with self._push_lock:
            self._push.send(data)
        if not slot.ev.wait(timeout):
            with self._plock:
                self._pending.pop(rid, None)
            if self._auth_error is not None:
                raise self._auth_error
            raise TimeoutError(f"refhub {msg.get('op')} got no reply within {timeout:.1f}s from {self.server}")
        rep = slot.reply
        if isinstance(rep, Exception):
            raise rep
        if not rep.get("ok", False) and not rep.get("keep"):
            code = rep.get("err", "error")
            if code == "unknown_handle":
                self._dropped([msg.get("h")])
            cls = VersionUnavailable if code == "unavailable" else RefhubError
            raise cls(code, rep.get("msg", ""))
        return rep

    def _dropped(self, hids: list[Any]) -> None:
        """The server no longer knows these handles of ours while it kept its epoch: it dropped our
        replica (heartbeats missed: a pause, a network blip). Each re-registers and publishes again
        what it still holds (ShardHandle._reopen)."""
        for hid in hids:
            h = self.handles.get(hid)
            if h is not None and not self._stop.is_set():
                try:
                    self.events.submit(h._reopen, hid, True)
                except RuntimeError:  # closing: the event pool is shut down
                    return

    def _send(self, data: bytes) -> None:
        if self._auth.ready:
            self._dealer.send_multipart(self._auth.wrap(data))
        else:
            self._outbox.append(data)

    def _authenticate(self, now: float) -> bool:
        """Run the handshake if due; True when the connection may carry requests."""
        if self._auth.ready:
            return True
        if now < self._next_auth:
            return False
        try:
            self._auth.handshake(self._dealer, self.failover_after)
        except HandshakeTimeout:
            self._failover()  # the server does not answer: as after missed heartbeats
            return False
        except AuthError as exc:  # wrong token, or the server has auth off: tell every caller, retry later
            err = RefhubError("auth", f"reference server {self.server}: {exc}")
            self._auth_error = err
            self._next_auth = now + max(1.0, self.failover_after)
            _rlog.warning("auth", "refhub: cannot authenticate to %s: %s", self.server, exc)
            self._fail_pending(err)
            self._outbox.clear()
            return False
        self._auth_error = None
        while self._outbox:
            self._dealer.send_multipart(self._auth.wrap(self._outbox.popleft()))
        return True

    def _io(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._dealer, zmq.POLLIN)
        last_rx = time.monotonic()
        last_hb = 0.0
        hb_out = False
        # the server is silent when a heartbeat stays unanswered for failover_after: measured from
        # when we sent it, and from our own resumption when this thread itself stood still that long
        # (SIGSTOP, a starved machine), so our pause is not taken for the server's
        waiting_since = last_rx
        prev = last_rx
        while not self._stop.is_set():
            if not self._auth.ready:
                dealer = self._dealer
                if self._authenticate(time.monotonic()):
                    last_rx = time.monotonic()
                    hb_out = False
                if self._dealer is not dealer:  # failed over meanwhile
                    poller.unregister(dealer)
                    poller.register(self._dealer, zmq.POLLIN)
            ready = dict(poller.poll(int(self.hb_interval * 500)))
            now = time.monotonic()
            if now - prev > self.failover_after:
                waiting_since = now
            prev = now
            if self._pull in ready:
                while True:
                    try:
                        data = self._pull.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._send(data)
            if self._dealer in ready:
                while True:
                    try:
                        frames = self._dealer.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        data = self._auth.unwrap(frames)
                    except SessionLost as exc:
                        if self._auth.enabled:
                            log.warning("refhub: %s lost our session (%s): re-authenticating, re-registering handles",
                                        self.server, exc)
                            self._auth.reset()
                            self._reset_handles()
                        else:  # the server wants a token we do not have: say so to every caller
                            self._fail_pending(RefhubError("auth", f"reference server {self.server}: {exc} "
                                                           "(set REFHUB_AUTH_TOKEN[_FILE] or TENT_AUTH_TOKEN[_FILE])"))
                        break
                    except AuthError as exc:
                        _rlog.warning("bad-reply", "refhub: dropped a reply from %s: %s", self.server, exc)
                        continue
                    last_rx = now
                    hb_out = False
                    try:
                        reps = msgpack.unpackb(data, raw=False, strict_map_key=False)
                    except Exception:
                        _rlog.warning("bad-reply", "undecodable reply from %s", self.server)
                        continue
                    for rep in reps if isinstance(reps, list) else [reps]:
                        if isinstance(rep, dict):
                            self._deliver(rep)
            if now - last_hb >= self.hb_interval:
                last_hb = now
                hs = list(self.handles)
                if hs and self._auth.ready:
                    if not hb_out:
                        waiting_since = now
                    hb_out = True
                    self._send(msgpack.packb({"op": "hb", "rid": 0, "hs": hs, "cid": self.cid}))
                elif not hb_out:
                    last_rx = now
            if hb_out and now - max(last_rx, waiting_since) > self.failover_after:
                poller.unregister(self._dealer)
                self._failover()
                poller.register(self._dealer, zmq.POLLIN)
                last_rx = now
                hb_out = False
        self._dealer.close(0)

    def _deliver(self, rep: dict) -> None:
        if "ev" in rep:
            h = self.handles.get(rep.get("h"))
            if h is not None:
                self.events.submit(h._on_event, rep)
            return
        rid = rep.get("rid", 0)
        if rid == 0:  # heartbeat reply
            epoch = rep.get("epoch")
            if self.epoch is not None and epoch is not None and epoch != self.epoch:
                log.warning("server %s restarted (epoch %s -> %s)", self.server, self.epoch, epoch)
                self.epoch = epoch
                self._reset_handles()
            elif rep.get("unknown"):
                self._dropped(list(rep["unknown"]))
            self.epoch = epoch or self.epoch
            return
        with self._plock:
            slot = self._pending.pop(rid, None)
        if slot is not None:
            slot.reply = rep
            slot.ev.set()

    def _failover(self) -> None:
        old = self.server
        if len(self.addresses) > 1:
            self.idx = (self.idx + 1) % len(self.addresses)
        log.warning("reference server %s stopped answering: switching to %s", old, self.server)
        self._dealer.close(0)
        self._dealer = self._connect(self.server)
        self.epoch = None
        self._reset_handles()

    def _fail_pending(self, err: Exception) -> None:
        with self._plock:
            pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.reply = err
            slot.ev.set()

    def _reset_handles(self) -> None:
        self.generation += 1
        self._fail_pending(ServerFailover("failover", f"reference server changed to {self.server}"))
        for hid, h in list(self.handles.items()):
            self.events.submit(h._reopen, hid)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.events.shutdown()
        self._pull.close(0)
        self._push.close(0)
        self.ctx.term()


class Querier:
    """A persistent connection for handle-less requests (stats, list by model): authenticates once."""

    def __init__(self, server: str, auth: ClusterAuth | None = _FROM_ENV, timeout: float = 5.0) -> None:
        if auth is _FROM_ENV:
            auth = client_auth()
        self.server = server
        self._auth = ZmqClientAuth(auth.key("refhub") if auth else None)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_REPLY_BYTES)
        self._sock.connect(server)
        self._rid = itertools.count(1)
        try:
            self._auth.handshake(self._sock, timeout)
        except BaseException:
            self.close()
            raise

    def call(self, msg: dict, timeout: float = 2.0) -> dict:
        rid = next(self._rid)
        self._sock.send_multipart(self._auth.wrap(msgpack.packb(dict(msg, rid=rid))))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not self._sock.poll(max(1, int(left * 1000))):
                raise TimeoutError(f"no reply from {self.server} within {timeout}s")
            rep = msgpack.unpackb(self._auth.unwrap(self._sock.recv_multipart()), raw=False, strict_map_key=False)
            rep = rep[0] if isinstance(rep, list) else rep
            if isinstance(rep, dict) and rep.get("rid") in (rid, 0):
                return rep

    def close(self) -> None:
        self._sock.close(0)
        self._ctx.term()


def query(server: str, msg: dict, timeout: float = 2.0, auth: ClusterAuth | None = _FROM_ENV) -> dict:
    """One-off request (no handle): stats, list by model."""
    q = Querier(server, auth, timeout)
    try:
        return q.call(msg, timeout)
    finally:
        q.close()


# --------------------------------------------------------------------------- engine


_engine_lock = threading.Lock()
_engine: Any = None
_conns: dict[tuple, Connection] = {}


def default_engine() -> Any:
    global _engine
    with _engine_lock:
        if _engine is None:
            from tent_core import Engine

            _engine = Engine()
        return _engine


_live_stagers: weakref.WeakSet[_Stager] = weakref.WeakSet()


def _stop_threads_at_exit() -> None:
    """Stop every ZeroMQ-polling daemon thread of this module (connections, stagers, embedded servers)
    before the interpreter finalizes: a daemon thread returning from a poll during finalization is
    ended with pthread_exit, and the unwinding through the binding's C++ frames aborts the process
    ("terminate called without an active exception") after all its work was done. Handles left
    open stay open on the server until their heartbeats stop."""
    from .server import stop_embedded

    conns, stagers = list(_conns.values()), list(_live_stagers)
    for c in conns:
        c._stop.set()
        c.events.shutdown()
    for st in stagers:
        st._stop.set()
    stop_embedded()
    for c in conns:
        c._thread.join(timeout=2)
        c.events.join(timeout=2)
    for st in stagers:
        st._thread.join(timeout=2)


atexit.register(_stop_threads_at_exit)


def _connection(server: str, backup: str | None, hb_interval: float, failover_after: float) -> Connection:
    key = (server, backup)
    with _engine_lock:
        c = _conns.get(key)
        if c is None or c._stop.is_set():
            c = _conns[key] = Connection(server, backup, hb_interval=hb_interval, failover_after=failover_after)
        return c


def _as_array(t: Any) -> tuple[np.ndarray | None, Any, DeviceView | None]:
    """A uint8 view of a numpy array or a CPU torch tensor (and the object to keep alive), or
    (None, t, its DeviceView) for a device tensor."""
    dev = device_view(t)
    if dev is not None:
        return None, t, dev
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise ValueError("refhub tensors must be C-contiguous")
        return t.reshape(-1).view(np.uint8), t, None
    mod = type(t).__module__
    if mod.startswith("torch"):
        if not t.is_contiguous():
            raise ValueError("refhub tensors must be contiguous")
        arr = t.detach().view(-1).view(__import__("torch").uint8).numpy()
        return arr, t, None
    raise TypeError(f"cannot register {type(t).__name__}: a numpy array, a torch tensor or a device array "
                    "(__cuda_array_interface__, DLPack, __tent_memory__)")


@dataclass
class _Item:
    name: str
    arr: np.ndarray | None  # uint8 view of the user's tensor (None: device memory, see `dev`)
    keep: Any
    buf: Any = None  # engine LocalBuffer when registered in place
    pack_off: int = -1  # offset inside the pack when tiny
    mode: str = "direct"  # "direct" (registered in place) or "copy" (served through staging slots)
    dev: DeviceView | None = None  # device tensors

    @property
    def nbytes(self) -> int:
        return self.dev.nbytes if self.dev is not None else self.arr.nbytes  # type: ignore[union-attr]

    def read_into(self, dst: np.ndarray, off: int) -> None:
        """dst[:] = this tensor's bytes [off, off + dst.size)."""
        if self.dev is not None:
            self.dev.to_host(dst, off)
        else:
            dst[:] = self.arr[off:off + dst.size]  # type: ignore[index]

    def write_from(self, src: np.ndarray, off: int) -> None:
        if self.dev is not None:
            self.dev.from_host(src, off)
        else:
            self.arr[off:off + src.size] = src  # type: ignore[index]

    def host_copy(self) -> np.ndarray:
        return self.dev.host_copy() if self.dev is not None else self.arr.copy()  # type: ignore[union-attr]

    def checksum(self) -> Any:
        """What the publisher announces: the host checksum, or ["wsum64", v] computed on the device."""
        if self.dev is not None:
            return checksum_entry(self.dev.checksum())
        return checksum(self.arr)  # type: ignore[arg-type]

    def matches(self, expected: Any) -> bool:
        """Does this tensor's content hash to `expected` (computed where the data is)?"""
        if isinstance(expected, list):
            if self.dev is not None:
                return checksum_entry(self.dev.checksum())[1] == expected[1]
            return wsum64_bytes(self.arr) == expected[1]  # type: ignore[arg-type]
        if self.dev is not None:  # a host checksum of device data: read back (a host publisher's tensor)
            return checksum(self.dev.host_copy()) == expected
        return checksum(self.arr) == expected  # type: ignore[arg-type]


def _matches_bytes(data: np.ndarray, expected: Any) -> bool:
    if isinstance(expected, list):
        return wsum64_bytes(data) == expected[1]
    return checksum(data) == expected


class _SourceFailed(RuntimeError):
    """A source stopped answering stage requests (or refused them): re-route like an I/O error."""


def _wait_source(hdl: Any) -> None:
    """Wait for a batch reading from a source; a source silent for SOURCE_SILENCE_S fails it (the
    batch is cancelled and the pull goes on from another copy) instead of waiting out its deadline."""
    while not hdl.wait(SILENCE_POLL_S):
        silent = hdl.silent_for() if hasattr(hdl, "silent_for") else 0.0
        if silent >= SOURCE_SILENCE_S:
            hdl.cancel()
            raise _SourceFailed(f"source silent for {silent:.2f}s (every path to it failed)")


class _Reroute(Exception):
    def __init__(self, src: dict) -> None:
        super().__init__("re-routed")
        self.src = src


class _Stager:
    """Copy mode, serving side: a ROUTER socket next to the engine and `STAGE_SLOTS` staging slots,
    registered once in the handle's segment. ``stage`` copies a slice of a copy-mode tensor into a
    free slot (requests queue while none is free) and answers with the slot's segment offset; the
    reader READs it and sends ``release``. A slot whose reader vanished is reclaimed after `lease_s`."""

    def __init__(self, handle: ShardHandle, lease_s: float = 5.0) -> None:
        from collections import deque

        self.h = handle
        self.lease_s = lease_s
        self.slots = [handle.engine.allocate(STAGE_SLOT, segment=handle.segment) for _ in range(STAGE_SLOTS)]
        self.free = list(range(len(self.slots)))
        self.leases: dict[int, tuple[bytes, float]] = {}
        self.pinned: set[int] = set()
        self.queue: deque = deque()
        self.served = 0
        host = handle.engine.engine_id.rpartition(":")[0] or "127.0.0.1"
        auth = handle.conn.auth
        if auth is None and not is_loopback(host):
            raise AuthRequiredError(f"refhub stager would bind {host} without an auth token (set REFHUB_AUTH_TOKEN)")
        self.sessions = ZmqServerAuth(auth.key("refhub-stage") if auth else None)
        self.sock = handle.conn.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, STAGE_MAX_MSG)
        self.sock.setsockopt(zmq.SNDHWM, STAGE_HWM)
        self.sock.setsockopt(zmq.RCVHWM, STAGE_HWM)
        self.sock.setsockopt(zmq.HANDSHAKE_IVL, 5000)  # a silent TCP connection is dropped by then
        self.sock.bind(f"tcp://{host}:0")
        self.address = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"refhub-stager-{handle.segment}", daemon=True)
        _live_stagers.add(self)
        self._thread.start()

    def _loop(self) -> None:
        from . import protocol

        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                while True:
                    try:
                        frames = self.sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    ident = frames[0]
                    payload, refusal = self.sessions.accept(ident, frames[1:])
                    if refusal is not None:
                        if refusal[0].startswith(b"TENTDENY"):
                            _rlog.warning("stage-auth", "stager %s refused a reader: %s", self.address,
                                          self.sessions.last_denial)
                        try:
                            self.sock.send_multipart((ident, *refusal), zmq.NOBLOCK)
                        except zmq.ZMQError:
                            pass
                        continue
                    try:
                        msg = protocol.unpack(payload)
                        op = protocol.validate_stage(msg)
                    except protocol.ProtocolError as exc:
                        self._reply(ident, protocol.error(0, protocol.E_BAD_MESSAGE, str(exc)))
                        continue
                    if op == "release":
                        self._release(ident, msg["slot"])
                    else:
                        self.queue.append((ident, msg))
            now = time.monotonic()
            for slot, (_, exp) in list(self.leases.items()):
                if exp < now:
                    log.warning("stager %s: reclaiming slot %d (lease expired)", self.address, slot)
                    del self.leases[slot]
                    self.free.append(slot)
            while self.queue and self.free:
                ident, msg = self.queue.popleft()
                self._stage(ident, msg)
        self.sock.close(0)

    def _reply(self, ident: bytes, rep: dict) -> None:
        try:
            self.sock.send_multipart((ident, *self.sessions.wrap(ident, msgpack.packb(rep, use_bin_type=True))), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass

    def _release(self, ident: bytes, slot: int) -> None:
        lease = self.leases.get(slot)
        if lease is not None and lease[0] == ident:
            del self.leases[slot]
            self.free.append(slot)

    def _stage(self, ident: bytes, msg: dict) -> None:
        from .protocol import E_STATE, error

        rid, h = msg.get("rid", 0), self.h
        it = h.items.get(msg["item"])
        off, n = msg["off"], msg["len"]
        if h.state == "idle" or h.version != msg["v"]:
            self._reply(ident, error(rid, E_STATE, f"not holding v{msg['v']} (state {h.state}, v{h.version})"))
            return
        if it is None or off < 0 or n <= 0 or n > STAGE_SLOT or off + n > it.nbytes:
            self._reply(ident, error(rid, "bad_range", f"no slice [{off}, {off + n}) of {msg['item']!r}"))
            return
        slot = self.free.pop()
        buf = self.slots[slot]
        if it.dev is not None and slot not in self.pinned:
            self.pinned.add(slot)
            it.dev.runtime.pin(buf.addr, buf.length)  # device -> slot copies run as DMA
        it.read_into(buf.array[:n], off)
        self.leases[slot] = (ident, time.monotonic() + self.lease_s)
        self.served += 1
        self._reply(ident, {"rid": rid, "ok": True, "slot": slot, "roff": buf.offset})

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for b in self.slots:
            try:
                self.h.engine.unregister(b)
            except Exception:  # engine already closed
                pass


def _mark(st: dict, done: int, now: float) -> None:
    """Note the time at which a pull's held prefix passed each sixteenth of its bytes (stats' marks_s)."""
    marks, total = st.get("marks"), st.get("total", 0)
    while marks is not None and len(marks) < 16 and done * 16 >= (len(marks) + 1) * total:
        marks.append(now)


def _merge_avail(avail: int, seen: int, issued: int) -> int:
    """What may be read from a partial source: it only grows with what the source reports, and stops
    where we are (no new reads; the server re-routes us) once the source no longer holds the version."""
    if seen < 0:
        return min(avail, issued)
    return max(avail, seen)


class _Verifier:
    """Checks the received bytes against the publisher's checksums as the contiguous received prefix
    grows: the pack (all tiny tensors, checked in the pack and unpacked) once the prefix covers it;
    each large host tensor piece by piece, the bytes of every completed batch hashed as soon as it
    lands (streamed: the same xxh3_64 of the whole tensor the publisher announced), while they are
    still in the CPU's cache; device tensors once covered (on the device, or fed as they pass)."""

    def __init__(self, handle: ShardHandle, mine: list, cks: list | None, v: int) -> None:
        self.h = handle
        self.v = v
        if cks is not None and len(cks) != len(handle.items):
            raise RefhubError("layout_mismatch", f"the source published {len(cks)} tensors, this handle has {len(handle.items)}")
        # what depends on the layout alone (stream order, names, lane plan) is made once per layout: a
        # pull of a 500-tensor shard spent ~0.5 ms rebuilding it (the pull's critical path, before its first READ)
        memo = handle._verifier_memo
        if memo is None or memo[0] != handle._layout_gen:
            checks = []
            pos = 0
            for name, _, _, nb in mine:
                pos += nb
                checks.append((pos, name))
            memo = handle._verifier_memo = (handle._layout_gen, sorted(handle.items), checks,
                                            all(it.dev is None for it in handle.items.values()), {})
        _, names, self.checks, all_host, plans = memo
        self.exp = dict(zip(names, cks, strict=True)) if cks is not None else None
        self.i = 0
        self.streams: dict[str, StreamHash] = {}  # copy-mode device tensors, hashed on the landing buffer
        self.device_checks = 0
        self.wait_s = 0.0
        # host tensors are checked in worker threads ("lanes", one thread each), overlapped with this
        # thread's READ window; device tensors, whose streams this thread feeds, are checked inline. Every
        # core gets a lane: when the last batch lands, the hashing still queued (the copy, on every core,
        # leaves the hash its share only) finishes on all cores, not on one while the others idle.
        host = self.exp is not None and all_host
        n_lanes = (VERIFY_THREADS or max(1, min(4, os.cpu_count() or 1))) if VERIFY_THREAD and host else 0
        self.lanes = [ThreadPoolExecutor(1, thread_name_prefix="refhub-verify") for _ in range(n_lanes)]
        self.pending: deque = deque()
        # streamed: per lane, [(start, end, name, flat uint8 view)] of the large host tensors with a host
        # checksum in stream order (tensor j on lane j % lanes: its pieces are hashed in order), and the
        # index of the lane's first tensor not yet compared; the hashed prefix (`hashed`) only grows.
        # Read-only once made: shared by the pulls of this layout whose checksums are all host ones.
        self.hashed = 0
        stream = host and _xxhash is not None and STREAM_VERIFY
        shared = stream and not any(type(c) is list for c in cks)  # type: ignore[union-attr]
        plan = plans.get(n_lanes) if shared else None
        if plan is None:
            spans: list[list[tuple[int, int, str, np.ndarray]]] = [[] for _ in range(max(1, n_lanes))]
            streamed: set[str] = set()
            bases: dict[str, int] = {}
            if stream:
                for pos, end, name, flat, base in handle._host_spans():
                    if not isinstance(self.exp[name], list):  # type: ignore[index]
                        spans[len(streamed) % len(spans)].append((pos, end, name, flat))
                        streamed.add(name)
                        bases[name] = base
            plan = (spans, streamed, bases)
            if shared:
                plans[n_lanes] = plan
        self.spans, self.streamed, bases = plan
        self.cursor = [0] * len(self.spans)
        self.lane_s = [0.0] * len(self.spans)
        self.next_lane = 0
        # per streamed tensor, the running digest its READs are armed with (RECV_DIGEST): the transport
        # folds what it receives, the lanes what it did not (lane_folded bytes); else StreamHash
        self.digests: dict[str, Any] = {}
        self.lane_folded = [0] * len(self.spans)
        # batches are armed only where the engine's paths fold what they receive and none copies a
        # digested READ itself inside submit (the same-host transport then copies the whole batch on the
        # submitting thread, in order: its workers idle); unarmed, the lanes fold every byte (tent's hash)
        ts = list(getattr(handle.engine, "transports", {}).values())
        self.arm = any(getattr(t, "receive_digest", False) for t in ts) and not any(
            getattr(t, "inline_digest", False) for t in ts)
        if self.streamed and RECV_DIGEST and _xxhash is not None:
            from tent_core import Digest

            for spans in self.spans:
                for start, end, name, _ in spans:
                    self.digests[name] = Digest(bases[name], bases[name] + (end - start))
        # per lane, its last queued job: while none is pending, this thread may move the lane's cursor
        self.lane_last: list[Any] = [None] * len(self.spans)
        self.checked_here = 0  # tensors compared on this thread (their digests complete: INLINE_CHECK)

    def digests_for(self, names: list[str]) -> list | None:
        """The digests to arm a batch with that READs (parts of) these tensors (None: none)."""
        if not self.digests or not self.arm:
            return None
        ds = [d for d in (self.digests.get(n) for n in names) if d is not None]
        return ds or None

    def received_in_transport(self) -> int:
        """Bytes of the streamed tensors the transport folded where they landed (not the lanes)."""
        if not self.digests:
            return 0
        return max(0, sum(int(d.folded) for d in self.digests.values()) - sum(self.lane_folded))

    def skip_to(self, done: int) -> None:
        """The stream prefix [0, done) (ending at a tensor boundary) was verified elsewhere (a fused
        pull): stream from `done` on. Waits for the checks already queued (a mismatch raises)."""
        while self.pending:
            self.pending.popleft().result()
        for w, spans in enumerate(self.spans):
            self.cursor[w] = bisect.bisect_left([sp[0] for sp in spans], done)
            for sp in spans[:self.cursor[w]]:
                self.streams.pop(sp[2], None)
        self.hashed = max(self.hashed, done)
        while self.i < len(self.checks) and self.checks[self.i][0] <= done and self.checks[self.i][1] in self.streamed:
            self.i += 1

    def feed(self, name: str, off: int, data: np.ndarray) -> None:
        """Landed bytes [off, off + data.size) of device tensor `name` (in order): hash them now."""
        if self.exp is None:
            return
        sh = self.streams.get(name)
        if sh is None or sh.n != off:  # (re)started: a re-routed pull resumes where it stopped
            if off != 0:
                self.streams.pop(name, None)
                return
            sh = self.streams[name] = StreamHash(self.exp[name], _xxhash)
        sh.update(data)

    def advance(self, done: int) -> None:
        """Check every tensor the received prefix [0, done) now covers: in the worker thread when there
        is one (the hash releases the GIL, so this thread keeps the window of READs full meanwhile; a
        mismatch surfaces at a later advance or at finish), else here."""
        if self.streamed and done > self.hashed:
            a, self.hashed = self.hashed, done
            inline = INLINE_CHECK and bool(self.digests) and self.arm
            for w, spans in enumerate(self.spans):
                if inline:
                    self._check_folded(w, done)
                c = self.cursor[w]
                # (inline: a tensor still landing is the transport's to fold; the lane gets only a
                # complete one that was not folded whole)
                if c < len(spans) and spans[c][0] < done and spans[-1][1] > a and (not inline or spans[c][1] <= done):
                    if self.lanes:
                        self.lane_last[w] = self.lanes[w].submit(self._hash_range, w, a, done)
                        self.pending.append(self.lane_last[w])
                    else:
                        self._hash_range(w, a, done)
        while self.i < len(self.checks) and self.checks[self.i][0] <= done:
            name = self.checks[self.i][1]
            self.i += 1
            if name in self.streamed:
                continue
            if self.lanes:
                self.next_lane = (self.next_lane + 1) % len(self.lanes)
                self.pending.append(self.lanes[self.next_lane].submit(self._check, name, self.next_lane))
            else:
                self._check(name, 0)
        while self.pending and self.pending[0].done():
            self.pending.popleft().result()

    def _check_folded(self, w: int, done: int) -> None:
        """Compare, on this thread, lane w's tensors that the prefix [0, done) completes and whose digests
        the transport folded whole (every batch armed: the usual case), while no job of the lane is
        pending. A tensor still being folded (another thread drains its notes), or not folded whole
        (a piece retried elsewhere), stops it: the lane folds the rest from the landed bytes."""
        last = self.lane_last[w]
        if last is not None and not last.done():
            return  # the lane owns its cursor until its queued jobs ran
        spans = self.spans[w]
        while self.cursor[w] < len(spans):
            start, end, name, _ = spans[self.cursor[w]]
            if end > done:
                break
            d = self.digests[name]
            if d.folded != end - start:
                break
            self.cursor[w] += 1
            self.checked_here += 1
            if d.intdigest() != self.exp[name]:  # type: ignore[index]
                raise ChecksumError("checksum", f"v{self.v} shard {self.h.shard}: end-to-end checksum mismatch in {name!r}")

    def finish(self) -> None:
        """Wait for the checks still running (their time counts as `wait_s`); raises a mismatch."""
        t0 = time.perf_counter()
        try:
            while self.pending:
                self.pending.popleft().result()
        finally:
            self.wait_s += time.perf_counter() - t0
            self.close()

    def close(self) -> None:
        for f in self.pending:
            f.cancel()
        self.pending.clear()
        for lane in self.lanes:
            lane.shutdown(wait=True)
        self.lanes = []

    @property
    def seconds(self) -> float:
        """Seconds spent hashing (summed over the lanes)."""
        return sum(self.lane_s)

    def _hash_range(self, w: int, a: int, b: int) -> None:
        """Hash the landed stream bytes [a, b) of lane w's tensors into their running checksums (a
        lane's ranges arrive in order, each right after its batch landed); compare each tensor whose
        last byte is in."""
        t0 = time.perf_counter()
        spans = self.spans[w]
        try:
            while self.cursor[w] < len(spans):
                start, end, name, flat = spans[self.cursor[w]]
                if start >= b:
                    return
                lo, hi = max(a, start), min(b, end)
                d = self.digests.get(name)
                if d is not None:
                    if hi > lo:  # [start, hi) landed: fold what the transport did not (in order)
                        self.lane_folded[w] += d.land(flat[:hi - start])
                    if end > b:
                        return
                    self.cursor[w] += 1
                    if d.folded != end - start or d.intdigest() != self.exp[name]:  # type: ignore[index]
                        raise ChecksumError("checksum", f"v{self.v} shard {self.h.shard}: end-to-end checksum mismatch in {name!r}")
                    continue
                if hi > lo:
                    sh = self.streams.get(name)
                    if sh is None:
                        sh = self.streams[name] = StreamHash(self.exp[name], _xxhash)  # type: ignore[index]
                    for x in range(lo - start, hi - start, HASH_PIECE):  # pieces that stay in L2
                        sh.update(flat[x:min(x + HASH_PIECE, hi - start)])
                if end > b:
                    return
                self.cursor[w] += 1
                sh = self.streams.pop(name, None)
                if sh is None or sh.n != end - start or sh.digest() != self.exp[name]:  # type: ignore[index]
                    raise ChecksumError("checksum", f"v{self.v} shard {self.h.shard}: end-to-end checksum mismatch in {name!r}")
        finally:
            self.lane_s[w] += time.perf_counter() - t0

    def _check(self, name: str, w: int) -> None:
        t0 = time.perf_counter()
        try:
            self._check_one(name)
        finally:
            self.lane_s[w] += time.perf_counter() - t0

    def _check_one(self, name: str) -> None:
        h = self.h
        if name == "__pack__":
            for n, it in h.items.items():
                if it.buf is not None or it.pack_off < 0:
                    continue
                packed = h._pack.array[it.pack_off:it.pack_off + it.nbytes]
                if self.exp is not None and not _matches_bytes(packed, self.exp[n]):  # checked in the pack
                    raise ChecksumError("checksum", f"v{self.v} shard {h.shard}: end-to-end checksum mismatch in {n!r}")
                it.write_from(packed, 0)
            return
        if self.exp is None:
            return
        it = h.items[name]
        sh = self.streams.pop(name, None)
        if sh is not None and sh.n == it.nbytes:
            ok = sh.digest() == (self.exp[name][1] if isinstance(self.exp[name], list) else self.exp[name])
        else:
            ok = it.matches(self.exp[name])
            self.device_checks += it.dev is not None
        if not ok:
            raise ChecksumError("checksum", f"v{self.v} shard {h.shard}: end-to-end checksum mismatch in {name!r}")

_seg_counter = itertools.count()


class ShardHandle:
    """One worker's shard of one replica of a model."""

    def __init__(self, conn: Connection, engine: Any, model: str, replica: str, shard: int, num_shards: int,
                 retain: dict | None, datacenter: str, spot: bool, kind: str = "normal",
                 request_timeout: float = 30.0, throttle_Bps: float | None = None, mode: str = "direct",
                 stage_timeout: float = 5.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.mode = mode  # default registration mode of this handle
        self.stage_timeout = stage_timeout  # copy mode: a stager silent this long is a failed source
        self._stager: _Stager | None = None
        self._stage_socks: dict[str, zmq.Socket] = {}
        self._stage_auth: dict[str, ZmqClientAuth] = {}
        self._stage_rid = itertools.count(1)
        self._landing = None  # copy mode, receiving side: registered landing buffer
        self._landing_pinned = False  # page-locked for host -> device copies (device tensors)
        self._verify = True  # diagnostics only (bench dataplane): False skips the receive-side hash
        self.throttle_Bps = throttle_Bps  # emulate a NIC cap on this reader (benchmarks/tests)
        self.conn = conn
        self.engine = engine
        self.model = model
        self.replica = replica
        self.shard = shard
        self.num_shards = num_shards
        self.retain = retain
        self.datacenter = datacenter
        self.spot = spot
        self.kind = kind
        self.request_timeout = request_timeout
        self.items: dict[str, _Item] = {}
        self.state = "idle"
        self.version: int | None = None
        self.hid: int | None = None
        # what this handle publishes (version, reference, checksums): sent again if the server drops
        # the replica while we still hold it (_reopen)
        self._held: tuple[int, dict, list | None] | None = None
        self.segment = f"rh{os.getpid()}-{next(_seg_counter)}"
        self._lock = threading.RLock()
        self._pack = None  # LocalBuffer of the tiny-tensor pack
        self._layout_dirty = True
        # the byte stream and the reference built from it, kept until the layout changes (register,
        # allocate, unregister, a rebuilt pack): a replicate asks for them several times, and each build
        # walks and sorts every tensor (~0.2-0.5 ms for 500 tensors)
        self._layout_gen = 0
        self._stream_memo: tuple[int, list] | None = None
        self._ref_memo: tuple[int, Any, dict] | None = None
        # what a _Verifier of this layout needs that depends on the layout alone (made by the first pull)
        self._verifier_memo: tuple[int, list[str], list[tuple[int, str]], bool, dict] | None = None
        self._ctrl = engine.allocate(64, segment=self.segment)  # progress word at offset 0 of the segment
        self._ctrl.array[:] = 0
        if self._ctrl.addr % 8:
            raise RuntimeError("refhub: the progress word must be 8-byte aligned")
        self._word = self._ctrl.array[:8].view(np.uint64)
        self._ring = getattr(engine, "word_written", None)
        self._serving_v: int | None = None  # the version a reader was routed to our partial copy of (server event)
        # slot 0: synchronous progress reads; slots 1..: the progress word read along with each batch
        self._scratch = engine.allocate(8 * (PROGRESS_SLOTS + 1), segment=f"{self.segment}-scratch")
        self._offloads: list[ShardHandle] = []
        self._closed = False
        self.stats: dict[str, Any] = {}
        self._open()

    # -------------------------------------------------------------- registration
    def _open(self) -> None:
        rep = self.conn.request({
            "op": "open", "model": self.model, "replica": self.replica, "shard": self.shard,
            "num_shards": self.num_shards, "datacenter": self.datacenter, "spot": self.spot,
            "retain": self.retain, "kind": self.kind,
        }, self.request_timeout)
        old = self.hid
        self.hid = rep["h"]
        self.conn.epoch = rep.get("epoch", self.conn.epoch)
        if old is not None:
            self.conn.handles.pop(old, None)
        self.conn.handles[self.hid] = self

    def _reopen(self, stale: int | None = None, republish: bool = False) -> None:
        """Re-register with the server. After a server failover/restart: unpublished, same tensors.
        After the same server dropped our replica (`republish`: heartbeats missed), what this handle
        still publishes is published again, same version, reference and checksums (the tensors are
        immutable until unpublish). `stale`: the handle id the server did not know; nothing to do
        when the handle re-registered since."""
        with self._lock:
            if self._closed or (stale is not None and self.hid != stale):
                return
            held = self._held if republish and self.state == "published" else None
            if held is None:
                self._end_publication()
        for attempt in range(REOPEN_ATTEMPTS):
            # the lock is let go between attempts: a close() (or an operation that will fail and
            # tell its caller) must not wait for every retry against a server that is gone
            with self._lock:
                if self._closed or self.conn._stop.is_set():
                    return
                try:
                    self._open()
                except (TimeoutError, RefhubError) as exc:
                    log.warning("re-open attempt %d failed: %s", attempt, exc)
                else:
                    log.info("handle %s/%s/%d re-registered with %s", self.model, self.replica, self.shard, self.conn.server)
                    if held is not None:
                        # after the other handles of this connection re-opened: the replica's barrier needs every shard
                        self.conn.events.submit(self._republish, held, self.hid)
                    return
            if self.conn._stop.wait(0.2):
                return
        with self._lock:
            self._end_publication()

    def _republish(self, held: tuple[int, dict, list | None], hid: int) -> None:
        with self._lock:
            if self._closed or self.hid != hid or self._held is not held or self.state != "published":
                return  # re-registered again, unpublished or closed meanwhile
            v, ref, cks = held
            try:
                self.conn.request({"op": "publish", "h": hid, "version": v, "ref": ref, "checksum": cks},
                                  self.request_timeout)
            except (TimeoutError, RefhubError) as exc:
                log.warning("handle %s/%s/%d: publishing v%d again after the server dropped it failed: %s",
                            self.model, self.replica, self.shard, v, exc)
                self._end_publication()
                return
            log.info("handle %s/%s/%d: v%d published again after the server dropped the replica",
                     self.model, self.replica, self.shard, v)

    def _end_publication(self) -> None:
        """Unpublished as far as this side knows: the progress word stops vouching for the bytes."""
        if self.state != "idle":
            self._set_progress(0, 0)
        self.state = "idle"
        self.version = None
        self._held = None

    def register(self, name: str, tensor: Any, mode: str | None = None) -> None:
        """Register a tensor (numpy array or CPU torch tensor).

        mode="direct" (default, or the handle's `mode`): a large tensor is registered with the engine
        in place and peers READ it zero-copy. mode="copy": nothing is registered; peers get its bytes
        slice by slice through this handle's pre-registered staging slots, so an application that
        reallocates the tensor every version just registers the new one (no engine registration).
        Tensors under 2 MB are always packed into one registered buffer at publish."""
        mode = mode or self.mode
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        with self._lock:
            if self.state != "idle":
                raise RefhubError("bad_state", "register while published/receiving: unpublish first")
            arr, keep, dev = _as_array(tensor)
            old = self.items.get(name)
            if old is not None:
                self.unregister(name)
            it = _Item(name, arr, keep, mode=mode, dev=dev)
            nb = it.nbytes
            if nb >= TINY and mode == "direct":
                it.buf = self.engine.register(tensor if dev is not None else arr, segment=self.segment)
            self.items[name] = it
            self._layout_gen += 1
            if old is None or old.nbytes != nb or (old.nbytes < TINY) != (nb < TINY):
                self._layout_dirty = True
            elif nb < TINY:
                it.pack_off = old.pack_off

    def allocate(self, name: str, shape: int | tuple[int, ...], dtype: Any = np.uint8) -> Any:
        """A new zeroed tensor in engine memory, registered as `name` (direct mode); returns it.

        Same-host peers reach engine-allocated memory with the engine's same-host transport (shm maps
        it: memfd-backed), where a tensor allocated by numpy or torch and then register()'d is reachable
        through CMA only, which shm leaves off by default (it bypasses the target's checks), so such
        tensors travel over TCP between processes of one host. `dtype`: a numpy dtype, or a torch
        dtype (then a CPU torch tensor over the same memory is returned, bf16 included). The memory
        lives until the process ends when the caller still holds the tensor after close()."""
        shape_t = (int(shape),) if isinstance(shape, int | np.integer) else tuple(int(s) for s in shape)
        torch_dtype = dtype if type(dtype).__module__.startswith("torch") else None
        if torch_dtype is not None:
            import torch

            itemsize = torch.empty((), dtype=torch_dtype).element_size()
        else:
            itemsize = np.dtype(dtype).itemsize
        nb = int(np.prod(shape_t, dtype=np.int64)) * itemsize
        with self._lock:
            if self.state != "idle":
                raise RefhubError("bad_state", "allocate while published/receiving: unpublish first")
            if nb < TINY:  # packed at publish anyway: plain memory
                raw = np.zeros(nb, np.uint8)
                buf = None
            else:
                buf = self.engine.allocate(nb, segment=self.segment)
                raw = buf.array[:nb]
                raw[:] = 0
            if torch_dtype is not None:
                import torch

                t: Any = torch.frombuffer(memoryview(raw), dtype=torch_dtype).view(shape_t) if nb else \
                    torch.zeros(shape_t, dtype=torch_dtype)
            else:
                t = raw.view(np.dtype(dtype)).reshape(shape_t)
            if name in self.items:
                self.unregister(name)
            self.items[name] = _Item(name, raw, t, buf=buf, mode="direct")
            self._layout_dirty = True
            self._layout_gen += 1
            return t

    def unregister(self, name: str) -> None:
        with self._lock:
            if self.state != "idle":
                raise RefhubError("bad_state", "unregister while published/receiving: unpublish first")
            it = self.items.pop(name)
            if it.buf is not None:
                self.engine.unregister(it.buf)
            self._layout_dirty = True
            self._layout_gen += 1

    def _build_layout(self) -> None:
        if any(it.mode == "copy" and it.nbytes >= TINY for it in self.items.values()) and self._stager is None:
            self._stager = _Stager(self)
        if not self._layout_dirty:
            return
        self._layout_gen += 1
        tiny = sorted(n for n, it in self.items.items() if it.nbytes < TINY)
        for it in self.items.values():
            it.pack_off = -1
        size = 0
        for n in tiny:
            self.items[n].pack_off = size
            size += (self.items[n].nbytes + 63) & ~63
        if self._pack is not None and (self._pack.length < size or size == 0):
            self.engine.unregister(self._pack)
            self._pack = None
        if size and self._pack is None:
            self._pack = self.engine.allocate(size, segment=self.segment)
        self._layout_dirty = False

    def _host_spans(self) -> list[tuple[int, int, str, np.ndarray, int]]:
        """(stream start, end, name, flat uint8 view, its address) of each large host tensor in stream
        order, once per layout (a pull's verifier needs them before its first READ)."""
        memo = self.__dict__.get("_spans_memo")
        if memo is not None and memo[0] == self._layout_gen:
            return memo[1]
        out = []
        pos = 0
        for name, _, _, nb in self._stream():
            it = self.items.get(name)
            if it is not None and it.arr is not None:
                flat = it.arr.reshape(-1).view(np.uint8)
                out.append((pos, pos + nb, name, flat, int(flat.ctypes.data)))
            pos += nb
        self._spans_memo = (self._layout_gen, out)
        return out

    def _stream(self) -> list[tuple[str, Any, int, int]]:
        """The byte stream served to readers: [(name, LocalBuffer or None for copy mode, offset, nbytes)]."""
        memo = self._stream_memo
        if memo is not None and memo[0] == self._layout_gen:
            return list(memo[1])
        out: list[tuple[str, Any, int, int]] = []
        if self._pack is not None:
            used = max((it.pack_off + it.nbytes for it in self.items.values() if it.pack_off >= 0), default=0)
            out.append(("__pack__", self._pack, 0, used))
        for n in sorted(n for n, it in self.items.items() if it.nbytes >= TINY):
            it = self.items[n]
            out.append((n, it.buf, 0, it.nbytes))
        self._stream_memo = (self._layout_gen, out)
        return list(out)

    def _ref(self, with_layout: bool = True) -> dict:
        """This handle's reference (what readers READ where); a new dict each call, its lists shared
        with the memo (nothing changes them: they go out in messages and into _held)."""
        return dict(self._wire_ref())

    def _wire_ref(self) -> PackedMap:
        """The reference as sent: made once per layout with its msgpack encoding, which every pull
        and publish splices into its message (a 500-tensor layout is not packed per request). Shared
        and never changed: callers that want a dict to edit take _ref()."""
        memo = self._ref_memo
        if memo is not None and memo[0] == self._layout_gen and memo[1] is self._stager:
            return memo[2]
        stream = self._stream()
        ref = {
            "seg": self.engine.segment_name(self.segment),
            "progress": self._ctrl.offset,
            # remote offset -1: copy mode (ask the stager for the slice)
            "items": [[n, b.offset + off if b is not None else -1, nb] for n, b, off, nb in stream],
            "total": sum(s[3] for s in stream),
            "pack": sorted([n, it.pack_off, it.nbytes] for n, it in self.items.items() if it.pack_off >= 0),
        }
        if self._stager is not None:
            ref["stager"] = self._stager.address
            ref["slot"] = STAGE_SLOT
        ref = PackedMap(ref, msgpack.packb(ref, use_bin_type=True))
        self._ref_memo = (self._layout_gen, self._stager, ref)
        return ref

    def _set_progress(self, version: int, nbytes: int) -> None:
        # one aligned 8-byte store: the source's transport may read the word while it is written (a
        # waiting READ's condition, read at the target) and must never see half of it
        self._word[0] = (version << VERSION_SHIFT) | nbytes
        if self._ring is not None:  # READs of our readers parked on the word (WAIT_READ) go now
            self._ring()

    @property
    def progress(self) -> tuple[int, int, int]:
        """(version, bytes held, bytes in all) of this shard's byte stream: during a replicate, how
        far it got (the same word pipeline readers of this replica see); after it, bytes held == all."""
        word = int(self._ctrl.array[:8].view(np.uint64)[0])
        return word >> VERSION_SHIFT, word & BYTES_MASK, sum(s[3] for s in self._stream())

    def _checksums(self) -> list[int]:
        return [self.items[n].checksum() for n in sorted(self.items)]

    # -------------------------------------------------------------- ROS primitives
    def publish(self, version: int) -> None:
        """Make the registered tensors visible as `version` (immutability commitment until unpublish).
        Every tensor is hashed here, once; readers verify against these checksums."""
        with self._lock:
            self._build_layout()
            if self._pack is not None:
                for it in self.items.values():
                    if it.pack_off >= 0:
                        it.read_into(self._pack.array[it.pack_off:it.pack_off + it.nbytes], 0)
            t0 = time.perf_counter()
            cks = self._checksums()
            self.stats = {"publish_checksum_s": time.perf_counter() - t0}
            ref = self._wire_ref()
            self._set_progress(version, ref["total"])
            self.conn.request({"op": "publish", "h": self.hid, "version": int(version), "ref": ref, "checksum": cks},
                              self.request_timeout)
            self.state = "published"
            self.version = int(version)
            self._held = (int(version), ref, cks)

    def unpublish(self, timeout: float | None = None) -> None:
        """Revoke; returns once in-flight reads drained. The last copy of a retained version is offloaded first."""
        with self._lock:
            if self.state == "idle":
                return
            deadline = time.monotonic() + (timeout or self.request_timeout)
            while True:
                rep = self.conn.request({"op": "unpublish", "h": self.hid}, max(0.1, deadline - time.monotonic()))
                if rep.get("offload"):
                    self._offload(rep["version"])
                    continue
                if rep.get("keep"):
                    return  # an offload replica still holding the last copy
                break
            self.state = "idle"
            self.version = None
            self._held = None
            # the immutability commitment ends here: the owner may overwrite these bytes, so the progress
            # word must stop vouching for them before the server routes a pipeline reader to this replica
            self._set_progress(0, 0)

    def _offload(self, version: int) -> None:
        """Copy this shard to CPU memory and publish it as an offload replica (released by the server later)."""
        t0 = time.monotonic()
        off = ShardHandle(self.conn, self.engine, self.model, f"{self.replica}~offload-v{version}", self.shard,
                          self.num_shards, self.retain, self.datacenter, False, kind="offload",
                          request_timeout=self.request_timeout)
        for n, it in self.items.items():
            off.register(n, it.host_copy())
        off.publish(version)
        self._offloads.append(off)
        log.info("offloaded %s v%d shard %d to CPU in %.3fs", self.model, version, self.shard, time.monotonic() - t0)

    def _on_event(self, ev: dict) -> None:
        if ev.get("ev") == "serving":  # a reader was routed to our partial copy of this version
            v = ev.get("version")
            if isinstance(v, int) and not isinstance(v, bool):
                self._serving_v = v
            else:
                _rlog.warning("bad-event", "ignoring a serving event without a version: %r", ev)
            return
        if ev.get("ev") == "release" and self.kind == "offload":
            try:
                self.unpublish()
                if self.state == "idle":
                    self.close()
                    log.info("offload replica %s released", self.replica)
            except Exception as exc:
                log.warning("releasing offload replica %s failed: %s", self.replica, exc)

    def replicate(self, version: int | str = "latest", timeout: float | None = None) -> int:
        """Block until `version` exists, then pull it into the registered tensors. Returns the version."""
        return self._txn_pull("replicate", {"version": version}, timeout)

    def update(self, timeout: float | None = None) -> int | None:
        """Atomically move to a newer version if one exists (pulling it); None if there is none."""
        return self._txn_pull("update", {}, timeout)

    def _txn_pull(self, op: str, fields: dict, timeout: float | None) -> int | None:
        with self._lock:
            t_req = time.monotonic()
            deadline = t_req + (timeout or self.request_timeout)
            self._build_layout()
            if self.state != "published":  # a reader routed here as a partial copy must see no bytes yet
                self._set_progress(0, 0)
            # a "serving" event is about this receive only: the server sends it once this request made our
            # copy a receiving one (the same version may be received again later)
            self._serving_v = None
            msg = {"op": op, "h": self.hid, "ref": self._wire_ref(), **fields}
            while True:
                rep = self.conn.request(dict(msg), max(0.1, deadline - time.monotonic()))
                if rep.get("offload"):
                    self._offload(rep["version"])
                    msg["txn"] = rep["txn"]
                    continue
                break
            if rep.get("noop"):
                return None
            if rep.get("have"):
                return rep["version"]
            v = rep["version"]
            self.state = "receiving"
            self.version = v
            t_routed = time.monotonic()
            try:
                self._pull(v, rep["src"], rep.get("checksum"), deadline)
            except BaseException:
                self._set_progress(0, 0)
                try:
                    self.conn.request({"op": "replicate_done", "h": self.hid, "ok": False}, self.request_timeout)
                except Exception:
                    pass
                self.state = "idle"
                self.version = None
                raise
            # from the request to the server's answer naming the source (a pipeline hop's start delay)
            self.stats["routed_s"] = round(t_routed - t_req, 4)
            self.conn.request({"op": "replicate_done", "h": self.hid, "ok": True}, self.request_timeout)
            self.state = "published"
            cks = rep.get("checksum")
            self._held = (int(v), msg["ref"], list(cks) if cks is not None else self._checksums())
            return v

    def _submit(self, reqs: list, deadline: float, digest: Any = None, waits: list | None = None) -> Any:
        from tent_core import READ, Request
        from tent_core.errors import NotRegisteredError, UnknownSegmentError

        rq = [Request(READ, lb, loff, seg, roff, n) for lb, loff, seg, roff, n in reqs]
        for attempt in range(2):
            try:
                if waits is not None:
                    return self.engine.submit_when(rq, waits, max(0.05, min(10.0, deadline - time.monotonic())),
                                                   digest=digest)
                if digest is not None:
                    return self.engine.submit(rq, deadline=max(0.05, min(10.0, deadline - time.monotonic())), digest=digest)
                return self.engine.submit(rq, deadline=max(0.05, min(10.0, deadline - time.monotonic())))
            except (UnknownSegmentError, NotRegisteredError):
                if attempt:
                    raise
                self.engine.refresh_peer(reqs[0][2].partition("/")[0])

    def _can_wait(self, seg: str) -> bool:
        """Whether READs of `seg` may wait at the source (engine.can_wait), asked once per peer."""
        peer = seg.partition("/")[0]
        cache = self.__dict__.setdefault("_wait_ok", {})
        if peer not in cache:
            try:
                cache[peer] = bool(getattr(self.engine, "can_wait", None) and self.engine.can_wait(seg))
            except Exception as exc:  # an unknown peer: the plain pull finds out and re-routes
                log.debug("can_wait(%s): %s", seg, exc)
                return False
        return cache[peer]

    def _read(self, reqs: list, deadline: float) -> None:
        _wait_source(self._submit(reqs, deadline))

    def _pull(self, v: int, src: dict, cks: list | None, deadline: float) -> None:
        t0 = time.monotonic()
        sources = [(src.get("replica"), bool(src.get("partial")))]
        self._set_progress(v, 0)
        mine = self._stream()
        total = sum(s[3] for s in mine)
        if not self._verify:
            cks = None
        ver = _Verifier(self, mine, cks, v)
        try:
            self._pull_verified(v, src, mine, total, ver, deadline, t0, sources, cks)
        finally:
            ver.close()

    def _pull_verified(self, v: int, src: dict, mine: list, total: int, ver: _Verifier, deadline: float, t0: float,
                       sources: list, cks: list | None) -> None:
        from tent_core.errors import TentError

        st = {"done": 0, "batches": 0, "staged": 0, "total": total, "t0": t0, "marks": []}
        reroutes = 0
        while True:
            ref = src["ref"]
            if [i[2] for i in ref.get("items", [])] != [s[3] for s in mine] or ref.get("pack") != self._wire_ref()["pack"]:
                raise RefhubError("layout_mismatch", f"source {src.get('replica')} has a different tensor layout")
            try:
                self._pull_from(v, src, mine, total, ver, st, deadline)
                break
            except _Reroute as rr:
                src = rr.src
            except (TentError, OSError, _SourceFailed) as exc:
                log.warning("replicate v%d: source %s failed at %d/%d bytes: %s", v, src.get("replica"), st["done"], total, exc)
                src = self._next_source(st["done"], deadline)
            sources.append((src.get("replica"), bool(src.get("partial"))))
            reroutes += 1
        ver.advance(total)
        ver.finish()
        if ver.digests:
            st["digest_in_copy"] = st.get("digest_in_copy", 0) + ver.received_in_transport()
            st["digest_late"] = sum(int(d.late) for d in ver.digests.values())
        dt = time.monotonic() - t0
        self.stats = {"bytes": total, "seconds": dt, "verify_s": ver.seconds, "verify_wait_s": round(ver.wait_s, 4),
                      "reroutes": reroutes, "sources": sources,
                      "batches": st["batches"], "staged_slices": st["staged"], "GBps": total / dt / 1e9 if dt else 0.0,
                      "starved_s": round(st.get("starved_s", 0.0), 4),  # waiting for a partial source's next bytes
                      # reads of a partial source's progress word alone, and those that found more (PROGRESS_PROBE)
                      "probes": [st.get("probes", 0), st.get("probe_hits", 0)],
                      # waiting READs (WAIT_READ): whether used, batches issued waiting, re-issues after NotReady
                      "wait_read": [bool(st.get("wait_read")), st.get("wait_batches", 0), st.get("wait_retries", 0)],
                      # waiting for the oldest batch (or a probe) with all the source held issued, and with the window full
                      "caught_up_s": round(st.get("caught_up_s", 0.0), 4), "window_full_s": round(st.get("window_full_s", 0.0), 4),
                      # from the start of the pull to its first landed batch (how far a pipeline hop starts late)
                      "first_s": round(st["first_t"] - t0, 4) if "first_t" in st else None,
                      # from the start of the pull to when it held each sixteenth of the bytes (where a pipeline
                      # hop's lag behind its source grows: pipeline_ab compares these along the chain)
                      "marks_s": [round(t - t0, 4) for t in st["marks"]],
                      # the windowed pull's submits: seconds in them, this thread's CPU seconds in them,
                      # how many, the longest (seconds)
                      "submit_s": [round(x, 4) if isinstance(x, float) else x for x in st.get("submit", [0.0, 0.0, 0, 0.0])],
                      "verified": cks is not None, "device_checksums": ver.device_checks,
                      "fused": bool(st.get("fused")),  # hashed inside the copy's lanes (see FUSED_VERIFY)
                      # bytes the executor hashed inside its copy loop (DIGEST_PIECE, tent/digest.h) or where
                      # it received them (RECV_DIGEST, Transport.receive_digest)
                      "digest_in_copy_bytes": int(st.get("digest_in_copy", 0)),
                      # of those, bytes that landed ahead of their tensor's stream (another connection's), hashed
                      # when the gap closed: from another core's cache (RECV_DIGEST_PIECE keeps it small)
                      "digest_late_bytes": int(st.get("digest_late", 0)),
                      # tensors compared on the pulling thread, their digests folded whole by the transport
                      # (INLINE_CHECK); the others in the verify lanes
                      "digest_checked_inline": ver.checked_here,
                      # what the link waited for this reader's requests, per batch: mean, largest (refhub.window)
                      "request_delay_s": [round(st["delay"].mean_s, 4), round(st["delay"].max_s, 4)] if "delay" in st
                      else None}

    def _pull_from(self, v: int, src: dict, mine: list, total: int, ver: _Verifier, st: dict, deadline: float) -> None:
        """Windowed READs of [st["done"], total) from one source: up to WINDOW batches in flight; each
        completed batch advances the progress word and the verifier (hashing overlaps the wire)."""
        from collections import deque

        ref = src["ref"]
        seg = ref["seg"]
        ritems = ref["items"]
        partial = bool(src.get("partial"))
        starts = []
        pos = 0
        for m in mine:
            starts.append(pos)
            pos += m[3]
        copyish = [m[1] is None or r[1] < 0 for m, r in zip(mine, ritems, strict=True)]
        inflight: deque = deque()
        issued = done0 = st["done"]
        t_start = time.monotonic()
        avail = total if not partial else 0
        # waiting READs (WAIT_READ): every READ waits at the source for its bytes, so nothing gates issuing
        can_wait = WAIT_READ and not any(copyish) and self._can_wait(seg)
        waiting = can_wait and (partial or WAIT_FULL not in ("0", "auto"))
        # a complete copy's reader in order where its measured rate is slow (WAIT_FULL "auto"): judged
        # from its first completed batch on, until the source turns out not to answer waiting READs
        full_auto = can_wait and not partial and WAIT_FULL == "auto"
        if waiting:
            avail = total
            st["wait_read"] = True
        thr = self.throttle_Bps
        t_thr, base = time.monotonic(), issued
        # the first batches are small: this reader's progress word (what readers of its own partial copy
        # see) must move early, or every hop of a pipeline chain inherits the delay; the measured rate
        # sizes the batches from the first completion on
        batch_bytes = min(MIN_BATCH, CHUNK, BATCH) if not partial else PARTIAL_MIN_BATCH
        window = WINDOW * batch_bytes
        rtt = 0.0  # the fastest tiny read of the source's progress word (reading a partial copy)
        st["delay"] = RequestDelay()  # what the link waited for our requests (stats; refhub.window)
        probe = None  # the outstanding read of the source's progress word alone (PROGRESS_PROBE)

        def adapt() -> None:
            # keep about INFLIGHT_S seconds of the measured rate on the wire (every batch must finish
            # within its deadline even on a slow link), at least WINDOW batches; from a partial copy
            # only PARTIAL_INFLIGHT_S, or a few round trips (what is in flight is bounded by what the
            # source holds anyway)
            nonlocal batch_bytes, window, waiting
            rate = st["rate"] = (st["done"] - done0) / max(1e-6, time.monotonic() - t_start)
            if full_auto:
                waiting = full_read_in_order(rate, WAIT_FULL_SPREAD, WAIT_FULL_LAG_S, self._serving_v == v)
                st["wait_read"] = st.get("wait_read", False) or waiting
            if partial:
                if not thr:
                    batch_bytes = max(PARTIAL_MIN_BATCH, min(BATCH, int(rate * PARTIAL_BATCH_S)))
                ahead = WAIT_INFLIGHT_S if waiting else max(PARTIAL_INFLIGHT_S, RTT_WINDOWS * rtt)
                window = max(WINDOW * batch_bytes, PARTIAL_MIN_WINDOW, min(MAX_INFLIGHT, int(rate * ahead)))
                return
            if not thr:
                batch_bytes = max(MIN_BATCH, min(BATCH, int(rate * BATCH_S)))
            window = max(WINDOW * batch_bytes, min(MAX_INFLIGHT, int(rate * INFLIGHT_S)))
        last_report = time.monotonic()
        sleep = 0.0005
        if (FUSED_VERIFY and not partial and not thr and ver.streamed and not any(copyish)
                and {m[0] for m in mine if m[0] != "__pack__"} == ver.streamed and st["done"] in starts):
            if self._pull_fused(v, ref, mine, starts, ver, st, deadline):
                return
            issued = st["done"]
        try:
            while st["done"] < total:
                try:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"replicate v{v}: deadline passed at {st['done']}/{total} bytes")
                    if issued < total and (issued - st["done"] < window or not inflight) and len(inflight) < PROGRESS_SLOTS:
                        if partial and avail <= issued:
                            if inflight and PROGRESS_PROBE:
                                if probe is None:
                                    probe = self._submit([(self._scratch, 0, seg, ref["progress"], 8)], deadline)
                                t_probe = time.monotonic()
                                # whichever lands first, the probe or the oldest batch; blocking waits of
                                # PROBE_POLL_S each (one wait of PROBE_WAIT_S for the probe alone left landed
                                # batches waiting; 0.5 ms polls took the CPU the sources needed)
                                answered = probe.wait(PROBE_POLL_S)
                                while not answered and not inflight[0][1].wait(PROBE_POLL_S):
                                    if time.monotonic() - t_probe > PROBE_WAIT_S:
                                        break
                                    answered = probe.wait(PROBE_POLL_S)
                                st["caught_up_s"] = st.get("caught_up_s", 0.0) + time.monotonic() - t_probe
                                if answered:
                                    probe = None
                                    seen = avail
                                    avail = _merge_avail(avail, self._progress_word(v, 0), issued)
                                    st["probes"] = st.get("probes", 0) + 1
                                    if avail > seen:
                                        st["probe_hits"] = st.get("probe_hits", 0) + 1
                                        continue
                            if inflight:  # their completions bring a fresher progress word: no blocking read
                                t_w = time.monotonic()
                                avail = _merge_avail(avail, self._complete_oldest(v, inflight, st, ver), issued)
                                st["caught_up_s"] = st.get("caught_up_s", 0.0) + time.monotonic() - t_w
                                adapt()
                                continue
                            t_rtt = time.monotonic()
                            if probe is not None:  # slot 0 is the probe's: let it land first
                                _wait_source(probe)
                                probe = None
                            self._read([(self._scratch, 0, seg, ref["progress"], 8)], deadline)
                            rtt = min(rtt or 1e9, time.monotonic() - t_rtt)
                            avail = _merge_avail(avail, self._progress_word(v, 0), issued)
                        if avail > issued:
                            k = bisect.bisect_right(starts, issued) - 1
                            if copyish[k]:
                                if not inflight:
                                    end = min(avail, starts[k] + mine[k][3])
                                    self._copy_range(v, src, mine[k], ritems[k], starts[k], issued, end, st, deadline, ver)
                                    issued = st["done"] = end
                                    self._set_progress(v, end)
                                    ver.advance(end)
                                    sleep = 0.0005
                                else:
                                    avail = _merge_avail(avail, self._complete_oldest(v, inflight, st, ver), issued)
                                continue
                            end = min(avail, issued + batch_bytes)
                            names = []
                            # each tensor's requests, in stream order, with the stream position each one ends at
                            per: list[list[tuple]] = []
                            for j in range(k, len(mine)):
                                if starts[j] >= end or copyish[j] or (
                                        ver.digests and ver.arm and len(names) >= FUSED_GROUP_MAX):
                                    end = min(end, starts[j])  # (a submit arms FUSED_GROUP_MAX digests at most)
                                    break
                                _, lb, loff, nb = mine[j]
                                names.append(mine[j][0])
                                a, b = max(issued, starts[j]), min(end, starts[j] + nb)
                                step = min(CHUNK, batch_bytes, RECV_DIGEST_PIECE if ver.digests and ver.arm else CHUNK)
                                if waiting and WAIT_PIECE > 0:
                                    step = min(step, WAIT_PIECE)
                                per.append([((lb, loff + c - starts[j], seg, ritems[j][1] + c - starts[j], min(step, b - c)),
                                             c + min(step, b - c)) for c in range(a, b, step)])
                            if ver.digests and ver.arm:
                                # the tensors' pieces take turns: the transport's connections each carry about one
                                # tensor's pieces in order, so they land in stream order and are hashed where they
                                # land (rather than when the gap before them closes, from another core's cache)
                                pairs = [q for turn in itertools.zip_longest(*per) for q in turn if q is not None]
                            else:
                                pairs = [q for qs in per for q in qs]
                            reqs = [q for q, _ in pairs]
                            waits = None
                            slot = 0
                            if waiting:  # each READ waits at the source until its word covers the READ's end
                                vb = v << VERSION_SHIFT
                                waits = [WaitWord(ref["progress"], vb, vb | e, vb | BYTES_MASK, WAIT_TIMEOUT_S)
                                         for _, e in pairs]
                                st["wait_batches"] = st.get("wait_batches", 0) + 1
                            elif partial:
                                slot = 1 + st["batches"] % PROGRESS_SLOTS
                                reqs.append((self._scratch, 8 * slot, seg, ref["progress"], 8))
                            if thr:
                                time.sleep(max(0.0, t_thr + (end - base) / thr - time.monotonic()))
                            # its round trip less what was queued ahead of it: the request delay (refhub.window)
                            w0, c0 = time.perf_counter(), time.thread_time()
                            if waits is None:
                                hdl = self._submit(reqs, deadline, digest=ver.digests_for(names))
                            else:
                                hdl = self._submit(reqs, deadline, digest=ver.digests_for(names), waits=waits)
                            # the submit's wall time against this thread's CPU in it: what it waited for
                            # (a lock, the GIL, a core), during which this copy's progress word stood still
                            sub = st.setdefault("submit", [0.0, 0.0, 0, 0.0])
                            w = time.perf_counter() - w0
                            sub[0] += w
                            sub[1] += time.thread_time() - c0
                            sub[2] += 1
                            sub[3] = max(sub[3], w)
                            inflight.append((end, hdl, slot, time.monotonic(), end - st["done"]))
                            st["batches"] += 1
                            issued = end
                            sleep = 0.0005
                            continue
                    if inflight:
                        t_w = time.monotonic()
                        avail = _merge_avail(avail, self._complete_oldest(v, inflight, st, ver), issued)
                        st["window_full_s"] = st.get("window_full_s", 0.0) + time.monotonic() - t_w
                        adapt()
                        continue
                    # a partial source has nothing more yet: wait, and ask the server now and then
                    if time.monotonic() - last_report > 0.5:
                        last_report = time.monotonic()
                        rep = self.conn.request({"op": "progress", "h": self.hid, "done": st["done"]}, self.request_timeout)
                        if "src" in rep:
                            raise _Reroute(rep["src"])
                    time.sleep(sleep)
                    st["starved_s"] = st.get("starved_s", 0.0) + sleep
                    sleep = min(sleep * 2, 0.005)  # how late this hop of a chain may notice the first bytes
                except NotReadyError:
                    # a READ waited out WAIT_TIMEOUT_S at the source (it stalled), or the source no
                    # longer holds version v: drop what is in flight, go on from what landed; the plain
                    # pull takes over when the source's word is not of v (it re-routes as before)
                    if not waiting:
                        raise
                    for _, hdl, *_ in inflight:
                        hdl.cancel()
                        try:
                            hdl.wait(2.0)
                        except Exception:
                            pass
                    inflight.clear()
                    issued = st["done"]
                    st["wait_retries"] = st.get("wait_retries", 0) + 1
                    self._read([(self._scratch, 0, seg, ref["progress"], 8)], deadline)
                    if self._progress_word(v, 0) < 0:
                        waiting = full_auto = False
                        avail = st["done"] if partial else total
                    adapt()
        finally:
            if probe is not None:
                probe.cancel()
                try:
                    probe.wait(2.0)
                except Exception:
                    pass
            for _, hdl, *_ in inflight:  # an error or a re-route: stop what is still on the wire
                hdl.cancel()
                try:
                    hdl.wait(2.0)
                except Exception:
                    pass

    def _pull_fused(self, v: int, ref: dict, mine: list, starts: list, ver: _Verifier, st: dict, deadline: float) -> bool:
        """Fused copy + hash of [st["done"], total) (a tensor boundary): the pack (tiny tensors) in one
        batch, checked as in the windowed pull, then each large tensor on one lane, READ piece by piece,
        each piece hashed right after it landed (this thread's cache). Returns False, having moved
        at most the pack, when the path does not copy a piece inside submit (st["done"] says how far it
        got: the windowed pull goes on from there). Progress advances tensor by tensor, contiguously."""
        seg, ritems = ref["seg"], ref["items"]
        k0 = starts.index(st["done"])
        n_lanes = max(1, len(ver.lanes) or 1)
        large = [m[3] for m in mine[k0:] if m[0] != "__pack__"]
        # a tensor is copied and hashed by one lane, in order: one much larger than a lane's share
        # would leave the other cores idle while it finishes (the windowed pull spreads it over all)
        if large and max(large) * FUSED_MAX_SHARE * n_lanes > sum(large):
            return False
        # no transport of this engine completes a READ inside submit (tcp alone): the probe below could
        # only fail, after the pack and a 1 MiB READ each waited for alone, before the window started
        # (~4 ms of a 1 GiB replicate over loopback tcp, none of it overlapped: docs/benchmarks.md)
        if not any(getattr(t, "inline_completes_bytes", 0) > 0 for t in getattr(self.engine, "transports", {}).values()):
            return False
        if mine[k0][0] == "__pack__":
            name, lb, loff, nb = mine[k0]
            reqs = [(lb, loff + c, seg, ritems[k0][1] + c, min(CHUNK, nb - c)) for c in range(0, nb, CHUNK)]
            self._read(reqs, deadline)
            st["done"] = starts[k0] + nb
            st["batches"] += 1
            self._set_progress(v, st["done"])
            ver.advance(st["done"])
            k0 += 1
        if k0 >= len(mine):
            return True
        # probe: the first piece of the next tensor lands before submit returns: every route it took
        # is a transport that copies such a piece on the submitting thread (a race of a fast network
        # answer with this poll must not count)
        name, lb, loff, nb = mine[k0]
        piece = min(FUSED_PIECE, nb)
        hdl = self._submit([(lb, loff, seg, ritems[k0][1], piece)], deadline)
        inline = hdl.poll() == "done"
        _wait_source(hdl)
        routes = hdl.routes() if inline and hasattr(hdl, "routes") else []
        if not routes or not all(getattr(r.transport, "inline_completes_bytes", 0) >= piece for r in routes):
            return False
        # the executor folds each piece into the tensor's digest as it copies it (C, cache-hot): pieces as
        # long as every route copies inline; the lane folds in Python only what was not (a retry elsewhere)
        dpiece = min([DIGEST_PIECE] + [int(getattr(r.transport, "inline_bytes", 0)) for r in routes])
        if not all(getattr(r.transport, "inline_digest", False) for r in routes):
            dpiece = 0
        todo = list(range(k0, len(mine)))
        nxt = [0]  # lanes take the next tensors in stream order (the prefix advances evenly)
        left = [sum(mine[k][3] for k in todo)]
        landed = [False] * len(mine)
        in_copy = [0] * max(1, n_lanes)  # per lane: bytes the executor folded into the digest as it copied them
        cv = threading.Condition()
        stop = threading.Event()
        errors: list[BaseException] = []

        def claim(grouped: bool) -> list[int]:
            """The next tensors for a lane (under cv): one, or with the executor's digest as many whole
            tensors as FUSED_GROUP holds (one submit for all: the lane's Python per byte shrinks),
            smaller near the end so the lanes finish together."""
            i = nxt[0]
            if i >= len(todo):
                return []
            grouped = grouped and isinstance(ver.exp[mine[todo[i]][0]], int)  # type: ignore[index]
            cap = min(FUSED_GROUP, max(dpiece, left[0] // (FUSED_TAIL * n_lanes))) if grouped else 0
            got = [todo[i]]
            size = mine[todo[i]][3]
            i += 1
            while (i < len(todo) and len(got) < FUSED_GROUP_MAX and size + mine[todo[i]][3] <= cap
                   and isinstance(ver.exp[mine[todo[i]][0]], int)):  # type: ignore[index]
                size += mine[todo[i]][3]
                got.append(todo[i])
                i += 1
            nxt[0] = i
            left[0] -= size
            return got

        def lane(w: int) -> None:
            t_lane = time.perf_counter()
            try:
                while True:
                    with cv:
                        group = claim(dpiece > 0)
                    if not group:
                        return
                    if dpiece > 0 and all(isinstance(ver.exp[mine[k][0]], int) for k in group):  # type: ignore[index]
                        in_copy[w] += self._fused_digest(v, ref, [(mine[k], ritems[k][1], FUSED_PIECE if k == k0 else 0,
                                                                  ver.exp[mine[k][0]]) for k in group],  # type: ignore[index]
                                                         dpiece, stop, deadline)
                        with cv:
                            for k in group:
                                landed[k] = True
                            cv.notify()
                        continue
                    for k in group:
                        name, lb, loff, nb = mine[k]
                        flat = self.items[name].arr.reshape(-1).view(np.uint8)  # type: ignore[union-attr]
                        first = FUSED_PIECE if k == k0 else 0  # landed by the probe
                        sh = StreamHash(ver.exp[name], _xxhash)  # type: ignore[index]
                        if first:
                            sh.update(flat[:min(first, nb)])
                        for c in range(first, nb, FUSED_PIECE):
                            if stop.is_set():
                                return
                            m = min(FUSED_PIECE, nb - c)
                            _wait_source(self._submit([(lb, loff + c, seg, ritems[k][1] + c, m)], deadline))
                            sh.update(flat[c:c + m])
                        if sh.n != nb or sh.digest() != ver.exp[name]:  # type: ignore[index]
                            raise ChecksumError("checksum", f"v{v} shard {self.shard}: end-to-end checksum mismatch in {name!r}")
                        with cv:
                            landed[k] = True
                            cv.notify()
            except BaseException as exc:  # the pulling thread raises it
                with cv:
                    errors.append(exc)
                    stop.set()
                    cv.notify()
            finally:
                ver.lane_s[w % len(ver.lane_s)] += time.perf_counter() - t_lane

        threads = [threading.Thread(target=lane, args=(i,), name="refhub-fused", daemon=True)
                   for i in range(min(n_lanes, len(todo)))]
        for t in threads:
            t.start()
        k = k0
        verified = False
        try:
            with cv:
                while k < len(mine) and not errors:
                    while k < len(mine) and landed[k]:
                        k += 1
                    end = starts[k] if k < len(mine) else starts[-1] + mine[-1][3]
                    if end > st["done"]:
                        if "first_t" not in st:
                            st["first_t"] = time.monotonic()
                        st["done"] = end
                        self._set_progress(v, end)
                        _mark(st, end, time.monotonic())
                    if k < len(mine) and not errors:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"replicate v{v}: deadline passed at {st['done']}/{end} bytes")
                        cv.wait(0.05)
            verified = True
        finally:
            stop.set()
            for t in threads:
                t.join(max(1.0, deadline - time.monotonic() + 2.0))
            if verified or not errors or not isinstance(errors[0], ChecksumError):
                ver.skip_to(st["done"])  # what a re-routed pull resumes after was verified here
        if errors:
            raise errors[0]
        st["batches"] += len(todo)
        st["fused"] = True
        st["digest_in_copy"] = sum(in_copy)
        return True

    def _fused_digest(self, v: int, ref: dict, group: list[tuple], piece: int, stop: threading.Event,
                      deadline: float) -> int:
        """Whole tensors of a fused pull, [(item, remote offset, bytes landed already (the probe),
        expected digest)], READ in one submit in pieces of `piece` bytes with a digest armed per tensor:
        the executor copies them on this thread, in order, and folds each run into its tensor's digest
        right after copying it (from this core's cache, in C). What it did not fold (another route took
        a piece, a retry: the rest of that tensor no longer continues its stream) is folded here from
        the landed bytes, in stream order. Returns the bytes folded in the copy."""
        from tent_core import Digest

        ds, flats, reqs = [], [], []
        here = total = 0  # bytes folded by this thread; bytes of the group
        for (name, lb, loff, nb), roff, first, _ in group:
            flat = self.items[name].arr.reshape(-1).view(np.uint8)  # type: ignore[union-attr]
            base = int(flat.ctypes.data)
            d = Digest(base, base + nb)
            if first:
                d.update(flat[:min(first, nb)])
                here += min(first, nb)
            reqs += [(lb, loff + c, ref["seg"], roff + c, min(piece, nb - c)) for c in range(first, nb, piece)]
            ds.append(d)
            flats.append((flat, base))
            total += nb
        if stop.is_set():
            return 0
        if reqs:
            _wait_source(self._submit(reqs, deadline, digest=ds))
        unfolded = 0
        for ((name, _, _, nb), _, _first, expected), d, (flat, base) in zip(group, ds, flats, strict=True):
            if d.next != base + nb:  # not folded by the copy: fold the landed bytes here, in order
                unfolded += base + nb - d.next
                d.update(flat[d.next - base:nb])
            if d.folded != nb or d.intdigest() != expected:
                raise ChecksumError("checksum", f"v{v} shard {self.shard}: end-to-end checksum mismatch in {name!r}")
        return total - here - unfolded

    def _complete_oldest(self, v: int, inflight: Any, st: dict, ver: _Verifier) -> int:
        """Wait for the oldest batch in flight, publish our progress, verify what it completed; returns
        the source's progress the batch read along (0: none, or not of version v)."""
        end, hdl, slot, t_sub, queued = inflight[0]
        _wait_source(hdl)
        inflight.popleft()
        now = time.monotonic()
        if "first_t" not in st:
            st["first_t"] = now
        if st.get("rate"):
            st["delay"].observe(now - t_sub, queued, st["rate"])
        st["done"] = end
        self._set_progress(v, end)
        _mark(st, end, now)
        ver.advance(end)
        return self._progress_word(v, slot) if slot else 0

    def _progress_word(self, v: int, slot: int) -> int:
        """Bytes of version v the source holds, per the word read into `slot`; -1: it holds none of v
        (not started yet, its receive failed, or it moved on)."""
        word = int(self._scratch.array[8 * slot:8 * slot + 8].view(np.uint64)[0])
        return word & BYTES_MASK if (word >> VERSION_SHIFT) == v else -1

    def _stage_sock(self, addr: str) -> tuple[zmq.Socket, ZmqClientAuth]:
        s = self._stage_socks.get(addr)
        if s is None:
            s = self.conn.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.MAXMSGSIZE, STAGE_MAX_MSG)
            s.setsockopt(zmq.SNDHWM, STAGE_HWM)
            s.setsockopt(zmq.RCVHWM, STAGE_HWM)
            s.connect(addr)
            auth = self.conn.auth
            ca = ZmqClientAuth(auth.key("refhub-stage") if auth else None)
            try:
                ca.handshake(s, self.stage_timeout)
            except AuthError as exc:
                s.close(0)
                raise _SourceFailed(f"stager {addr}: {exc}") from exc
            self._stage_socks[addr] = s
            self._stage_auth[addr] = ca
        return s, self._stage_auth[addr]

    def _drop_stage_sock(self, addr: str) -> None:
        s = self._stage_socks.pop(addr, None)
        self._stage_auth.pop(addr, None)
        if s is not None:
            s.close(0)

    def _copy_range(self, v: int, src: dict, m: tuple, r: list, start: int, a: int, b: int, st: dict,
                    deadline: float, ver: _Verifier | None = None) -> None:
        """[a, b) of one stream item where either side is a copy-mode tensor: slice by slice, the source
        stages a slice (STAGE_DEPTH requests ahead), we READ it (into a landing buffer when our tensor
        is copy mode too, then copied into place), release the slot and advance the progress word."""
        from collections import deque

        ref = src["ref"]
        seg = ref["seg"]
        name, lb, loff, _ = m
        src_copy = r[1] < 0
        slot_bytes = min(int(ref.get("slot", STAGE_SLOT)), STAGE_SLOT) if src_copy else STAGE_SLOT
        pieces = [(x, min(x + slot_bytes, b)) for x in range(a, b, slot_bytes)]
        if lb is None and self._landing is None:
            self._landing = self.engine.allocate(STAGE_SLOT, segment=f"{self.segment}-landing")
        dev = self.items[name].dev
        if lb is None and dev is not None and not self._landing_pinned:
            self._landing_pinned = bool(dev.runtime.pin(self._landing.addr, self._landing.length))
        addr = ref.get("stager") if src_copy else None
        if src_copy and not addr:
            raise _SourceFailed(f"source {src.get('replica')} serves {r[0]!r} in copy mode but runs no stager")
        sock, ca = self._stage_sock(addr) if src_copy else (None, None)
        asked: deque = deque()
        replies: dict[int, dict] = {}
        held: list[int] = []

        def ask(i: int) -> None:
            x, y = pieces[i]
            rid = next(self._stage_rid)
            sock.send_multipart(ca.wrap(msgpack.packb({"op": "stage", "rid": rid, "v": v, "item": r[0], "off": x - start,
                                                       "len": y - x})))
            asked.append(rid)

        def answer(rid: int) -> dict:
            end_t = min(deadline, time.monotonic() + self.stage_timeout)
            while rid not in replies:
                left = end_t - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000) + 1):
                    raise _SourceFailed(f"stager {addr} did not answer within {self.stage_timeout:.1f}s")
                try:
                    payload = ca.unwrap(sock.recv_multipart())
                except AuthError as exc:
                    raise _SourceFailed(f"stager {addr}: {exc}") from exc
                rep = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                if isinstance(rep, dict):
                    replies[rep.get("rid", 0)] = rep
            rep = replies.pop(rid)
            if not rep.get("ok"):
                raise _SourceFailed(f"stager {addr}: {rep.get('err')}: {rep.get('msg')}")
            return rep

        t_c = time.monotonic()
        try:
            if src_copy:
                for i in range(min(STAGE_DEPTH, len(pieces))):
                    ask(i)
            for i, (x, y) in enumerate(pieces):
                if src_copy:
                    rep = answer(asked.popleft())
                    held.append(rep["slot"])
                    roff = rep["roff"]
                    if i + STAGE_DEPTH < len(pieces):
                        ask(i + STAGE_DEPTH)
                    st["staged"] += 1
                else:
                    roff = r[1] + x - start
                local, lo = (self._landing, 0) if lb is None else (lb, loff + x - start)
                if self.throttle_Bps:
                    time.sleep(max(0.0, t_c + (y - a) / self.throttle_Bps - time.monotonic()))
                self._read([(local, lo, seg, roff, y - x)], deadline)
                if src_copy:
                    sock.send_multipart(ca.wrap(msgpack.packb({"op": "release", "rid": 0, "slot": held.pop()})))
                if lb is None:
                    landed = self._landing.array[:y - x]
                    it = self.items[name]
                    if it.dev is not None and ver is not None:
                        ver.feed(name, x - start, landed)  # hashed here, on its way to the device
                    it.write_from(landed, x - start)
                st["done"] = y
                self._set_progress(v, y)
        except BaseException:
            if src_copy:
                self._drop_stage_sock(addr)  # late replies must not reach a later pull; leases expire
            raise

    def _next_source(self, done: int, deadline: float) -> dict:
        while time.monotonic() < deadline:
            rep = self.conn.request({"op": "progress", "h": self.hid, "done": done, "failed": True}, self.request_timeout)
            if "src" in rep:
                return rep["src"]
            time.sleep(0.05)
        raise TimeoutError("replicate: no alternative source before the deadline")

    def list(self) -> dict:
        return self.conn.request({"op": "list", "h": self.hid}, self.request_timeout)

    def wait(self, predicate: dict, timeout: float = 30.0) -> bool:
        """Block until the predicate holds for the model (or `timeout`): e.g. {"version_at_least": 3}."""
        rep = self.conn.request({"op": "wait", "h": self.hid, "pred": predicate, "timeout": timeout}, timeout + 5.0)
        return bool(rep.get("met"))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self.state == "published" and self.kind != "offload":
                self.unpublish()
            try:
                self.conn.request({"op": "close", "h": self.hid}, self.request_timeout)
            except (TimeoutError, RefhubError) as exc:
                log.warning("close: %s", exc)
            self._closed = True
            self.conn.handles.pop(self.hid, None)
            if self._stager is not None:
                self._stager.close()
            for addr in list(self._stage_socks):
                self._drop_stage_sock(addr)
            for it in self.items.values():
                if it.buf is not None:
                    self.engine.unregister(it.buf)
            for b in (self._pack, self._landing, self._ctrl, self._scratch):
                if b is not None:
                    self.engine.unregister(b)
            self.items.clear()

    def __enter__(self) -> ShardHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(model: str, *, replica: str = "0", shard: int = 0, num_shards: int = 1, retain: dict | None = None,
         datacenter: str = "default", spot: bool = False, server: str = "tcp://127.0.0.1:5555",
         backup: str | None = None, engine: Any = None, hb_interval: float = 0.5, failover_after: float = 2.0,
         request_timeout: float = 30.0, throttle_Bps: float | None = None, mode: str = "direct") -> ShardHandle:
    """Open a shard handle. `server` may be an address or "embedded" (start a server in this process).
    `mode` is the default for register(): "direct" (zero copy, the default) or "copy" (staging slots)."""
    if server == "embedded":
        from .server import start_embedded

        server = start_embedded()
    conn = _connection(server, backup, hb_interval, failover_after)
    return ShardHandle(conn, engine or default_engine(), model, replica, shard, num_shards, retain, datacenter, spot,
                       request_timeout=request_timeout, throttle_Bps=throttle_Bps, mode=mode)


Predicate = Callable[[dict], bool]
