"""Executing synthesized paths: chunks through pooled host staging buffers, stages overlapped.

Chunk n+1's first stage runs while chunk n's second stage does; the application sees
one unit of its batch complete when every chunk has passed both stages.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Any, Protocol

from . import errors
from .batch import BatchHandle, drain_quietly, status_of, time_left
from .path_planner import chunk_plan, pipeline_chunk
from .request import LocalBuffer, Request
from .routing import Decision, MappedPath, StagedPath
from .types import OpCode, Permission

log = logging.getLogger(__name__)

STAGING_SEGMENT = "_tent_staging"

# Debug hook: when set, called as TRACE(event, chunk index, chunk bytes) at each leg's submit and
# observed end ("stage1_submit"/"stage1_done": source -> staging; "stage2_submit"/"stage2_done":
# staging -> destination) and once per request ("begin"/"end",
# index -1). For measuring the pipeline (tent_bench.path_trace); None in normal use.
TRACE: Any = None


class LegSubmitter(Protocol):
    """What the pipeline needs from the engine: submitting one leg with a fixed Decision, naming
    this engine's own segments, and allocating staging memory."""

    def submit_leg(self, request: Request, decision: Decision, deadline: float) -> BatchHandle: ...

    def segment_name(self, segment: str) -> str: ...

    def allocate(self, size: int, segment: str, perm: Permission) -> LocalBuffer: ...


class StagingPool:
    """A bounded pool of pre-faulted host buffers, registered lazily, local-only (no remote access).

    Every buffer is `chunk_bytes` long, the largest chunk; a request is cut into chunks sized for
    it (`chunk_for`), so a small one keeps several chunks in flight and a large one pays fewer
    per-chunk submits. At most `count` buffers are ever made: `count * chunk_bytes` bounds the
    staging memory an engine registers."""

    def __init__(self, engine: LegSubmitter, chunk_bytes: int, count: int,
                 min_chunk: int | None = None, chunks: int = 8, first_depth: int | None = None) -> None:  # fmt: skip
        if first_depth is not None and first_depth < 1:
            raise ValueError("first_depth must be >= 1")
        self.engine = engine
        self.chunk_bytes = chunk_bytes
        self.count = count
        # (smallest chunk, chunks per request) for pipeline_chunk; by default every chunk is a buffer's
        self.min_chunk = chunk_bytes if min_chunk is None else min_chunk
        self.chunks = chunks
        # first-stage legs one request keeps in flight (config staging_first_depth; None: as many as
        # there are buffers)
        self.first_depth = count if first_depth is None else first_depth
        self._free: queue.Queue[LocalBuffer] = queue.Queue()
        self._made = 0
        self._lock = threading.Lock()

    def acquire(self, timeout: float) -> LocalBuffer | None:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        with self._lock:
            if self._made < self.count:
                self._made += 1
                return self.engine.allocate(self.chunk_bytes, segment=STAGING_SEGMENT, perm=Permission.NONE)
        try:
            return self._free.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None

    def chunk_for(self, length: int) -> int:
        """The chunk a `length`-byte request moves in (never more than a buffer holds)."""
        return pipeline_chunk(length, self.chunk_bytes, self.min_chunk, self.chunks)

    def try_acquire(self) -> LocalBuffer | None:
        return self.acquire(0.0)

    def exhausted(self) -> bool:
        """Every buffer the pool may make is made and handed out."""
        return self._made >= self.count and self._free.empty()

    def release(self, buf: LocalBuffer) -> None:
        self._free.put(buf)


def run_staged(engine: LegSubmitter, handle: BatchHandle, req: Request, path: StagedPath, pool: StagingPool) -> None:
    """Drive one staged request to completion; finalizes exactly one unit of `handle`'s batch.

    Each leg is routed by the path's own Decisions (`path.local_leg`, `path.remote_leg`): the
    transports the planner chose, under the original request's rule, with its priority and tag.
    A TargetStagedPath runs through the target's staging instead (`tent_core.target_staging`), a
    MappedPath from a mapping of the file (`tent_core.mapped`)."""
    if isinstance(path, MappedPath):
        from .mapped import run_mapped

        run_mapped(engine, handle, req, path, pool, run_staged)
        return
    if not isinstance(path, StagedPath):
        from .target_staging import run_target_staged

        run_target_staged(engine, handle, req, path, pool)
        return
    batch = handle._batch
    try:
        _pipeline(engine, handle, req, path, pool)
    except BaseException as exc:  # every outcome must finalize the unit
        if isinstance(exc, errors.TentError):
            log.debug("staged transfer failed: %s", exc)
        else:
            log.exception("staged transfer crashed")
        batch.fail_slice(status_of(exc))
        return
    batch.complete_slice(req.length)


