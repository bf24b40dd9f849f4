"""QoS: priority-slot rotation and cross-process rail load.

Paper section 4.2, "Quality of Service", and the C++ `quota.cpp` / `shared_quota.h`:

* `PrioritySlots`: each rail has a rotating slot number `(position + epoch) % n`, the epoch advancing
  every `rotation_interval_us`. A rail admits priority p iff its slot >= p, so at any instant one rail
  takes HIGH only, one HIGH+MID, the rest everything; the roles rotate so no rail is reserved for
  long. If no rail admits a request, all of them do (QoS shapes, it never blocks). Unlike the C++
  rotation, the slots are work-conserving: a priority is held back only while some higher
  priority was planned within `active_window_us`, so a lone MID or LOW flow (a checkpoint, a
  weight sync) still uses every rail (measured in docs/benchmarks.md, "QoS").
* `SharedRailLoad`: bytes queued per rail *name* (the NIC), shared by all processes of one user on
  the host through a small file in /dev/shm, so two engines on the same NIC see each other's load
  and feed it to the cost model (`RailTelemetry.set_external`).

All time is passed in (ns); nothing here sleeps or starts threads.

There is no promotion queue (the C++ `promotion_policy.h` ages LOW work up through strict priority
levels): priorities act where rails are chosen, and slices then wait in the executors' per-rail
FIFOs, which the engine does not reorder, so a strict-priority queue with anti-starvation would
have nothing to order. LOW work cannot starve here: the slots hold it back only from some rails,
and only while higher priorities are active.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import stat
import struct

import numpy as np

from .config import QosConfig
from .types import Priority

log = logging.getLogger(__name__)

_N_PRIO = len(Priority)


class PrioritySlots:
    """Per-rail priority windows rotating every `rotation_interval_us` (C++ local rotation),
    enforced only while a higher priority is active (see the module docstring)."""

    def __init__(self, config: QosConfig | None = None) -> None:
        self.config = config or QosConfig()
        self._interval_ns = max(1, int(self.config.rotation_interval_us) * 1000)
        self._active_ns = max(0, int(self.config.active_window_us) * 1000)
        self._seen: list[int | None] = [None] * _N_PRIO  # when each priority was last planned

    def native_view(self) -> tuple[list[int | None], int, int]:
        """(seen, interval_ns, active_ns): what the native fast path's mouse choice reads and notes
        (`_native.FastPath.mouse_policy`); `seen` is this object's own list, shared, not a copy."""
        return self._seen, self._interval_ns, self._active_ns

    def note(self, priority: int, now_ns: int) -> None:
        """A request of `priority` is being planned now."""
        self._seen[min(max(int(priority), 0), _N_PRIO - 1)] = now_ns

    def contended(self, priority: int, now_ns: int) -> bool:
        """True when a priority above `priority` was planned within the active window (always when
        the window is 0: the C++ behaviour)."""
        if self._active_ns == 0:
            return True
        for p in range(min(int(priority), _N_PRIO)):
            seen = self._seen[p]
            if seen is not None and now_ns - seen <= self._active_ns:
                return True
        return False

    def epoch(self, now_ns: int) -> int:
        return now_ns // self._interval_ns

    def slot(self, position: int, n_rails: int, now_ns: int) -> int:
        """The rotating slot of the rail at `position` among `n_rails` (0 = HIGH only)."""
        return (position + now_ns // self._interval_ns) % n_rails

    def admits(self, position: int, n_rails: int, priority: int, now_ns: int) -> bool:
        return n_rails <= 1 or (position + now_ns // self._interval_ns) % n_rails >= priority

    def admitted(self, n_rails: int, priority: int, now_ns: int, candidates: list[int] | None = None) -> list[int]:
        """Positions (among `candidates`, default all) that take `priority` now; all if none does."""
        cand = list(range(n_rails)) if candidates is None else candidates
        if priority <= 0 or n_rails <= 1 or not self.contended(priority, now_ns):
            return cand
        e = now_ns // self._interval_ns
        ok = [i for i in cand if (i + e) % n_rails >= priority]
        return ok or cand


# ---- cross-process shared rail load -------------------------------------------------------------

_MAGIC = b"TENTLOAD"
_VERSION = 1
_HDR = struct.Struct("<8sIII")  # magic, version, max_rails, max_procs
_HDR_SIZE = 64
_NAME_BYTES = 48
_OPEN_ATTEMPTS = 5
_NAME_CANDIDATES = 8


class _NotOurs(ValueError):
    """A file under the table's name that this user must not use (another owner, a link, shared mode)."""


class SharedRailLoad:
    """Per-rail queued bytes shared between the processes of one host via /dev/shm.

    File layout (little-endian): a 64-byte header (magic, version, max_rails, max_procs); a name
    table of `max_rails` x 48-byte NUL-padded UTF-8 rail names; a pid table of `max_procs` int64; a
    `max_rails` x `max_procs` int64 load matrix.

    Concurrency: each process claims one column of the matrix and only ever writes its own column,
    so updates need no lock and can never be lost (single writer per int64; aligned 8-byte stores
    and loads are atomic on the 64-bit platforms we run on). Readers sum a row, which may mix
    values from slightly different instants: good enough for a load estimate. Structural changes
    (creating the file, adding a rail name, claiming or freeing a column) take an `flock` on the
    file. Columns of processes that died without `close()` are reclaimed (zeroed) on attach.

    The file belongs to one user: its name carries the uid (``tent-load-u<uid>-<name>``), it is
    created mode 0600 and never followed through a link; a file under that name that is not the
    user's own private file is left alone and the next name (``.1``, ``.2``, ...) is used, the same
    walk in every process of the user, so another user can neither break nor steer this table. The
    last process to close it removes it; an opener that finds the file removed meanwhile retries.
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        config: QosConfig | None = None,
        directory: str = "/dev/shm",
        max_rails: int | None = None,
        max_procs: int | None = None,
    ) -> None:
        cfg = config or QosConfig()
        name = name or cfg.shared_load_name
        if "/" in name or not name:
            raise ValueError(f"bad shared load name {name!r}")
        base = os.path.join(directory, f"tent-load-u{os.geteuid()}-{name}")
        want_rails = int(max_rails or cfg.shared_load_max_rails)
        want_procs = int(max_procs or cfg.shared_load_max_procs)
        self._mm: mmap.mmap | None = None
        refused: list[str] = []
        # a file under our name that is not ours (planted by another user, or a link) is skipped:
        # every process of this user walks the same names, so they still meet on one table
        for k in range(_NAME_CANDIDATES):
            self.path = base if k == 0 else f"{base}.{k}"
            try:
                self._open(want_rails, want_procs)
                break
            except _NotOurs as exc:
                refused.append(str(exc))
        else:
            raise ValueError("no usable rail load table: " + "; ".join(refused))
        self._index: dict[str, int] = {}
        self._own: dict[str, int] = {}

    def _open(self, want_rails: int, want_procs: int) -> None:
        for _ in range(_OPEN_ATTEMPTS):
            self._fd = self._open_own()
            try:
                with self._locked():
                    if self._is_current():
                        self._attach(want_rails, want_procs)
                        return
            except BaseException:
                self._release_views()
                os.close(self._fd)
                raise
            os.close(self._fd)  # its last user removed it after we opened it: open again
        raise ValueError(f"{self.path} keeps being removed while opening it")

    def _open_own(self) -> int:
        """Open (or create, mode 0600) the table at self.path; links and files of other users or
        with other modes raise _NotOurs."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.EACCES, errno.EPERM, errno.ELOOP):
                raise
            st = os.lstat(self.path)
            raise _NotOurs(f"{self.path} (uid {st.st_uid}, mode {stat.filemode(st.st_mode)}) is not this user's "
                           f"(uid {os.geteuid()})") from None  # fmt: skip
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
            os.close(fd)
            raise _NotOurs(f"{self.path} (uid {st.st_uid}, mode {stat.filemode(st.st_mode)}) is not a private file "
                           f"of this user (uid {os.geteuid()})")  # fmt: skip
        return fd

    def _is_current(self) -> bool:
        """The open file is still the one at `self.path` (not removed by its last user meanwhile)."""
        try:
            on_disk = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        mine = os.fstat(self._fd)
        return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)

    def _attach(self, want_rails: int, want_procs: int) -> None:
        """Under the lock: initialize an empty file, map it, claim a column."""
        size = os.fstat(self._fd).st_size
        if size == 0:
            total = self._size(want_rails, want_procs)
            os.ftruncate(self._fd, total)
            os.pwrite(self._fd, _HDR.pack(_MAGIC, _VERSION, want_rails, want_procs), 0)
        magic, version, self.max_rails, self.max_procs = _HDR.unpack(os.pread(self._fd, _HDR.size, 0))
        if magic != _MAGIC or version != _VERSION:
            raise ValueError(f"{self.path} is not a TENT shared load file (v{_VERSION})")
        if os.fstat(self._fd).st_size < self._size(self.max_rails, self.max_procs):
            raise ValueError(f"{self.path} is shorter than its header says")
        self._mm = mmap.mmap(self._fd, self._size(self.max_rails, self.max_procs))
        off = _HDR_SIZE
        self._names = np.frombuffer(self._mm, dtype=f"S{_NAME_BYTES}", count=self.max_rails, offset=off)
        off += self.max_rails * _NAME_BYTES
        self._pids = np.frombuffer(self._mm, dtype=np.int64, count=self.max_procs, offset=off)
        off += self.max_procs * 8
        self._load = np.frombuffer(
            self._mm, dtype=np.int64, count=self.max_rails * self.max_procs, offset=off
        ).reshape(self.max_rails, self.max_procs)
        self._col = self._claim_column()
        # the load matrix again as a flat memoryview of int64: `exchange`, on every health tick,
        # reads and writes it in the interpreter's own code, not numpy's (docs/benchmarks.md)
        self._flat = memoryview(self._mm)[off:].cast("q")

    @staticmethod
    def _size(max_rails: int, max_procs: int) -> int:
        return _HDR_SIZE + max_rails * _NAME_BYTES + max_procs * 8 + max_rails * max_procs * 8

    class _Lock:
        def __init__(self, fd: int) -> None:
            self.fd = fd

        def __enter__(self) -> None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)

        def __exit__(self, *exc: object) -> None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _locked(self) -> SharedRailLoad._Lock:
        return SharedRailLoad._Lock(self._fd)

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _claim_column(self) -> int:
        me = os.getpid()
        free = -1
        for col, pid in enumerate(self._pids.tolist()):
            if pid and pid != me and not self._alive(pid):
                log.info("shared rail load %s: reclaiming column of dead pid %d", self.path, pid)
                self._load[:, col] = 0
                self._pids[col] = 0
                pid = 0
            if pid == 0 and free < 0:
                free = col
        if free < 0:
            raise RuntimeError(f"{self.path}: all {self.max_procs} process columns in use")
        self._load[:, free] = 0
        self._pids[free] = me
        return free

    def _slot(self, rail: str) -> int:
        i = self._index.get(rail)
        if i is not None:
            return i
        key = rail.encode()[:_NAME_BYTES]
        with self._locked():
            names = self._names.tolist()
            if key in names:
                i = names.index(key)
            else:
                try:
                    i = names.index(b"")
                except ValueError:
                    i = self._idle_name()  # full: recycle a name no attached process has load on
                    if i < 0:
                        raise RuntimeError(f"{self.path}: all {self.max_rails} rail names carry load") from None
                    stale = names[i].decode(errors="replace")
                    for k in [k for k, v in self._index.items() if v == i]:
                        del self._index[k]
                    log.debug("shared rail load %s: recycling idle rail name %s", self.path, stale)
                self._names[i] = key
        self._index[rail] = i
        return i

    def _idle_name(self) -> int:
        """A name slot whose row is all zero (no process has bytes queued on it), or -1."""
        idle = (self._load == 0).all(axis=1).nonzero()[0]
        own = set(self._index.values())
        for i in idle.tolist():
            if i not in own:
                return int(i)
        return int(idle[0]) if len(idle) else -1

    # ---- updates (own column only: no lock) ---------------------------------------------------

    def set(self, rail: str, nbytes: int) -> None:
        """Publish this process's queued bytes on `rail` (e.g. from its native inflight counter)."""
        self._load[self._slot(rail), self._col] = nbytes
        self._own[rail] = nbytes

    def add(self, rail: str, delta: int) -> int:
        """Add `delta` to this process's queued bytes on `rail`; returns the new own value."""
        i = self._slot(rail)
        v = int(self._load[i, self._col]) + delta
        self._load[i, self._col] = v
        self._own[rail] = v
        return v

    def exchange(self, rail: str, nbytes: int) -> int:
        """`set(rail, nbytes)`, then `others(rail)`: what the health tick does for every rail."""
        i = self._index.get(rail)
        base = (self._slot(rail) if i is None else i) * self.max_procs
        flat = self._flat
        flat[base + self._col] = nbytes
        self._own[rail] = nbytes
        return sum(flat[base : base + self.max_procs]) - nbytes

    # ---- queries ------------------------------------------------------------------------------

    def own(self, rail: str) -> int:
        return int(self._load[self._slot(rail), self._col])

    def total(self, rail: str) -> int:
        """Queued bytes on `rail` summed over every attached process."""
        return int(self._load[self._slot(rail)].sum())

    def others(self, rail: str) -> int:
        """Queued bytes on `rail` from the *other* processes (what `set_external` wants)."""
        row = self._load[self._slot(rail)]
        return int(row.sum() - row[self._col])

    def snapshot(self) -> dict[str, int]:
        """Every known rail name -> total queued bytes."""
        names = self._names.tolist()
        totals = self._load.sum(axis=1).tolist()
        return {n.decode(): int(t) for n, t in zip(names, totals, strict=True) if n}

    @property
    def column(self) -> int:
        return self._col

    # ---- lifetime -----------------------------------------------------------------------------

    def _release_views(self) -> None:
        flat = getattr(self, "_flat", None)
        if flat is not None:
            flat.release()  # mmap.close() refuses while a view of it is exported
        for attr in ("_names", "_pids", "_load", "_flat"):
            if hasattr(self, attr):
                delattr(self, attr)
        if self._mm is not None:
            self._mm.close()
            self._mm = None

    def close(self) -> None:
        """Zero and free this process's column; the last process attached removes the file."""
        if self._mm is None:
            return
        with self._locked():
            self._load[:, self._col] = 0
            self._pids[self._col] = 0
            me = os.getpid()
            last = not any(pid and (pid == me or self._alive(pid)) for pid in self._pids.tolist())
            if last and self._is_current():
                self.unlink()
        self._release_views()
        os.close(self._fd)
        self._fd = -1

    def unlink(self) -> None:
        """Remove the file (tests; other attached processes keep their mapping)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> SharedRailLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() is the contract
        try:
            self.close()
        except Exception:
            pass


__all__ = ["PrioritySlots", "SharedRailLoad"]
