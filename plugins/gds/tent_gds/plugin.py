"""The ``gds`` transport: local host memory <-> registered files on this host.

A file registered with the engine (``Engine.register_file``) is a buffer of
:attr:`MemoryKind.FILE` whose ``addr`` is a synthetic virtual base unique per file
and whose ``length`` is the file size. A slice touching it has
``file_offset = remote_addr - base``. The peer owning the file may be this engine (its
self-peer) or another engine on the same host: :meth:`GdsTransport.export_buffer` advertises
``{"path", "perm"}`` and :meth:`GdsTransport.connect` opens every advertised file
(``O_RDONLY`` unless the buffer is writable, plus an ``O_DIRECT`` fd when configured) and
registers ``(base, length, fds, writable)`` with the compiled executor. op READ moves
file -> memory, WRITE memory -> file.

The executor (``csrc/gds_executor.c``) runs io_uring through raw syscalls with several
I/Os in flight per worker, or pread/pwrite loops where io_uring is not allowed. A request of one
piece up to ``inline_bytes`` is first tried by the submitting thread without blocking
(preadv2/pwritev2 with RWF_NOWAIT, config ``nowait``): a READ out of the page cache completes
inside submit, with no hand-off to a worker and no wake-up; whatever would block goes to the
workers (and the batch's waiter). That thread holds the GIL while it copies (like the shm
transport's inline copies): Python threads submitting at once take turns for those copies.
Where the filesystem refuses non-blocking buffered writes (ext4), a WRITE up to
``inline_write_bytes`` is written by the submitting thread with a plain pwrite instead, the GIL
let go around it (it may sleep on the file's lock or dirty-page throttling).

GPU memory <-> file goes through cuFile (GPUDirect Storage, the library KvikIO wraps) when
libcufile, a CUDA driver and a device are present: the transport then also serves
(CUDA, FILE), registers the engine's CUDA buffers with cuFile and the executor runs
cuFileRead/cuFileWrite for slices that land in them. Nothing CUDA is linked; the executor
dlopen()s the libraries at start. Without them, :attr:`GdsTransport.cufile_reason` says why
and the core synthesizes CUDA <-> file through host staging buffers instead.

Config keys, with their defaults and meaning: :attr:`GdsTransport.config_keys`.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tent_core.errors import InvalidRequestError, PeerUnreachableError
from tent_core.executor import EXECUTOR_ABI_VERSION, Executor, PluginLibrary
from tent_core.plugin_spec import hookimpl
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

ENGINES = ("auto", "io_uring", "pread")
CUFILE_MODES = ("auto", "on", "off")
_ENGINE_NAMES = {0: "pread", 1: "io_uring"}
TMPFS_MAGIC = 0x01021994
DIRECT_ALIGN = 4096


# --------------------------------------------------------------------------- library
u64, i32, i64, vp = ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_void_p


class _Lib(PluginLibrary):
    """The compiled executor library plus ctypes prototypes of its private functions."""

    PREFIX = "tent_gds_"
    PROTOTYPES: ClassVar[dict[str, tuple[Any, list[Any]]]] = {
        "peer_add": (u64, [vp]),
        "peer_remove": (i32, [vp, u64]),
        "file_add": (i32, [vp, u64, u64, u64, i32, i32, i32]),
        "file_remove": (i32, [vp, u64, u64]),
        "engine": (i32, [vp]),
        "uring_supported": (i32, [ctypes.c_char_p, u64]),
        "fs_magic": (i64, [ctypes.c_char_p]),
        "config": (None, [vp, ctypes.POINTER(u64)]),
        "stats": (None, [vp, ctypes.POINTER(u64)]),
        "cufile_state": (i32, [vp, ctypes.c_char_p, u64]),
        "gpu_add": (i32, [vp, u64, u64, ctypes.c_char_p, u64]),
        "gpu_remove": (i32, [vp, u64]),
        "order_add": (i32, [vp, u64, u64, u64, u64]),
        "order_remove": (i32, [vp, u64]),
        "ordered": (u64, [vp]),
    }

    peer_add: Any
    peer_remove: Any
    file_add: Any
    file_remove: Any
    engine: Any
    uring_supported: Any
    fs_magic: Any
    config: Any
    stats: Any
    cufile_state: Any
    gpu_add: Any
    gpu_remove: Any
    order_add: Any
    order_remove: Any
    ordered: Any

    def uring_reason(self) -> str | None:
        """None if io_uring (with IORING_OP_READ/WRITE) works in this process, else why not."""
        why = ctypes.create_string_buffer(256)
        ok = self.uring_supported(why, len(why))
        return None if ok else why.value.decode(errors="replace")


@functools.cache
def get_lib() -> _Lib:
    return _Lib(Path(__file__).parent)


def find_cufile_library(configured: str | None = None) -> str | None:
    """Where libcufile is: the configured path, ``TENT_CUFILE``, the nvidia-cufile-cu* wheel's
    copy (not on the loader path), else None (the executor then tries the loader path)."""
    for candidate in (configured, os.environ.get("TENT_CUFILE")):
        if candidate:
            return candidate
    try:  # nvidia-cufile-cu12 puts it in nvidia/cufile/lib, the CUDA 13 wheels under nvidia/cu13/lib
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        for lib in sorted(Path(root).glob("*/lib/libcufile.so*")):
            if "rdma" not in lib.name:
                return str(lib)
    return None


def is_tmpfs(path: str) -> bool:
    """True if `path` (or its directory) lives on tmpfs, where O_DIRECT is not real direct I/O."""
    lib = get_lib()
    probe = path if os.path.exists(path) else os.path.dirname(os.path.abspath(path)) or "."
    return int(lib.fs_magic(os.fsencode(probe))) == TMPFS_MAGIC


def open_direct(path: str, writable: bool) -> int:
    """An O_DIRECT fd for `path`, or -1 where the filesystem refuses it (logged)."""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC | getattr(os, "O_DIRECT", 0)
    if not getattr(os, "O_DIRECT", 0):
        return -1
    try:
        return os.open(path, flags)
    except OSError as exc:
        log.info("gds: %s: O_DIRECT open refused (%s); buffered I/O only", path, exc.strerror)
        return -1


# --------------------------------------------------------------------------- links
@dataclass
class _File:
    base: int
    length: int
    path: str
    writable: bool
    direct: bool


@dataclass
class _Link:
    engine_id: str
    handle: int
    files: dict[int, _File] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _remote_files(name: str, remote_buffers: list[dict[str, Any]]) -> dict[int, tuple[str, int, bool]]:
    """base -> (path, length, writable) for the peer's FILE buffers that advertise a path."""
    out: dict[int, tuple[str, int, bool]] = {}
    for b in remote_buffers:
        if str(b.get("kind", "")) not in (MemoryKind.FILE.value, str(MemoryKind.FILE)):
            continue
        desc = b.get("desc") or {}
        mine = desc.get(name) if isinstance(desc, dict) else None
        if not isinstance(mine, dict) or not mine.get("path"):
            continue
        perm = Permission(int(b.get("perm", mine.get("perm", int(Permission.READ_WRITE)))))
        perm &= Permission(int(mine.get("perm", int(Permission.READ_WRITE))))
        out[int(b["addr"])] = (str(mine["path"]), int(b["length"]), bool(perm & Permission.WRITE))
    return out


