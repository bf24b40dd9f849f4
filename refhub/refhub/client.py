"""refhub client library: shard handles over a ZeroMQ connection, bytes moved by tent_core.

``refhub.open(model, replica=..., shard=..., num_shards=..., server=...)`` returns a ShardHandle.
Publishing passes a reference (the tensors stay where they are, registered with the engine); a
replicate READs the version straight from a peer's registered memory into this handle's tensors.

Layout of a shard as served to peers: one engine segment per handle holding, in this order, a
64-byte progress word, one contiguous *pack* buffer for every tensor under 2 MB, then each large
tensor registered in place (direct mode: zero copy). The byte stream a reader copies is the pack
followed by the large tensors sorted by name; the progress word ``(version << 40) | bytes`` says
how much of that stream a *receiving* replica already holds (pipeline replication).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

log = logging.getLogger("refhub.client")

TINY = 2 * 1024 * 1024
CHUNK = 16 * 1024 * 1024
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


class _Slot:
    __slots__ = ("ev", "reply")

    def __init__(self) -> None:
        self.ev = threading.Event()
        self.reply: Any = None


class Connection:
    """One DEALER connection to the reference server (with an optional backup), shared by handles."""

    def __init__(self, server: str, backup: str | None = None, *, hb_interval: float = 0.5, failover_after: float = 2.0) -> None:
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
        self._pull.bind(self._inproc)
        self._push = self.ctx.socket(zmq.PUSH)
        self._push.connect(self._inproc)
        self._push_lock = threading.Lock()
        self._stop = threading.Event()
        self.events = ThreadPoolExecutor(max_workers=1, thread_name_prefix="refhub-events")
        self._dealer = self._connect(self.addresses[0])
        self._thread = threading.Thread(target=self._io, name="refhub-io", daemon=True)
        self._thread.start()

    @property
    def server(self) -> str:
        return self.addresses[self.idx]

    def _connect(self, addr: str) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(addr)
        return s

    def request(self, msg: dict, timeout: float = 30.0) -> dict:
        """Send one request and wait for its reply (deadline `timeout`). Raises RefhubError on error replies."""
        rid = next(self._rid)
        msg["rid"] = rid
        slot = _Slot()
        with self._plock:
            self._pending[rid] = slot
        data = msgpack.packb(msg, use_bin_type=True)
        with self._push_lock:
            self._push.send(data)
        if not slot.ev.wait(timeout):
            with self._plock:
                self._pending.pop(rid, None)
            raise TimeoutError(f"refhub {msg.get('op')} got no reply within {timeout:.1f}s from {self.server}")
        rep = slot.reply
        if isinstance(rep, Exception):
            raise rep
        if not rep.get("ok", False) and not rep.get("keep"):
            code = rep.get("err", "error")
            cls = VersionUnavailable if code == "unavailable" else RefhubError
            raise cls(code, rep.get("msg", ""))
        return rep

    def _io(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        poller.register(self._dealer, zmq.POLLIN)
        last_rx = time.monotonic()
        last_hb = 0.0
        hb_out = False
        while not self._stop.is_set():
            ready = dict(poller.poll(int(self.hb_interval * 500)))
            now = time.monotonic()
            if self._pull in ready:
                while True:
                    try:
                        data = self._pull.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._dealer.send(data)
            if self._dealer in ready:
                while True:
                    try:
                        data = self._dealer.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    last_rx = now
                    hb_out = False
                    try:
                        reps = msgpack.unpackb(data, raw=False, strict_map_key=False)
                    except Exception:
                        log.warning("undecodable reply from %s", self.server)
                        continue
                    for rep in reps if isinstance(reps, list) else [reps]:
                        self._deliver(rep)
            if now - last_hb >= self.hb_interval:
                last_hb = now
                hs = list(self.handles)
                if hs:
                    hb_out = True
                    self._dealer.send(msgpack.packb({"op": "hb", "rid": 0, "hs": hs}))
                elif not hb_out:
                    last_rx = now
            if hb_out and now - last_rx > self.failover_after:
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
                for hid in rep["unknown"]:
                    h = self.handles.get(hid)
                    if h is not None:
                        self.events.submit(h._reopen)
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

    def _reset_handles(self) -> None:
        self.generation += 1
        with self._plock:
            pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.reply = ServerFailover("failover", f"reference server changed to {self.server}")
            slot.ev.set()
        for h in list(self.handles.values()):
            self.events.submit(h._reopen)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.events.shutdown(wait=False, cancel_futures=True)
        self._pull.close(0)
        self._push.close(0)
        self.ctx.term()


def query(server: str, msg: dict, timeout: float = 2.0) -> dict:
    """One-off request (no handle): stats, list by model."""
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(server)
    try:
        msg = dict(msg, rid=1)
        s.send(msgpack.packb(msg))
        if not s.poll(int(timeout * 1000)):
            raise TimeoutError(f"no reply from {server} within {timeout}s")
        rep = msgpack.unpackb(s.recv(), raw=False, strict_map_key=False)
        return rep[0] if isinstance(rep, list) else rep
    finally:
        s.close(0)
        ctx.term()


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


def _connection(server: str, backup: str | None, hb_interval: float, failover_after: float) -> Connection:
    key = (server, backup)
    with _engine_lock:
        c = _conns.get(key)
        if c is None or c._stop.is_set():
            c = _conns[key] = Connection(server, backup, hb_interval=hb_interval, failover_after=failover_after)
        return c


def _as_array(t: Any) -> tuple[np.ndarray, Any]:
    """A uint8 view of a numpy array or a CPU torch tensor (and the object to keep alive)."""
    if isinstance(t, np.ndarray):
        if not t.flags.c_contiguous:
            raise ValueError("refhub tensors must be C-contiguous")
        return t.reshape(-1).view(np.uint8), t
    mod = type(t).__module__
    if mod.startswith("torch"):
        if t.device.type != "cpu":
            raise ValueError("this build serves CPU tensors; GPU tensors need the nvlink/rdma plugins")
        if not t.is_contiguous():
            raise ValueError("refhub tensors must be contiguous")
        arr = t.detach().view(-1).view(__import__("torch").uint8).numpy()
        return arr, t
    raise TypeError(f"cannot register {type(t).__name__}: a numpy array or a CPU torch tensor")


@dataclass
class _Item:
    name: str
    arr: np.ndarray  # uint8 view of the user's tensor
    keep: Any
    buf: Any = None  # engine LocalBuffer when registered in place
    pack_off: int = -1  # offset inside the pack when tiny


_seg_counter = itertools.count()


class ShardHandle:
    """One worker's shard of one replica of a model."""

    def __init__(self, conn: Connection, engine: Any, model: str, replica: str, shard: int, num_shards: int,
                 retain: dict | None, datacenter: str, spot: bool, kind: str = "normal",
                 request_timeout: float = 30.0, throttle_Bps: float | None = None) -> None:
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
        self.segment = f"rh{os.getpid()}-{next(_seg_counter)}"
        self._lock = threading.RLock()
        self._pack = None  # LocalBuffer of the tiny-tensor pack
        self._layout_dirty = True
        self._ctrl = engine.allocate(64, segment=self.segment)  # progress word at offset 0 of the segment
        self._ctrl.array[:] = 0
        self._scratch = engine.allocate(64, segment=f"{self.segment}-scratch")
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

    def _reopen(self) -> None:
        """After a server failover/restart: unpublished, same tensors, re-registered with the new server."""
        with self._lock:
            if self._closed:
                return
            self.state = "idle"
            for attempt in range(50):
                try:
                    self._open()
                    log.info("handle %s/%s/%d re-registered with %s", self.model, self.replica, self.shard, self.conn.server)
                    return
                except (TimeoutError, RefhubError) as exc:
                    log.warning("re-open attempt %d failed: %s", attempt, exc)
                    time.sleep(0.2)

    def register(self, name: str, tensor: Any) -> None:
        """Register a tensor (numpy array or CPU torch tensor). Large ones are registered in place."""
        with self._lock:
            if self.state != "idle":
                raise RefhubError("bad_state", "register while published/receiving: unpublish first")
            arr, keep = _as_array(tensor)
            if name in self.items:
                self.unregister(name)
            it = _Item(name, arr, keep)
            if arr.nbytes >= TINY:
                it.buf = self.engine.register(arr, segment=self.segment)
            self.items[name] = it
            self._layout_dirty = True

    def unregister(self, name: str) -> None:
        with self._lock:
            if self.state != "idle":
                raise RefhubError("bad_state", "unregister while published/receiving: unpublish first")
            it = self.items.pop(name)
            if it.buf is not None:
                self.engine.unregister(it.buf)
            self._layout_dirty = True

    def _build_layout(self) -> None:
        if not self._layout_dirty:
            return
        tiny = sorted((n for n, it in self.items.items() if it.buf is None))
        size = 0
        for n in tiny:
            self.items[n].pack_off = size
            size += (self.items[n].arr.nbytes + 63) & ~63
        if self._pack is not None and (self._pack.length < size or size == 0):
            self.engine.unregister(self._pack)
            self._pack = None
        if size and self._pack is None:
            self._pack = self.engine.allocate(size, segment=self.segment)
        self._layout_dirty = False

    def _stream(self) -> list[tuple[str, Any, int, int]]:
        """The byte stream served to readers: [(name, LocalBuffer, offset inside it, nbytes)]."""
        out = []
        if self._pack is not None:
            used = max((it.pack_off + it.arr.nbytes for it in self.items.values() if it.buf is None), default=0)
            out.append(("__pack__", self._pack, 0, used))
        for n in sorted(n for n, it in self.items.items() if it.buf is not None):
            it = self.items[n]
            out.append((n, it.buf, 0, it.arr.nbytes))
        return out

    def _ref(self, with_layout: bool = True) -> dict:
        stream = self._stream()
        return {
            "seg": self.engine.segment_name(self.segment),
            "progress": self._ctrl.offset,
            "items": [[n, b.offset + off, nb] for n, b, off, nb in stream],
            "total": sum(s[3] for s in stream),
            "pack": sorted([n, it.pack_off, it.arr.nbytes] for n, it in self.items.items() if it.buf is None),
        }

    def _set_progress(self, version: int, nbytes: int) -> None:
        self._ctrl.array[:8] = np.frombuffer(np.uint64((version << VERSION_SHIFT) | nbytes).tobytes(), dtype=np.uint8)

    def _checksums(self) -> list[int]:
        return [checksum(self.items[n].arr) for n in sorted(self.items)]

    # -------------------------------------------------------------- ROS primitives
    def publish(self, version: int) -> None:
        """Make the registered tensors visible as `version` (immutability commitment until unpublish)."""
        with self._lock:
            self._build_layout()
            if self._pack is not None:
                for it in self.items.values():
                    if it.buf is None:
                        self._pack.array[it.pack_off:it.pack_off + it.arr.nbytes] = it.arr
            cks = self._checksums()
            ref = self._ref()
            self._set_progress(version, ref["total"])
            self.conn.request({"op": "publish", "h": self.hid, "version": int(version), "ref": ref, "checksum": cks},
                              self.request_timeout)
            self.state = "published"
            self.version = int(version)

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

    def _offload(self, version: int) -> None:
        """Copy this shard to CPU memory and publish it as an offload replica (released by the server later)."""
        t0 = time.monotonic()
        off = ShardHandle(self.conn, self.engine, self.model, f"{self.replica}~offload-v{version}", self.shard,
                          self.num_shards, self.retain, self.datacenter, False, kind="offload",
                          request_timeout=self.request_timeout)
        for n, it in self.items.items():
            off.register(n, it.arr.copy())
        off.publish(version)
        self._offloads.append(off)
        log.info("offloaded %s v%d shard %d to CPU in %.3fs", self.model, version, self.shard, time.monotonic() - t0)

    def _on_event(self, ev: dict) -> None:
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
            deadline = time.monotonic() + (timeout or self.request_timeout)
            self._build_layout()
            msg = {"op": op, "h": self.hid, "ref": self._ref(), **fields}
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
            self.conn.request({"op": "replicate_done", "h": self.hid, "ok": True}, self.request_timeout)
            self.state = "published"
            return v

    def _read(self, reqs: list, deadline: float) -> None:
        from tent_core import READ, Request
        from tent_core.errors import NotRegisteredError, UnknownSegmentError

        rq = [Request(READ, lb, loff, seg, roff, n) for lb, loff, seg, roff, n in reqs]
        for attempt in range(2):
            try:
                self.engine.submit(rq, deadline=max(0.05, min(10.0, deadline - time.monotonic()))).wait()
                return
            except (UnknownSegmentError, NotRegisteredError):
                if attempt:
                    raise
                self.engine.refresh_peer(reqs[0][2].partition("/")[0])

    def _pull(self, v: int, src: dict, cks: list | None, deadline: float) -> None:
        from tent_core.errors import TentError

        t0 = time.monotonic()
        sources = [(src.get("replica"), bool(src.get("partial")))]
        self._set_progress(v, 0)
        mine = self._stream()
        total = sum(s[3] for s in mine)
        done = 0
        reroutes = 0
        last_report = time.monotonic()
        sleep = 0.0005
        while True:
            ref = src["ref"]
            if [i[2] for i in ref.get("items", [])] != [s[3] for s in mine] or ref.get("pack") != self._ref()["pack"]:
                raise RefhubError("layout_mismatch", f"source {src.get('replica')} has a different tensor layout")
            seg = ref["seg"]
            try:
                while done < total:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"replicate v{v}: deadline passed at {done}/{total} bytes")
                    if src.get("partial"):
                        self._read([(self._scratch, 0, seg, ref["progress"], 8)], deadline)
                        word = int(self._scratch.array[:8].view(np.uint64)[0])
                        avail = word & BYTES_MASK if (word >> VERSION_SHIFT) == v else 0
                    else:
                        avail = total
                    if avail <= done:
                        if time.monotonic() - last_report > 0.5:
                            last_report = time.monotonic()
                            rep = self.conn.request({"op": "progress", "h": self.hid, "done": done}, self.request_timeout)
                            if "src" in rep:
                                src = rep["src"]
                                sources.append((src.get("replica"), bool(src.get("partial"))))
                                reroutes += 1
                                break
                        time.sleep(sleep)
                        sleep = min(sleep * 2, 0.02)
                        continue
                    sleep = 0.0005
                    end = min(avail, done + (CHUNK if self.throttle_Bps else CHUNK * 4))
                    reqs = []
                    pos = 0
                    for (_, lb, loff, nb), (_, roff, _) in zip(mine, ref["items"], strict=True):
                        a, b = max(done, pos), min(end, pos + nb)
                        if a < b:
                            for c in range(a, b, CHUNK):
                                n = min(CHUNK, b - c)
                                reqs.append((lb, loff + c - pos, seg, roff + c - pos, n))
                        pos += nb
                    t_chunk = time.monotonic()
                    self._read(reqs, deadline)
                    if self.throttle_Bps:
                        time.sleep(max(0.0, (end - done) / self.throttle_Bps - (time.monotonic() - t_chunk)))
                    done = end
                    self._set_progress(v, done)
                else:
                    break
            except (TentError, OSError) as exc:
                log.warning("replicate v%d: source %s failed at %d/%d bytes: %s", v, src.get("replica"), done, total, exc)
                src = self._next_source(done, deadline)
                sources.append((src.get("replica"), bool(src.get("partial"))))
                reroutes += 1
        t_xfer = time.monotonic() - t0
        # unpack tiny tensors and verify
        if self._pack is not None:
            for it in self.items.values():
                if it.buf is None:
                    it.arr[:] = self._pack.array[it.pack_off:it.pack_off + it.arr.nbytes]
        if cks is not None:
            got = self._checksums()
            if list(got) != list(cks):
                raise ChecksumError("checksum", f"v{v} shard {self.shard}: end-to-end checksum mismatch")
        dt = time.monotonic() - t0
        self.stats = {"bytes": total, "seconds": dt, "transfer_s": t_xfer, "checksum_s": dt - t_xfer, "reroutes": reroutes,
                      "sources": sources, "GBps": total / dt / 1e9 if dt else 0.0,
                      "transfer_GBps": total / t_xfer / 1e9 if t_xfer else 0.0}

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
            for it in self.items.values():
                if it.buf is not None:
                    self.engine.unregister(it.buf)
            if self._pack is not None:
                self.engine.unregister(self._pack)
            self.engine.unregister(self._ctrl)
            self.engine.unregister(self._scratch)
            self.items.clear()

    def __enter__(self) -> ShardHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(model: str, *, replica: str = "0", shard: int = 0, num_shards: int = 1, retain: dict | None = None,
         datacenter: str = "default", spot: bool = False, server: str = "tcp://127.0.0.1:5555",
         backup: str | None = None, engine: Any = None, hb_interval: float = 0.5, failover_after: float = 2.0,
         request_timeout: float = 30.0, throttle_Bps: float | None = None) -> ShardHandle:
    """Open a shard handle. `server` may be an address or "embedded" (start a server in this process)."""
    if server == "embedded":
        from .server import start_embedded

        server = start_embedded()
    conn = _connection(server, backup, hb_interval, failover_after)
    return ShardHandle(conn, engine or default_engine(), model, replica, shard, num_shards, retain, datacenter, spot,
                       request_timeout=request_timeout, throttle_Bps=throttle_Bps)


Predicate = Callable[[dict], bool]
