"""Target-side staging: a peer's device memory reached through the peer's own host staging.

When no transport of the initiator reaches the target's device memory (a GPU on another host
without GPUDirect, a simulated device across processes with IPC off...), the *target* stages: it
copies between a few host staging slots of its own and its device memory with its local
transports (nvlink, ascend, simdev on its self-peer), and the initiator moves bytes between its
buffer and those slots over any transport that reaches the target's host memory (TCP...). When the
initiator's buffer is device memory too, it stages on its side as well (both-staged). Chunks are
pipelined: while the wire carries chunk n+1, the target copies chunk n.

Control exchange (messages on the target's control port, `tent_core.metadata.ControlServer`):

* ``stage_open`` {seg, offset, length, write, depth, chunk, deadline_s, from} -> {sid, chunk,
  segment, slots: [segment offsets], slot_bytes}. The target checks the range against its own
  registered buffers, bounds and permission (a WRITE session needs a writable buffer, a READ one a
  readable buffer) and that the memory is a kind it stages; then leases up to `depth` slots.
  ``busy`` in an error reply: no slot is free now, try again.
* ``stage_push`` {sid, slot, off, len}: the initiator wrote [off, off+len) of the session range into
  slot `slot`; the target copies it into place. Replied when the copy is done (deferred reply).
* ``stage_pull`` {sid, slot, off, len}: the target copies [off, off+len) into the slot; replied when
  done, then the initiator reads the slot.
* ``stage_close`` {sid}: the session is over; its slots are freed once its copies are done. A
  session idle for `target_staging_lease_s` (its initiator vanished) is closed by the target.

Slots live in the target's segment ``_tent_tstage``, registered READ_WRITE: every peer that may
write the staged buffer at all can reach them (no new access); a peer can only ever move bytes of a
buffer whose permission allows it, because the target checks that at ``stage_open`` and copies only
within the session's range.

`TargetStager` is the target half (one per engine), `run_target_staged` the initiator half (runs in
the engine's staged-path workers, finalizing one unit of the batch).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import _native, devices, errors
from .batch import BatchHandle, status_of
from .config import EngineConfig
from .metadata import BatchReply, ControlClient
from .path_planner import chunk_plan, pipeline_chunk, ramped_chunk_plan
from .policy_rules import RequestTraits
from .request import LocalBuffer, Request
from .routing import Decision, Router, TargetStagedPath
from .types import CapabilityProfile, MemoryKind, OpCode, Permission, Priority

log = logging.getLogger(__name__)

STAGE_SEGMENT = "_tent_tstage"
STAGE_OPS = ("stage_open", "stage_push", "stage_pull", "stage_close")
_MAX_LEN = 1 << 62
# the initiator's pipeline sleeps at most this long between two looks at its batch's cancel flag
_WAKE_CAP_S = 0.02

# The chunk timeline, for diagnosis only (`python -m tent_bench.staging_timeline`): None (off, the
# default), or a list that both halves append (time.monotonic_ns(), event, chunk offset[, stage])
# to: the initiator "submit" / "done" for each stage of each chunk and "sleep" for each wait of its
# pipeline, the target "arrive" / "start" / "finish" for each chunk's device copy.
TIMELINE: list[tuple[Any, ...]] | None = None


def _mark(*event: Any) -> None:
    timeline = TIMELINE
    if timeline is not None:
        timeline.append((time.monotonic_ns(), *event))

# typed errors a stager reply can name (by class name) and the initiator re-raises
_ERRORS: dict[str, type[errors.TentError]] = {
    cls.__name__: cls
    for cls in (
        errors.NotRegisteredError,
        errors.OutOfBoundsError,
        errors.PermissionDeniedError,
        errors.UnknownSegmentError,
        errors.NoPathError,
        errors.DeadlineExceededError,
        errors.InvalidRequestError,
        errors.TransferError,
        errors.PeerUnreachableError,
        errors.CancelledError,
    )
}


def stageable_kinds(profiles: Mapping[str, CapabilityProfile]) -> dict[MemoryKind, float]:
    """Device kinds some local transport copies to and from host memory on this host, with the best
    advertised rate (GB/s, 0 = unknown): what this engine can stage for its peers."""
    out: dict[MemoryKind, float] = {}
    for prof in profiles.values():
        if not prof.same_host:
            continue
        for a, b in prof.kind_pairs:
            if a == MemoryKind.HOST and b.is_device and (b, MemoryKind.HOST) in prof.kind_pairs:
                out[b] = max(out.get(b, 0.0), prof.bandwidth_gbps)
    return out


def _int(msg: Mapping[str, Any], key: str, lo: int = 0, hi: int = _MAX_LEN) -> int:
    v = msg.get(key)
    if type(v) is not int or not lo <= v <= hi:
        raise errors.ProtocolError(f"{msg.get('op')}: {key!r} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _error_reply(exc: BaseException) -> dict[str, Any]:
    return {"ok": False, "error": str(exc), "code": type(exc).__name__}


# ---------------------------------------------------------------------------------------- target


@dataclass(eq=False)  # kept in sets: identity
class _Session:
    sid: int
    initiator: str
    seg: str
    offset: int
    length: int
    write: bool
    kind: MemoryKind
    decision: Decision
    slots: list[LocalBuffer]
    expires: float
    pending: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    # copies submitted and not yet finalized (`_CopyReply.done`): close() waits for them
    copies: set[_CopyReply] = field(default_factory=set)
    # the session's copies run one after another, in arrival order (one device queue per session, as
    # one CUDA stream would): `running` on the device, the next ones waiting here
    running: _CopyReply | None = None
    queue: deque[_CopyReply] = field(default_factory=deque)


class _CopyReply(BatchReply):
    """One chunk's device copy, submitted by the control thread (on arrival, or when the session's
    previous copy finishes) and replied by that thread once the copy's batch finishes: the device's
    completion (a simdev stream worker, a CUDA/ACL callback thread) signals the control server's
    eventfd, so a chunk costs no hand-off to a copier thread and back. The copy runs as the device
    runs it, asynchronously (DMA on a real GPU). The initiator reuses a slot only after an ok reply,
    sent once the copy finished; an error reply fails its transfer, and the session's slots go back
    to the pool only once every copy of it has finished on the device, also one whose reply went out
    at its deadline."""

    __slots__ = ("failure", "finished", "n", "notifier", "push", "queued_until", "req", "sess", "stager")

    def __init__(self, stager: TargetStager, sess: _Session, req: Request, n: int, push: bool) -> None:
        super().__init__(None)  # the batch: once submitted
        self.stager, self.sess, self.req, self.n, self.push = stager, sess, req, n, push
        self.finished = False
        self.failure: errors.TentError | None = None
        self.notifier: Any = None
        self.queued_until = time.monotonic() + stager.config.request_deadline_s

    def arm(self, notifier: Any) -> None:
        self.notifier = notifier
        if self.batch is not None:
            self.batch.notify(notifier)

    def done(self) -> bool:
        handle: BatchHandle | None = self.batch
        if handle is None:  # waiting for the session's previous copy
            if self.failure is None and time.monotonic() >= self.queued_until:
                self.stager._drop_queued(self, errors.DeadlineExceededError(
                    "the copy waited for the session's previous one past its deadline"))
            return self.failure is not None
        if handle.remaining == 0 or self.finished:
            self.stager._copy_finished(self)
            return True
        if self.failure is not None:
            return True
        if handle.poll() == "pending":  # poll() also cancels a copy past its deadline
            return False
        if handle.remaining == 0:
            self.stager._copy_finished(self)
            return True
        # past its deadline with slices still on the device: the initiator hears of it now, the slot
        # (and the session's device queue) stays taken until the device lets go of it (TargetStager._sweep)
        self.failure = handle._deadline_error()
        return True

    def reply(self) -> dict[str, Any]:
        if self.failure is not None:
            return _error_reply(self.failure)
        return {"ok": True}


class TargetStager:
    """The target half: sessions, the slot pool and the copies between slots and device memory.

    `engine` must offer ``engine_id``, ``submit_leg(request, decision, deadline)``; `segments`
    ``allocate`` and `peers` the self-peer (``get``, ``map_remote``) as the engine's parts do."""

    def __init__(self, engine: Any, segments: Any, peers: Any, router: Router, profiles: Mapping[str, CapabilityProfile],
                 config: EngineConfig) -> None:
        self.engine = engine
        self.engine_id = engine.engine_id
        self.segments = segments
        self.peers = peers
        self.router = router
        self.config = config
        self.kinds = stageable_kinds(profiles) if config.target_staging else {}
        self.chunk = config.target_staging_chunk_bytes
        self._lock = threading.Lock()
        self._sessions: dict[int, _Session] = {}
        # closed sessions whose copies outlived their deadline on the device: slots return once it lets go
        self._draining: set[_Session] = set()
        self._free: list[LocalBuffer] = []
        self._made = 0
        self._sids = itertools.count(1)
        self._closed = False
        self.stats = {"sessions": 0, "pushed_bytes": 0, "pulled_bytes": 0, "copies": 0, "refused": 0, "expired": 0}

    def offer(self) -> dict[str, Any]:
        """What peers read in `describe` (PeerInfo.staging); empty when this engine stages nothing."""
        if not self.kinds:
            return {}
        return {
            "kinds": sorted(k.value for k in self.kinds),
            "chunk": self.chunk,
            "slots": self.config.target_staging_slots,
            "gbps": {k.value: rate for k, rate in self.kinds.items()},
        }

    # ---- control messages ---------------------------------------------------------------------

    def handle(self, msg: Mapping[str, Any]) -> dict[str, Any] | BatchReply:
        op = msg["op"]
        try:
            if op == "stage_open":
                return self._open(msg)
            if op in ("stage_push", "stage_pull"):
                return self._copy(msg, op == "stage_push")
            if op == "stage_close":
                self._close_session(_int(msg, "sid", 1), reason="closed by the initiator")
                return {"ok": True}
        except errors.ProtocolError:
            raise
        except errors.TentError as exc:
            self.stats["refused"] += 1
            return _error_reply(exc)
        raise errors.ProtocolError(f"unknown op {op!r}")

    def _open(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        if not self.kinds:
            raise errors.NoPathError(f"engine {self.engine_id} does not stage for peers")
        seg = msg.get("seg")
        if not isinstance(seg, str) or not seg:
            raise errors.ProtocolError("stage_open: 'seg' must be a non-empty string")
        offset, length = _int(msg, "offset"), _int(msg, "length", 1)
        write = msg.get("write")
        if not isinstance(write, bool):
            raise errors.ProtocolError("stage_open: 'write' must be a boolean")
        depth = _int(msg, "depth", 1, 1024)
        lease = min(self.config.target_staging_lease_s, float(msg.get("deadline_s") or self.config.target_staging_lease_s))
        self._reap()
        me = self.peers.get(self.engine_id)
        op = OpCode.WRITE if write else OpCode.READ
        pieces = self.peers.map_remote(me, seg, offset, length, op)  # bounds and permission, checked here
        if len(pieces) != 1:
            raise errors.InvalidRequestError(
                f"{self.engine_id}/{seg}: [{offset}, {offset + length}) spans {len(pieces)} buffers; stage each separately"
            )
        kind = pieces[0][0].kind
        if kind not in self.kinds:
            raise errors.NoPathError(f"{self.engine_id}/{seg}: {kind.value} memory is not staged here")
        decision = self.router.decide(RequestTraits(Priority.MID, self.chunk, MemoryKind.HOST, kind, True, None), me.reachable)
        slots = self._take_slots(min(depth, self.config.target_staging_depth), kind)
        if not slots:
            raise errors.TransferError(f"busy: every staging slot of {self.engine_id} is in use")
        sess = _Session(next(self._sids), str(msg.get("from", "?")), seg, offset, length, write, kind, decision, slots,
                        time.monotonic() + max(1.0, lease))
        with self._lock:
            self._sessions[sess.sid] = sess
        self.stats["sessions"] += 1
        return {"ok": True, "sid": sess.sid, "chunk": self.chunk, "segment": STAGE_SEGMENT,
                "slots": [s.offset for s in slots], "slot_bytes": self.chunk}

    def _take_slots(self, n: int, kind: MemoryKind) -> list[LocalBuffer]:
        out: list[LocalBuffer] = []
        with self._lock:
            while len(out) < n and self._free:
                out.append(self._free.pop())
            make = min(n - len(out), self.config.target_staging_slots - self._made)
            self._made += max(0, make)
        for _ in range(max(0, make)):
            try:
                buf = self.segments.allocate(self.chunk, STAGE_SEGMENT, Permission.READ_WRITE)
            except BaseException:
                with self._lock:
                    self._made -= 1
                raise
            rt = devices.for_kind(kind)
            if rt is not None:
                try:
                    rt.pin(buf.addr, buf.length)  # page-locked: host<->device copies run as DMA
                except Exception as exc:
                    log.debug("could not pin a staging slot: %s", exc)
            out.append(buf)
        return out

    def _session(self, sid: int) -> _Session:
        with self._lock:
            sess = self._sessions.get(sid)
        if sess is None or sess.closed:
            raise errors.InvalidRequestError(f"no staging session {sid} on {self.engine_id} (closed or expired)")
        return sess

    def _copy(self, msg: Mapping[str, Any], push: bool) -> _CopyReply:
        sess = self._session(_int(msg, "sid", 1))
        slot = _int(msg, "slot", 0, len(sess.slots) - 1)
        off, n = _int(msg, "off"), _int(msg, "len", 1, self.chunk)
        if off + n > sess.length:
            raise errors.OutOfBoundsError(f"staging session {sess.sid}: [{off}, {off + n}) is outside its {sess.length} bytes")
        if push != sess.write:
            raise errors.InvalidRequestError(f"staging session {sess.sid} is a {'WRITE' if sess.write else 'READ'} session")
        req = Request(OpCode.WRITE if push else OpCode.READ, sess.slots[slot], 0, f"{self.engine_id}/{sess.seg}",
                      sess.offset + off, n)
        copy = _CopyReply(self, sess, req, n, push)
        _mark("arrive", off)
        with sess.lock:
            if sess.closed:
                raise errors.InvalidRequestError(f"staging session {sess.sid} is closed")
            sess.pending += 1
            sess.expires = time.monotonic() + self.config.target_staging_lease_s
            if sess.running is not None:
                sess.queue.append(copy)
                return copy
            sess.running = copy
        self._start(copy)
        if copy.finished and copy.failure is not None:
            raise copy.failure  # not submitted (the range went away...): replied at once
        return copy

    def _start(self, copy: _CopyReply) -> None:
        """Submit the session's running copy (on the control thread); a copy that cannot be submitted
        is finished with its error, and the next one starts."""
        _mark("start", copy.req.remote_offset - copy.sess.offset)
        try:
            handle = self.engine.submit_leg(copy.req, copy.sess.decision, self.config.request_deadline_s)
        except errors.TentError as exc:
            copy.failure = exc
            self._copy_finished(copy)
            return
        copy.batch = handle
        with copy.sess.lock:
            copy.sess.copies.add(copy)
        if copy.notifier is not None:
            handle.notify(copy.notifier)
        # an executor that may leave work to a waiter: nobody waits on this batch, its workers run it
        handle.kick()

    def _drop_queued(self, copy: _CopyReply, why: errors.TentError) -> None:
        """A copy that never reached the device (queue deadline, session closed): fails, no slot held."""
        sess = copy.sess
        with sess.lock:
            if copy.finished or copy not in sess.queue:
                return
            sess.queue.remove(copy)
            copy.finished = True
            copy.failure = why
        self._copy_done(sess)

    def _copy_finished(self, copy: _CopyReply) -> None:
        """A copy's batch finished (done or failed): count it and let its session go on. Once per copy,
        from whichever thread saw it finish first (the control thread, or close())."""
        sess = copy.sess
        with sess.lock:
            if copy.finished:
                return
            copy.finished = True
            _mark("finish", copy.req.remote_offset - sess.offset)
            sess.copies.discard(copy)
            nxt = None
            if sess.running is copy:
                sess.running = nxt = sess.queue.popleft() if sess.queue and not sess.closed else None
        if copy.batch is not None:
            try:
                copy.batch.wait(0)  # raises the copy's typed error
            except errors.TentError as exc:
                copy.failure = copy.failure or exc
        if copy.failure is None:
            self.stats["pushed_bytes" if copy.push else "pulled_bytes"] += copy.n
            self.stats["copies"] += 1
        self._copy_done(sess)
        if nxt is not None:
            self._start(nxt)

    def _copy_done(self, sess: _Session) -> None:
        with sess.lock:
            sess.pending -= 1
            release = sess.closed and sess.pending == 0
        if release:
            self._release_slots(sess)

    def _close_session(self, sid: int, reason: str) -> None:
        with self._lock:
            sess = self._sessions.pop(sid, None)
        if sess is None:
            return
        log.debug("staging session %d of %s: %s", sid, sess.initiator, reason)
        with sess.lock:
            sess.closed = True
            queued = list(sess.queue)
        for copy in queued:  # never reached the device: failed now, their replies go out
            self._drop_queued(copy, errors.InvalidRequestError(f"staging session {sid} is closed"))
        with sess.lock:
            release = sess.pending == 0
        if release:
            self._release_slots(sess)
        else:
            with self._lock:
                self._draining.add(sess)

    def _release_slots(self, sess: _Session) -> None:
        with self._lock:
            self._free.extend(sess.slots)
            self._draining.discard(sess)
        sess.slots = []

    def _sweep(self) -> None:
        """Finalize copies whose reply went out at their deadline and that the device has let go of
        since: their slots can be leased again."""
        with self._lock:
            sessions = [*self._sessions.values(), *self._draining]
        for sess in sessions:
            with sess.lock:
                overdue = [c for c in sess.copies if c.failure is not None and c.batch.remaining == 0]
            for copy in overdue:
                self._copy_finished(copy)

    def _reap(self) -> None:
        self._sweep()
        now = time.monotonic()
        with self._lock:
            expired = [s.sid for s in self._sessions.values() if s.expires < now and s.pending == 0]
        for sid in expired:
            self.stats["expired"] += 1
            self._close_session(sid, "lease expired")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions = [*self._sessions.values(), *self._draining]
        for sess in sessions:  # copies in flight finish (each bounded by the request deadline)
            with sess.lock:
                copies = list(sess.copies)
            for copy in copies:
                try:
                    copy.batch.wait_sleeping()
                except errors.TentError:
                    pass
                copy.done()


# ---------------------------------------------------------------------------------------- initiator


class _Step:
    """One stage of one chunk in flight: a data leg (BatchHandle) or a control request (its id on
    the session's `_Control`)."""

    __slots__ = ("ctl", "handle", "rid")

    def __init__(self, handle: BatchHandle | None = None, ctl: _Control | None = None, rid: int = 0) -> None:
        self.handle, self.ctl, self.rid = handle, ctl, rid

    def done(self) -> bool:
        """Never blocks, never reads the connection: the pipeline collects replies only in its wait
        (`_Control.collect`), so none lands behind a step it already looked at in this pass."""
        if self.handle is not None:
            return self.handle.poll() != "pending"
        assert self.ctl is not None
        return self.ctl.has(self.rid)

    def wait(self, timeout: float) -> bool:
        if self.handle is not None:
            try:
                return self.handle.wait(timeout)
            except errors.TentError:
                return True  # result() raises it
        assert self.ctl is not None
        return self.ctl.answered(self.rid, timeout)

    def result(self) -> None:
        if self.handle is not None:
            self.handle.wait(0)
            return
        assert self.ctl is not None
        _raise_for(self.ctl.take(self.rid))

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            try:
                self.handle.wait(5.0)
            except errors.TentError:
                pass
        elif self.ctl is not None:
            self.ctl.forget(self.rid)  # its reply, when it comes, is dropped


def _raise_for(rep: Mapping[str, Any]) -> None:
    if rep.get("ok"):
        return
    cls = _ERRORS.get(str(rep.get("code")), errors.TransferError)
    raise cls(f"target staging: {rep.get('error')}")


class _Control:
    """The control requests of one staging session, on one connection driven by the pipeline's own
    thread: a chunk's copy request is sent as its leg lands and its reply collected when the
    pipeline looks, several in flight at once (the target queues the next copy of the session
    before the current one ends, no round trip between two copies), and no thread hand-off on
    either end of a request."""

    def __init__(self, endpoint: str) -> None:
        self.client = ControlClient(endpoint)
        self._replies: dict[int, dict[str, Any]] = {}
        self._waiting: set[int] = set()

    def call(self, msg: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request and its reply (opening and closing the session)."""
        return self.client.call(msg, max(0.01, timeout))

    def send(self, msg: dict[str, Any], timeout: float) -> int:
        rid = self.client.send(msg, max(0.01, timeout))
        self._waiting.add(rid)
        return rid

    def answered(self, rid: int, timeout: float) -> bool:
        """Whether `rid`'s reply is here, waiting up to `timeout` for replies to arrive."""
        if rid in self._replies:
            return True
        end = time.monotonic() + timeout
        while True:
            self.collect(max(0.0, end - time.monotonic()))
            if rid in self._replies:
                return True
            if time.monotonic() >= end:
                return False

    def collect(self, timeout: float, wake_fd: int | None = None) -> None:
        """Keep the replies that arrived, waiting up to `timeout` for the first one or, with
        `wake_fd`, for that descriptor to turn readable (a data leg finished)."""
        for rep in self.client.replies(timeout, wake_fd):
            r = rep.get("id")
            if r in self._waiting:
                self._waiting.discard(r)
                self._replies[r] = rep

    def has(self, rid: int) -> bool:
        """Whether `rid`'s reply was collected already (reads nothing)."""
        return rid in self._replies

    def take(self, rid: int) -> dict[str, Any]:
        return self._replies.pop(rid)

    def forget(self, rid: int) -> None:
        self._waiting.discard(rid)
        self._replies.pop(rid, None)

    def close(self) -> None:
        self.client.close()


def run_target_staged(engine: Any, handle: BatchHandle, req: Request, path: TargetStagedPath, pool: Any) -> None:
    """Drive one target-staged request to completion; finalizes exactly one unit of `handle`'s batch.
    `engine` is the Submitter (submit_leg, segment_name, peers); `pool` the initiator's StagingPool
    (used when the local buffer is device memory)."""
    batch = handle._batch
    try:
        _pipeline(engine, handle, req, path, pool)
    except BaseException as exc:  # every outcome must finalize the unit
        if isinstance(exc, errors.TentError):
            log.debug("target-staged transfer failed: %s", exc)
        else:
            log.exception("target-staged transfer crashed")
        if handle.failure_detail is None:  # the wait raises the status's type with this text (the target's error)
            handle.failure_detail = str(exc)
        batch.fail_slice(status_of(exc))
        return
    batch.complete_slice(req.length)


def _left(handle: BatchHandle) -> float:
    left = handle.deadline - time.monotonic()
    if left <= 0:
        raise errors.DeadlineExceededError("target-staged transfer missed its deadline")
    return left


def _open(ctl: _Control, handle: BatchHandle, msg: dict[str, Any]) -> dict[str, Any]:
    delay = 0.001
    while True:
        rep = ctl.call(msg, min(_left(handle), 10.0))
        if rep.get("ok") or not str(rep.get("error", "")).startswith("busy"):
            _raise_for(rep)
            return rep
        time.sleep(min(delay, max(0.0, handle.deadline - time.monotonic())))  # every slot leased: wait for one
        delay = min(delay * 2, 0.05)


def _pipeline(engine: Any, handle: BatchHandle, req: Request, path: TargetStagedPath, pool: Any) -> None:
    batch = handle._batch
    write = req.op == OpCode.WRITE
    peer, seg = engine.peers.resolve(req.remote, min(_left(handle), engine.config.control_timeout_s))
    ctl = _Control(peer.engine_id)
    sid = 0
    try:
        depth = engine.config.target_staging_depth
        rep = _open(ctl, handle, {"op": "stage_open", "seg": seg, "offset": req.remote_offset, "length": req.length,
                                  "write": write, "depth": depth, "deadline_s": _left(handle), "from": engine.engine_id})
        sid = int(rep["sid"])
        cfg = engine.config
        chunk = pipeline_chunk(req.length, min(int(rep["slot_bytes"]), path.chunk or int(rep["slot_bytes"])),
                               cfg.target_staging_min_chunk_bytes, cfg.target_staging_chunks)
        if path.local_staged:
            chunk = min(chunk, pool.chunk_bytes)
        stage_seg = f"{peer.engine_id}/{rep['segment']}"
        slots = [int(o) for o in rep["slots"]]
        # slot-sized chunks (a large request): half a slot first and last, so the device copy starts
        # (WRITE) and the last leg ends (READ) sooner than with a whole slot's chunk
        ramp = chunk >= int(rep["slot_bytes"])
        _run_chunks(engine, handle, req, path, pool, ctl, sid, stage_seg, slots, chunk, ramp)
    finally:
        if sid:
            try:
                ctl.call({"op": "stage_close", "sid": sid}, 2.0)
            except Exception as exc:  # the target reclaims the session when its lease runs out
                log.debug("stage_close to %s failed: %s", peer.engine_id, exc)
        ctl.close()
    if batch.cancelled:
        raise errors.CancelledError("target-staged transfer cancelled")


def _run_chunks(engine: Any, handle: BatchHandle, req: Request, path: TargetStagedPath, pool: Any, ctl: _Control,
                sid: int, stage_seg: str, slots: list[int], chunk: int, ramp: bool = False) -> None:
    batch = handle._batch
    write = req.op == OpCode.WRITE
    local_base = req.local.offset + req.local_offset  # the local buffer seen as our own segment
    self_seg = engine.segment_name(req.local.segment)
    wire, local_leg = path.wire_leg, path.local_leg
    prio, tag = req.priority, req.tag

    # The pipeline's one sleep: until a control reply arrives or a data leg finishes (each leg is
    # armed to signal this eventfd), whichever is first; no poll of a leg's counter, no sleep on one
    # step while another is already done.
    notifier = _native.Notifier()
    wake = notifier.fileno()

    def leg(r: Request, decision: Decision) -> _Step:
        h = engine.submit_leg(r, decision, _left(handle))
        h.notify(notifier)
        return _Step(h)

    def wire_op(op: OpCode, buf: LocalBuffer, boff: int, slot: int, ln: int) -> _Step:
        return leg(Request(op, buf, boff, stage_seg, slots[slot], ln, prio, tag), wire)

    def local_op(op: OpCode, st: LocalBuffer, off: int, ln: int) -> _Step:
        # READ: local device -> staging; WRITE: staging -> local device
        return leg(Request(op, st, 0, self_seg, local_base + off, ln, prio, tag), local_leg)

    def ctl_op(kind: str, slot: int, off: int, ln: int) -> _Step:
        return _Step(ctl=ctl, rid=ctl.send({"op": kind, "sid": sid, "slot": slot, "off": off, "len": ln}, _left(handle)))

    Stage = Callable[[int, int, int, Any], _Step]
    stages: list[Stage]
    if write and path.local_staged:
        stages = [lambda off, ln, s, st: local_op(OpCode.READ, st, off, ln),
                  lambda off, ln, s, st: wire_op(OpCode.WRITE, st, 0, s, ln),
                  lambda off, ln, s, st: ctl_op("stage_push", s, off, ln)]
    elif write:
        stages = [lambda off, ln, s, st: wire_op(OpCode.WRITE, req.local, req.local_offset + off, s, ln),
                  lambda off, ln, s, st: ctl_op("stage_push", s, off, ln)]
    elif path.local_staged:
        stages = [lambda off, ln, s, st: ctl_op("stage_pull", s, off, ln),
                  lambda off, ln, s, st: wire_op(OpCode.READ, st, 0, s, ln),
                  lambda off, ln, s, st: local_op(OpCode.WRITE, st, off, ln)]
    else:
        stages = [lambda off, ln, s, st: ctl_op("stage_pull", s, off, ln),
                  lambda off, ln, s, st: wire_op(OpCode.READ, req.local, req.local_offset + off, s, ln)]

    chunks = ramped_chunk_plan(req.length, chunk) if ramp else chunk_plan(req.length, chunk)
    free_slots = deque(range(len(slots)))
    inflight: deque[list[Any]] = deque()  # [offset, length, slot, staging buffer, stage index, step]
    nxt = 0
    try:
        while nxt < len(chunks) or inflight:
            if batch.cancelled:
                raise errors.CancelledError("target-staged transfer cancelled")
            left = _left(handle)
            while nxt < len(chunks) and free_slots:
                st = None
                if path.local_staged:
                    st = pool.try_acquire() if inflight else pool.acquire(left)
                    if st is None:
                        if not inflight:
                            raise errors.DeadlineExceededError("no staging buffer became free before the deadline")
                        break
                off, ln = chunks[nxt]
                slot = free_slots.popleft()
                ent = [off, ln, slot, st, 0, None]
                inflight.append(ent)
                nxt += 1
                _mark("submit", off, 0)
                ent[5] = stages[0](off, ln, slot, st)
            moved = False
            for ent in inflight:
                step = ent[5]
                if step is None or not step.done():
                    continue
                step.result()  # raises the stage's error
                _mark("done", ent[0], ent[4])
                ent[4] += 1
                ent[5] = stages[ent[4]](ent[0], ent[1], ent[2], ent[3]) if ent[4] < len(stages) else None
                moved = True
            while inflight and inflight[0][5] is None:
                ent = inflight.popleft()
                free_slots.append(ent[2])
                if ent[3] is not None:
                    pool.release(ent[3])
            # finished chunks behind an unfinished one give their slots back too
            for ent in [e for e in inflight if e[5] is None]:
                inflight.remove(ent)
                free_slots.append(ent[2])
                if ent[3] is not None:
                    pool.release(ent[3])
            if not moved and inflight:
                # capped so that a cancel (which signals nothing here) is seen soon
                _mark("sleep", 0)
                ctl.collect(min(_WAKE_CAP_S, max(0.0, handle.deadline - time.monotonic())), wake)
                notifier.drain()  # before the next pass looks: a leg finishing after it signals again
    finally:
        for ent in inflight:
            if ent[5] is not None:
                ent[5].cancel()
            if ent[3] is not None:
                pool.release(ent[3])


__all__ = ["STAGE_OPS", "STAGE_SEGMENT", "TargetStager", "run_target_staged", "stageable_kinds"]
