"""Executing mapped paths: a WRITE from a registered file sent straight from a read-only mapping.

The planner (`routing.MappedPath`) chooses this where the file transport reads through the page
cache and the wire transport copies its sends in the kernel. Instead of the staged pipeline's
page cache -> staging copy, the file's range is mapped (MAP_SHARED, PROT_READ) and the mapping,
registered as host memory that no peer may touch, is the source of one wire request per mapping
window: per byte one copy on each side of the wire.

Mappings are windows of `mapped_window_bytes`, aligned to it in the file, made on first use and
kept while the file stays registered (`Engine.unregister` forgets them): mapping, registering and
faulting a window's page tables in again for every request would cost what the path saves. Idle
windows beyond `mapped_cache_bytes` are unmapped, least recently used first; a window in use is
unmapped when its last request ends.

Truncation: the file's size is checked (fstat of an fd held per file) before every request, and
a request past its end fails before anything is sent. A file truncated while a request is sent
from it makes the kernel's copy fail (EFAULT on the vanished page: only transports that copy in
the kernel are planned, a user-space copy would SIGBUS the process); the request then fails with
an error naming the truncation, and its windows are dropped.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import errors
from .batch import BatchHandle, drain_quietly, status_of, time_left
from .request import LocalBuffer, Request
from .routing import Decision, MappedPath
from .types import OpCode

log = logging.getLogger(__name__)

MAPPED_SEGMENT = "_tent_mapped"
PAGE = os.sysconf("SC_PAGE_SIZE")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_PROT_READ, _MAP_SHARED = 0x1, 0x01

# Debug hook: when set, called as TRACE(request, windows) once a request's windows are mapped and
# its size checked, before anything is sent (tests truncate the file here to meet EFAULT in the
# kernel's copy deterministically). None in normal use.
TRACE: Any = None

# While a request's legs run, the file's size is looked at this often (seconds): a truncation shows
# up as sends that fail and are retried, not as a final status (see _send).
WATCH_S = 0.05


class MapError(errors.TentError):
    """The file could not be mapped (the filesystem refuses mmap, address space): the request may
    take the staged path instead."""


class MappedHost(Protocol):
    """What the mappings need from the engine: registering host memory no peer may touch."""

    def register_host(self, addr: int, length: int, segment: str) -> LocalBuffer: ...

    def unregister_host(self, buf: LocalBuffer) -> None: ...


@dataclass(eq=False)
class Window:
    """One mapped range of a file: file offset `start`, `length` bytes (page-rounded mapping)."""

    start: int
    length: int
    addr: int
    maplen: int
    host: LocalBuffer  # the mapping, registered as host memory (Permission.NONE)
    users: int = 0
    dead: bool = False  # dropped from the cache: unmapped when its last user is done


@dataclass(eq=False)
class _File:
    path: str
    fd: int
    windows: dict[int, Window] = field(default_factory=dict)  # window index -> window


class FileMappings:
    """The engine's mapping windows of registered files (see the module docstring). Thread-safe."""

    def __init__(self, host: MappedHost, window_bytes: int, cache_bytes: int) -> None:
        if window_bytes <= 0 or window_bytes % PAGE:
            raise ValueError(f"window_bytes must be a positive multiple of {PAGE}")
        self.host = host
        self.window_bytes = window_bytes
        self.cache_bytes = cache_bytes
        self._files: dict[int, _File] = {}  # id(LocalBuffer) of the registered file -> its mappings
        self._lru: OrderedDict[tuple[int, int], Window] = OrderedDict()
        self._mapped = 0  # bytes mapped, windows in use included
        self._lock = threading.Lock()
        self._closed = False

    def file_size(self, buf: LocalBuffer) -> int:
        with self._lock:
            f = self._file(buf)
            return os.fstat(f.fd).st_size

    def acquire(self, buf: LocalBuffer, offset: int, length: int) -> list[tuple[Window, int, int]]:
        """Windows covering file range [offset, offset + length), each with (offset inside the window,
        bytes): the caller sends from them, then `release`s them. InvalidRequestError when the file is
        shorter than the range now; MapError when it cannot be mapped."""
        out: list[tuple[Window, int, int]] = []
        with self._lock:
            if self._closed:
                raise errors.TentError("engine is closed")
            f = self._file(buf)
            size = os.fstat(f.fd).st_size
            end = offset + length
            if end > size:
                raise errors.InvalidRequestError(
                    f"{f.path} is {size} bytes now: cannot send [{offset}, {end}) from it (truncated since it was registered?)")
            try:
                pos = offset
                while pos < end:
                    idx = pos // self.window_bytes
                    start = idx * self.window_bytes
                    stop = min(end, start + self.window_bytes)
                    w = f.windows.get(idx)
                    if w is None or w.length < stop - start:  # none yet, or made when the file was shorter
                        if w is not None:
                            self._drop(id(buf), idx, w)
                        w = self._map(f, id(buf), idx, start, min(self.window_bytes, size - start))
                    self._lru.move_to_end((id(buf), idx))
                    w.users += 1
                    out.append((w, pos - start, stop - pos))
                    pos = stop
            except BaseException:
                self._release(out)
                raise
            self._evict()
        return out

    def release(self, pieces: list[tuple[Window, int, int]]) -> None:
        with self._lock:
            self._release(pieces)
            self._evict()

    def forget(self, buf: LocalBuffer) -> None:
        """The file is unregistered: drop its windows (unmapped now, or when their requests end)."""
        with self._lock:
            f = self._files.pop(id(buf), None)
            if f is None:
                return
            for idx, w in list(f.windows.items()):
                self._drop(id(buf), idx, w)
            os.close(f.fd)

    def drop_file(self, buf: LocalBuffer) -> None:
        """Drop the file's windows but keep it known (e.g. it was truncated under them)."""
        with self._lock:
            f = self._files.get(id(buf))
            if f is not None:
                for idx, w in list(f.windows.items()):
                    self._drop(id(buf), idx, w)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            files = list(self._files)
        for key in files:
            with self._lock:
                f = self._files.pop(key, None)
                if f is None:
                    continue
                for idx, w in list(f.windows.items()):
                    self._drop(key, idx, w)
                os.close(f.fd)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"files": len(self._files), "windows": len(self._lru), "mapped_bytes": self._mapped}

    # ---- under the lock ----------------------------------------------------------------------

    def _file(self, buf: LocalBuffer) -> _File:
        f = self._files.get(id(buf))
        if f is None:
            if not buf.registered:  # forgotten: no fd is opened for it again
                raise errors.NotRegisteredError("the file is no longer registered")
            path = buf.info.path if buf.info is not None else None
            if not path:
                raise errors.InvalidRequestError("a mapped path needs a registered file")
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise MapError(f"cannot open {path} to map it: {exc}") from exc
            f = self._files[id(buf)] = _File(path, fd)
        return f

    def _map(self, f: _File, key: int, idx: int, start: int, length: int) -> Window:
        maplen = -(-length // PAGE) * PAGE
        addr = _libc.mmap(None, maplen, _PROT_READ, _MAP_SHARED, f.fd, start)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise MapError(f"cannot map {f.path} [{start}, {start + length}): {os.strerror(err)}")
        try:
            host = self.host.register_host(addr, length, MAPPED_SEGMENT)
        except BaseException:
            _libc.munmap(addr, maplen)
            raise
        w = Window(start, length, addr, maplen, host)
        f.windows[idx] = w
        self._lru[(key, idx)] = w
        self._mapped += maplen
        log.debug("mapped %s [%d, %d) at %#x", f.path, start, start + length, addr)
        return w

    def _drop(self, key: int, idx: int, w: Window) -> None:
        self._lru.pop((key, idx), None)
        f = self._files.get(key)
        if f is not None and f.windows.get(idx) is w:
            del f.windows[idx]
        if not w.dead:
            w.dead = True
            if w.users == 0:
                self._unmap(w)

    def _unmap(self, w: Window) -> None:
        try:
            self.host.unregister_host(w.host)  # no transport reads it after this returns
        except errors.TentError as exc:  # e.g. the engine closed its segments first
            log.debug("mapped window unregister: %s", exc)
        _libc.munmap(w.addr, w.maplen)
        self._mapped -= w.maplen

    def _release(self, pieces: list[tuple[Window, int, int]]) -> None:
        for w, _, _ in pieces:
            w.users -= 1
            if w.dead and w.users == 0:
                self._unmap(w)

    def _evict(self) -> None:
        for (key, idx), w in list(self._lru.items()):
            if self._mapped <= self.cache_bytes:
                break
            if w.users == 0:
                self._drop(key, idx, w)


class MappedSubmitter(Protocol):
    """What `run_mapped` needs from the engine (the staged pipeline's LegSubmitter, plus mappings)."""

    mappings: FileMappings

    def submit_leg(self, request: Request, decision: Decision, deadline: float) -> BatchHandle: ...


def run_mapped(engine: Any, handle: BatchHandle, req: Request, path: MappedPath, pool: Any,
               run_staged: Callable[..., None]) -> None:
    """Drive one mapped request to completion; finalizes exactly one unit of `handle`'s batch. Falls
    back to the staged path (`path.fallback`, run by `run_staged`: `tent_core.staged.run_staged`)
    when the file cannot be mapped."""
    batch = handle._batch
    try:
        _send(engine, handle, req, path)
    except MapError as exc:
        if path.fallback is None:
            handle.failure_detail = str(exc)
            batch.fail_slice(status_of(exc))
            return
        log.warning("%s; staging it instead", exc)
        run_staged(engine, handle, req, path.fallback, pool)
        return
    except BaseException as exc:  # every outcome must finalize the unit
        if isinstance(exc, errors.TentError):
            log.debug("mapped transfer failed: %s", exc)
            handle.failure_detail = str(exc)
        else:
            log.exception("mapped transfer crashed")
        batch.fail_slice(status_of(exc))
        return
    batch.complete_slice(req.length)


def _send(engine: MappedSubmitter, handle: BatchHandle, req: Request, path: MappedPath) -> None:
    if req.op != OpCode.WRITE:
        raise errors.InvalidRequestError("a mapped path only sends (WRITE)")
    maps = engine.mappings
    pieces = maps.acquire(req.local, req.local_offset, req.length)
    legs: list[BatchHandle] = []
    try:
        if TRACE is not None:
            TRACE(req, pieces)
        if handle._batch.cancelled:
            raise errors.CancelledError("mapped transfer cancelled")
        done = 0
        for w, off, n in pieces:
            r = Request(OpCode.WRITE, w.host, off, req.remote, req.remote_offset + done, n, req.priority, req.tag)
            legs.append(engine.submit_leg(r, path.wire_leg, time_left(handle, "mapped transfer")))
            done += n
        end = req.local_offset + req.length
        try:
            for h in legs:
                # a send that met a truncated page (EFAULT) fails as a broken connection, which the
                # engine retries until the deadline: look at the file's size while waiting instead
                while not h.wait(WATCH_S):
                    if handle._batch.cancelled:
                        raise errors.CancelledError("mapped transfer cancelled")
                    _check_size(maps, req, end, None)
            if handle._batch.cancelled:  # as the staged pipeline: a cancelled request fails, sent or not
                raise errors.CancelledError("mapped transfer cancelled")
        except errors.TentError as exc:
            for h in legs:
                h.cancel()
            _check_size(maps, req, end, exc)
            raise
    finally:
        for h in legs:
            drain_quietly(h)
        maps.release(pieces)


def _check_size(maps: FileMappings, req: Request, end: int, exc: BaseException | None) -> None:
    """Raise the truncation error if the file is shorter than the request now."""
    try:
        size = maps.file_size(req.local)
    except (OSError, errors.TentError):
        return
    if size < end:  # the kernel's copy met (or will meet) a page truncated away: EFAULT
        maps.drop_file(req.local)
        raise errors.TransferError(
            f"{req.local.info.path if req.local.info else 'the file'} was truncated to {size} bytes while "
            f"[{req.local_offset}, {end}) was sent from its mapping" + (f": {exc}" if exc else "")) from exc




__all__ = ["MAPPED_SEGMENT", "TRACE", "FileMappings", "MapError", "Window", "run_mapped"]