class GdsTransport(Transport):
    name = "gds"
    version = __version__
    config_keys = {
        "engine": "auto",  # "auto" (io_uring when usable, else pread), "io_uring", "pread"
        "threads": 2,  # executor worker threads
        "queue_depth": 16,  # I/Os in flight per io_uring worker
        "chunk": 1 << 20,  # slices are split into pieces of this many bytes (multiple of 4096)
        # requests up to this long may be run by the thread that waits for them (0: workers only)
        "inline_bytes": 1 << 20,
        # the submitting thread first tries its (first) slice up to inline_bytes itself, without
        # blocking (preadv2/pwritev2 RWF_NOWAIT: page-cache hits); what would block goes to the workers
        "nowait": True,
        # WRITEs up to this long to a file whose filesystem refuses non-blocking buffered writes (ext4)
        # are written by the submitting thread with a plain pwrite, without the GIL (0: the workers do)
        "inline_write_bytes": 1 << 20,
        "direct": False,  # an O_DIRECT fd per file, used for 4096-aligned pieces
        # buffered WRITEs longer than chunk are cut into pieces for several workers like READs
        # (default: one worker writes each such slice in order; the kernel serializes writers per file)
        "split_writes": False,
        # buffered WRITEs longer than chunk are cut into pieces for all workers, each of which reads a
        # piece's source just before its pwrite, while another copies under the file's lock: the copy
        # then reads from the cache (off: one worker writes each such slice whole, unless split_writes)
        "write_warm": True,
        "cufile": "auto",  # "auto" (cuFile when it works), "on" (start fails without it), "off"
        "cufile_lib": None,  # path of libcufile (default: TENT_CUFILE, the nvidia-cufile wheel, the loader path)
        "cuda_lib": None,  # path of the CUDA driver library (default: libcuda.so.1 on the loader path)
    }

    def __init__(self) -> None:
        self._lib: _Lib | None = None
        self._executor: Executor | None = None
        self._host_id = ""
        self._direct = False
        self._cufile_active = False
        self._cufile_reason = "transport not started"
        self._gpu_bufs: set[int] = set()
        self._links: dict[str, _Link] = {}
        self._by_handle: dict[int, _Link] = {}
        self._lock = threading.RLock()

    # -- discovery
    def probe(self) -> Availability:
        if not sys.platform.startswith("linux"):
            return Availability.unavailable("gds transport needs Linux")
        try:
            lib = get_lib()
        except Exception as exc:  # not built, wrong ABI...
            return Availability.unavailable(f"gds executor library unusable: {exc}")
        why = lib.uring_reason()
        io = "io engine: io_uring" if why is None else f"io engine: pread (io_uring unusable: {why})"
        cufile = find_cufile_library()
        gpu = f"cuFile: {cufile} (used at start if a CUDA device is present)" if cufile else "cuFile: not installed"
        return Availability(True, f"{io}; {gpu}")

    def capabilities(self) -> CapabilityProfile:
        pairs = {(MemoryKind.HOST, MemoryKind.FILE)}
        if self._cufile_active:
            pairs.add((MemoryKind.CUDA, MemoryKind.FILE))
        # buffered reads only: with an O_DIRECT fd (direct=1, or cuFile's) a read goes around the page
        # cache, and a mapping of the file would fault it in instead (and pollute the cache the
        # application asked to avoid)
        return CapabilityProfile(kind_pairs=frozenset(pairs), same_host=True, cross_host=False, rank=20,
                                 page_cache_files=not (self._direct or self._cufile_active))

    @property
    def cufile_active(self) -> bool:
        """True when GPU memory <-> file runs through cuFile in this transport."""
        return self._cufile_active

    @property
    def cufile_reason(self) -> str:
        """Why cuFile is not active ("" when it is)."""
        return self._cufile_reason

    # -- lifecycle
    def start(self, ctx: TransportContext) -> None:
        cfg = self.resolve_config(ctx.config)
        engine = str(cfg["engine"]).lower()
        if engine not in ENGINES:
            raise InvalidRequestError(f"gds: config engine must be one of {ENGINES}, got {engine!r}")
        cufile = str(cfg["cufile"]).lower()
        if cufile not in CUFILE_MODES:
            raise InvalidRequestError(f"gds: config cufile must be one of {CUFILE_MODES}, got {cufile!r}")
        self._direct = bool(cfg["direct"])
        self.inline_bytes = max(0, int(cfg["inline_bytes"]))
        self._host_id = ctx.host_id
        self._lib = get_lib()
        ex_cfg = {
            "engine": engine,
            "threads": int(cfg["threads"]),
            "queue_depth": int(cfg["queue_depth"]),
            "chunk": int(cfg["chunk"]),
            "direct": int(self._direct),
            "nowait": int(bool(cfg["nowait"])),
            "inline_write_bytes": max(0, int(cfg["inline_write_bytes"])),
            "split_writes": int(bool(cfg["split_writes"])),
            "write_warm": int(bool(cfg["write_warm"])),
            "cufile": cufile,
            "cufile_lib": find_cufile_library(cfg["cufile_lib"]) or "",
            "cuda_lib": str(cfg["cuda_lib"] or ""),
        }
        self._executor = self._lib.library.create(ex_cfg)
        why = ctypes.create_string_buffer(256)
        self._cufile_active = bool(self._lib.cufile_state(self._executor.handle, why, len(why)))
        self._cufile_reason = "" if self._cufile_active else why.value.decode(errors="replace")
        if self._cufile_active:
            log.info("gds: cuFile active: GPU memory <-> file runs through GPUDirect Storage")
        else:
            log.info("gds: cuFile unavailable (%s): GPU memory <-> file is staged through host memory", self._cufile_reason)
        c = self.executor_config()
        log.info(
            "gds transport started: engine=%s threads=%d queue_depth=%d chunk=%d direct=%s",
            self.io_engine,
            c["threads"],
            c["queue_depth"],
            c["chunk"],
            bool(c["direct"]),
        )

    @property
    def executor(self) -> Executor:
        if self._executor is None:
            raise RuntimeError("gds transport not started")
        return self._executor

    @property
    def io_engine(self) -> str:
        """ "io_uring" or "pread": what the running executor uses."""
        assert self._lib is not None
        return _ENGINE_NAMES[int(self._lib.engine(self.executor.handle))]

    def executor_config(self) -> dict[str, int]:
        assert self._lib is not None
        out = (ctypes.c_uint64 * 4)()
        self._lib.config(self.executor.handle, out)
        return {"threads": out[0], "queue_depth": out[1], "chunk": out[2], "direct": out[3]}

    def stats(self) -> dict[str, int]:
        """Executor counters: bytes moved direct / buffered, I/O requests, slices ok / failed; the
        submitting thread's non-blocking I/Os and the slices it finished (``nowait_ios`` / ``nowait_slices``);
        buffered WRITE slices one worker wrote whole (``whole_writes``); WRITE slices the submitting thread
        wrote with a blocking pwrite (``inline_writes``, ``inline_write_bytes``); WRITE pieces whose source
        a worker read just before writing it (``warm_pieces``, ``write_warm``)."""
        assert self._lib is not None
        out = (ctypes.c_uint64 * 16)()
        self._lib.stats(self.executor.handle, out)
        keys = (
            "direct_bytes",
            "buffered_bytes",
            "uring_ios",
            "sync_ios",
            "slices_ok",
            "slices_failed",
            "gpu_bytes",
            "gpu_ios",
            "bounce_bytes",
            "bounce_ios",
            "waiter_pieces",
            "nowait_ios",
            "nowait_slices",
            "whole_writes",
            "inline_writes",
            "warm_pieces",
        )
        st = {k: int(out[i]) for i, k in enumerate(keys)}
        st["ordered_chunks"] = int(self._lib.ordered(self.executor.handle))
        return st

    def local_descriptor(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host_id": self._host_id, "version": __version__}

    def rail_names(self) -> list[str]:
        return [f"gds-{self.io_engine}"] if self._executor is not None else []

    # -- buffers
    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        if buf.kind == MemoryKind.CUDA:
            self._register_gpu(buf)
            return None  # local only: peers never reach our GPU memory through gds
        if buf.kind != MemoryKind.FILE:
            return None
        if not buf.path:
            raise InvalidRequestError("gds: a FILE buffer needs a path")
        return {"path": os.path.abspath(buf.path), "perm": int(buf.perm)}

    def _register_gpu(self, buf: BufferInfo) -> None:
        if self._lib is None or self._executor is None or not self._cufile_active or buf.length == 0:
            return
        err = ctypes.create_string_buffer(256)
        rc = int(self._lib.gpu_add(self._executor.handle, buf.addr, buf.length, err, len(err)))
        if rc != 0:
            raise InvalidRequestError(f"gds: cannot register CUDA buffer with cuFile: {err.value.decode(errors='replace')}")
        with self._lock:
            self._gpu_bufs.add(buf.addr)

    def release_buffer(self, buf: BufferInfo) -> None:
        """CUDA buffers leave cuFile; files need nothing: peers opened the path themselves."""
        if buf.kind != MemoryKind.CUDA or self._lib is None or self._executor is None:
            return
        with self._lock:
            if buf.addr not in self._gpu_bufs:
                return
            self._gpu_bufs.discard(buf.addr)
        self._lib.gpu_remove(self._executor.handle, buf.addr)

    # -- peers
    def can_reach(self, peer: PeerInfo) -> str | None:
        if self.name not in peer.transports:
            return f"peer does not offer {self.name}"
        if not self._host_id or peer.host_id != self._host_id:
            return f"peer {peer.engine_id} is on another host ({peer.host_id} != {self._host_id})"
        return None

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        if self._executor is None or self._lib is None:
            raise RuntimeError("gds transport not started")
        reason = self.can_reach(peer)
        if reason:
            raise PeerUnreachableError(f"gds: cannot reach {peer.engine_id}: {reason}")
        with self._lock:
            link = self._links.get(peer.engine_id)
            if link is None:
                h = int(self._lib.peer_add(self._executor.handle))
                if not h:
                    raise PeerUnreachableError(f"gds: executor could not add peer {peer.engine_id}")
                link = _Link(peer.engine_id, h)
                self._links[peer.engine_id] = link
                self._by_handle[h] = link
        self._sync_files(link, _remote_files(self.name, remote_buffers))
        return PeerLink(
            handle=link.handle, rails=[RailInfo(0, f"gds-{self.io_engine}")], extra={"engine": self.io_engine}
        )

    def access_control(self, link: PeerLink) -> AccessControl:
        return AccessControl(
            revocation=False,
            reason="files stay reachable by path: a peer keeps the file it opened after release_buffer",
        )

    def _sync_files(self, link: _Link, wanted: dict[int, tuple[str, int, bool]]) -> None:
        assert self._lib is not None and self._executor is not None
        with link.lock:
            for base in [b for b, f in link.files.items() if wanted.get(b) != (f.path, f.length, f.writable)]:
                self._lib.file_remove(self._executor.handle, link.handle, base)
                del link.files[base]
            for base, (path, length, writable) in wanted.items():
                if base in link.files:
                    continue
                link.files[base] = self._open_one(link, base, path, length, writable)

    def _open_one(self, link: _Link, base: int, path: str, length: int, writable: bool) -> _File:
        assert self._lib is not None and self._executor is not None
        flags = os.O_CLOEXEC | (os.O_RDWR if writable else os.O_RDONLY)
        try:
            fd = os.open(path, flags)
        except PermissionError:
            if not writable:
                raise PeerUnreachableError(f"gds: cannot open {path} of {link.engine_id}: permission denied") from None
            log.warning("gds: %s is not writable by this process; registering it read-only", path)
            writable = False
            fd = os.open(path, os.O_CLOEXEC | os.O_RDONLY)
        except OSError as exc:
            raise PeerUnreachableError(f"gds: cannot open {path} of {link.engine_id}: {exc.strerror}") from exc
        dfd = -1
        if self._direct or self._cufile_active:  # GPUDirect Storage reads through an O_DIRECT fd
            if is_tmpfs(path):
                log.info("gds: %s is on tmpfs: O_DIRECT is meaningless there, using buffered I/O", path)
            else:
                dfd = open_direct(path, writable)
        try:
            size = os.fstat(fd).st_size
        except OSError:
            size = -1
        if 0 <= size < length:
            log.warning("gds: %s holds %d bytes, %d advertised: reads past EOF fail with E_BOUNDS", path, size, length)
        rc = int(self._lib.file_add(self._executor.handle, link.handle, base, length, fd, dfd, int(writable)))
        if rc != 0:  # the executor closed the fds
            raise PeerUnreachableError(f"gds: registering {path} ({base:#x}+{length}) failed: {os.strerror(-rc)}")
        log.debug(
            "gds: %s file %s at %#x+%d writable=%s direct=%s", link.engine_id, path, base, length, writable, dfd >= 0
        )
        return _File(base, length, path, writable, dfd >= 0)

    def link_files(self, link_or_handle: PeerLink | int) -> dict[int, dict[str, Any]]:
        """base -> {path, length, writable, direct} of a connected peer (for tests and tools)."""
        h = link_or_handle.handle if isinstance(link_or_handle, PeerLink) else int(link_or_handle)
        with self._lock:
            link = self._by_handle.get(h)
        if link is None:
            raise KeyError(f"gds: no peer link with handle {h:#x}")
        with link.lock:
            return {
                b: dict(path=f.path, length=f.length, writable=f.writable, direct=f.direct)
                for b, f in link.files.items()
            }

    def _teardown(self, link: _Link) -> None:
        """Forget a link (caller holds self._lock); in-flight I/O finishes on its own fds."""
        assert self._lib is not None and self._executor is not None
        self._links.pop(link.engine_id, None)
        self._by_handle.pop(link.handle, None)
        self._lib.peer_remove(self._executor.handle, link.handle)
        with link.lock:
            link.files.clear()

    # -- stream ordering: I/O of an ordered batch starts once the caller's CUDA event is done
    def order_batch(self, token: int, mark: Any, deadline: float) -> bool:
        """Register the batch's CUDA event with the executor (False: the host waits instead, e.g.
        where libcuda is not loaded). `deadline` is time.monotonic() seconds (CLOCK_MONOTONIC)."""
        if self._executor is None or self._lib is None or getattr(mark.runtime, "name", "") != "cuda":
            return False
        event, seq = mark.native
        return int(self._lib.order_add(self._executor.handle, token, event, seq, int(deadline * 1e9))) == 0

    def order_done(self, token: int) -> None:
        if self._executor is not None and self._lib is not None:
            self._lib.order_remove(self._executor.handle, token)

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
            self._executor.close()  # drops the CUDA buffers' cuFile registrations and the driver
            self._executor = None
            self._gpu_bufs.clear()
            self._cufile_active = False
            self._cufile_reason = "transport closed"


@hookimpl
def tent_register_transports(registry: Any) -> None:
    registry.add(
        "gds",
        GdsTransport,
        abi_version=EXECUTOR_ABI_VERSION,
        version=__version__,
        description="local memory <-> registered files: io_uring (raw syscalls) or pread, O_DIRECT when aligned",
    )