def _pipeline(engine: LegSubmitter, handle: BatchHandle, req: Request, path: StagedPath, pool: StagingPool) -> None:
    batch = handle._batch
    self_seg = engine.segment_name(req.local.segment)
    local_base = req.local.offset + req.local_offset  # the local buffer seen as our own segment
    chunks = chunk_plan(req.length, pool.chunk_for(req.length))
    write = req.op == OpCode.WRITE

    local_leg, remote_leg = path.local_leg, path.remote_leg

    def stage1(off: int, ln: int, st: LocalBuffer) -> Any:
        if write:  # local -> staging
            r = Request(OpCode.READ, st, 0, self_seg, local_base + off, ln, req.priority, req.tag)
            return engine.submit_leg(r, local_leg, time_left(handle, "staged transfer"))
        r = Request(OpCode.READ, st, 0, req.remote, req.remote_offset + off, ln, req.priority, req.tag)  # remote -> staging
        return engine.submit_leg(r, remote_leg, time_left(handle, "staged transfer"))

    def stage2(off: int, ln: int, st: LocalBuffer) -> Any:
        if write:  # staging -> remote
            r = Request(OpCode.WRITE, st, 0, req.remote, req.remote_offset + off, ln, req.priority, req.tag)
            return engine.submit_leg(r, remote_leg, time_left(handle, "staged transfer"))
        r = Request(OpCode.WRITE, st, 0, self_seg, local_base + off, ln, req.priority, req.tag)  # staging -> local
        return engine.submit_leg(r, local_leg, time_left(handle, "staged transfer"))

    trace = TRACE
    first: deque[tuple[int, int, LocalBuffer, Any]] = deque()
    second: deque[tuple[int, int, LocalBuffer, Any]] = deque()
    nxt = 0

    def feed() -> None:
        """Submit first stages while staging buffers are free, at most pool.first_depth in flight:
        chunks in flight in one stage share it, so more of them only delay the first one's end (and
        with it the second stage's start) without moving the stage faster."""
        nonlocal nxt
        while nxt < len(chunks) and len(first) < pool.first_depth:
            st = pool.try_acquire() if (first or second) else pool.acquire(time_left(handle, "staged transfer"))
            if st is None:
                if not (first or second):
                    raise errors.DeadlineExceededError("no staging buffer became free before the deadline")
                return
            off, ln = chunks[nxt]
            try:
                if trace is not None:
                    trace("stage1_submit", nxt, ln)
                first.append((nxt, ln, st, stage1(off, ln, st)))
            except BaseException:
                pool.release(st)
                raise
            nxt += 1

    if trace is not None:
        trace("begin", -1, req.length)
    try:
        while nxt < len(chunks) or first or second:
            if batch.cancelled:
                raise errors.CancelledError("staged transfer cancelled")
            feed()
            if first:
                i, ln, st, h = first[0]
                h.wait()
                first.popleft()
                if trace is not None:
                    trace("stage1_done", i, ln)
                try:
                    feed()  # the next chunk's first stage before this one's second: neither stage idles
                    if trace is not None:
                        trace("stage2_submit", i, ln)
                    second.append((i, ln, st, stage2(chunks[i][0], ln, st)))
                except BaseException:
                    pool.release(st)
                    raise
            # retire finished second stages; block on the oldest only when nothing else can move
            while second and (
                second[0][3].poll() != "pending" or (not first and (nxt >= len(chunks) or pool.exhausted()))
            ):
                i, ln, st, h = second.popleft()
                try:
                    h.wait()
                finally:
                    pool.release(st)
                if trace is not None:
                    trace("stage2_done", i, ln)
        if trace is not None:
            trace("end", -1, req.length)
    finally:
        for _, _, st, h in first:
            h.cancel()
            drain_quietly(h)
            pool.release(st)
        for _, _, st, h in second:
            h.cancel()
            drain_quietly(h)
            pool.release(st)


