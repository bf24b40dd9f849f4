"""Local segments: the memory this engine registers and exports to its peers.

`LocalSegments` owns the engine's named segments and their buffers: registering user memory,
engine-allocated (memfd) memory and files, exporting each buffer to every transport that can serve
its memory kind (all or nothing), releasing it on unregister, and the segment table that
`describe` hands to peers (and, with a cluster directory, `on_change` re-publishes after every
register/unregister). It knows transports only through the `Transport` interface.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import errors
from .memory import MemfdBuffer, describe
from .request import LocalBuffer
from .transport import Transport
from .types import BufferInfo, CapabilityProfile, MemoryKind, Permission

log = logging.getLogger(__name__)

# Registered files get synthetic, non-overlapping "addresses" far above user space.
FILE_BASE = 1 << 56
FILE_STRIDE = 1 << 44


_EPOCHS = itertools.count(1)


@dataclass
class LocalSegment:
    name: str
    buffers: list[LocalBuffer] = field(default_factory=list)  # in offset order (registration order)
    next_offset: int = 0
    # moves on whenever a buffer leaves the segment (and differs for every incarnation of a
    # segment name): a peer that read the segment at this epoch only misses buffers registered
    # since, i.e. those at or past the end it saw (see `LocalSegments.describe_segment`)
    epoch: int = field(default_factory=lambda: next(_EPOCHS))


class LocalSegments:
    """The engine's registered memory, by segment name."""

    def __init__(
        self, engine_id: str, transports: Mapping[str, Transport], profiles: Mapping[str, CapabilityProfile]
    ) -> None:
        self.engine_id = engine_id
        self._transports = transports
        self._profiles = profiles
        self._lock = threading.RLock()
        self._segments: dict[str, LocalSegment] = {}
        self._file_bases = 0
        self.closed = False
        # called with a segment's name after a buffer joined or left it (the directory publishes it)
        self.on_change: Callable[[str], None] | None = None

    def register(self, obj: Any, segment: str, perm: Permission) -> LocalBuffer:
        region = describe(obj)
        if region.readonly and Permission(perm) & Permission.WRITE:
            raise errors.InvalidRequestError(
                f"{type(obj).__name__} is read-only (its producer says so): register it with perm=READ_ONLY"
            )
        return self._add(segment, region.addr, region.length, region.kind, region.device, perm, region.array, obj, None)

    def allocate(self, size: int, segment: str, perm: Permission) -> LocalBuffer:
        mem = MemfdBuffer(size, name=f"tent-{segment}")
        try:
            return self._add(segment, mem.addr, size, MemoryKind.HOST, -1, perm, mem.array, None, mem)
        except BaseException:
            mem.close()
            raise

    def register_file(self, path: str | os.PathLike[str], segment: str, perm: Permission, size: int | None) -> LocalBuffer:
        full = os.path.abspath(os.fspath(path))
        if size is not None:
            if size < 0:
                raise errors.InvalidRequestError(f"file size must be >= 0, got {size}")
            fd = os.open(full, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size < size:
                    os.ftruncate(fd, size)
            finally:
                os.close(fd)
        try:
            length = os.stat(full).st_size
        except FileNotFoundError as exc:
            raise errors.InvalidRequestError(f"cannot register {full}: no such file (pass size= to create it)") from exc
        if length >= FILE_STRIDE:
            raise errors.InvalidRequestError(f"{full}: files up to {FILE_STRIDE} bytes can be registered")
        with self._lock:
            self._file_bases += 1
            base = FILE_BASE + self._file_bases * FILE_STRIDE
        return self._add(segment, base, length, MemoryKind.FILE, -1, perm, None, None, None, path=full)

    def _add(
        self,
        segment: str,
        addr: int,
        length: int,
        kind: MemoryKind,
        device: int,
        perm: Permission,
        array: np.ndarray | None,
        keepalive: Any,
        owned: MemfdBuffer | None,
        path: str | None = None,
    ) -> LocalBuffer:
        if not isinstance(segment, str) or not segment or "/" in segment:
            raise errors.InvalidRequestError(f"segment name must be a non-empty string without '/', got {segment!r}")
        perm = Permission(perm)
        with self._lock:
            if self.closed:
                raise errors.TentError("engine is closed")
            seg = self._segments.setdefault(segment, LocalSegment(segment))
            offset = seg.next_offset
            seg.next_offset = offset + ((length + 63) & ~63)
            info = BufferInfo(
                segment=segment, offset=offset, addr=addr, length=length, kind=kind, device=device, perm=perm,
                memfd=owned.fd if owned else -1, path=path,
            )
            buf = LocalBuffer(segment, offset, addr, length, kind, perm, device, array, info, keepalive, owned, self.engine_id)
            exported: dict[str, Any] = {}
            called: list[str] = []
            try:
                for name, t in self._transports.items():
                    if not any(kind in pair for pair in self._profiles[name].kind_pairs):
                        continue  # e.g. a file's synthetic address must never reach a memory transport
                    d = t.export_buffer(info)
                    called.append(name)
                    if d is not None:
                        exported[name] = d
            except BaseException:
                for name in called:
                    self._transports[name].release_buffer(info)
                raise
            info.extra["desc"] = exported
            info.extra["exported"] = called
            seg.buffers.append(buf)
        if self.on_change is not None:
            try:
                self.on_change(segment)
            except BaseException:
                self.unregister(buf)  # a buffer peers cannot find is not registered: the caller gets no handle
                raise
        return buf

    def unregister(self, buf: LocalBuffer) -> None:
        """After return, no peer can touch the buffer through this engine's transports."""
        with self._lock:
            seg = self._segments.get(buf.segment)
            if seg is None or buf not in seg.buffers:
                raise errors.NotRegisteredError(f"buffer at {buf.addr:#x} is not registered with {self.engine_id}")
            seg.buffers.remove(buf)
            seg.epoch = next(_EPOCHS)
            if not seg.buffers:
                del self._segments[buf.segment]
            buf.registered = False
        for name in buf.info.extra.get("exported", []) if buf.info else []:
            try:
                self._transports[name].release_buffer(buf.info)  # type: ignore[arg-type]
            except Exception:
                log.exception("transport %s failed to release a buffer", name)
        _free(buf)
        if self.on_change is not None:
            try:
                self.on_change(buf.segment)
            except errors.TentError as exc:  # the stale entry is harmless: this engine refuses the range now
                log.warning("%s", exc)

    def table(self) -> dict[str, list[dict[str, Any]]]:
        """The segment table peers read through `describe`."""
        with self._lock:
            return {name: [_entry(b) for b in seg.buffers] for name, seg in self._segments.items()}

    def snapshot(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
        """The segment table and each segment's epoch, read together."""
        with self._lock:
            return self.table(), {name: seg.epoch for name, seg in self._segments.items()}

    def describe_segment(self, name: str, epoch: int = 0, from_offset: int = 0) -> dict[str, Any] | None:
        """One segment for a peer that may know part of it: when it read it at `epoch` (nothing
        left the segment since), only the buffers at or past `from_offset` (registered since);
        otherwise all of them. None when there is no such segment. O(new buffers), so the first
        request after a registration costs the same however many buffers the segment holds."""
        with self._lock:
            seg = self._segments.get(name)
            if seg is None:
                return None
            since = epoch == seg.epoch
            bufs = seg.buffers
            start = bisect.bisect_left(bufs, from_offset, key=lambda b: b.offset) if since else 0
            return {"epoch": seg.epoch, "incremental": since, "buffers": [_entry(b) for b in bufs[start:]]}

    def close(self) -> None:
        """Forget every buffer (the transports are closed already: nothing to release there)."""
        with self._lock:
            self.closed = True
            segs, self._segments = list(self._segments.values()), {}
        for seg in segs:
            for b in seg.buffers:
                b.registered = False
                _free(b)


def _entry(b: LocalBuffer) -> dict[str, Any]:
    return {
        "offset": b.offset,
        "addr": b.addr,
        "length": b.length,
        "perm": int(b.perm),
        "kind": b.kind.value,
        "desc": b.info.extra.get("desc", {}) if b.info else {},
    }


def _free(buf: LocalBuffer) -> None:
    if buf._owned is not None:
        buf.array = None
        buf._owned.close()


__all__ = ["FILE_BASE", "FILE_STRIDE", "LocalSegment", "LocalSegments"]
