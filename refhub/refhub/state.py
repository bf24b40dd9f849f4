"""The reference server as a pure state machine: no sockets, no threads, no clock reads.

``ServerState.handle(client, msg, now)`` consumes one validated request and returns the replies it
produces, as ``(client, reply)`` pairs: a request's reply may be deferred (a replicate waiting for
its version, an unpublish waiting for in-flight reads to drain) and one request may release replies
to other clients. ``tick(now)`` applies heartbeat, barrier and wait timeouts.

Model: model -> version -> replica (a model-parallel group of ``num_shards`` shards) -> shard. A
shard handle is in one of the states IDLE, PUBLISHED (holds a complete version, immutable), RECEIVING
(being filled with a version; serves the prefix it has to pipeline readers) or DRAINING (revoked,
waiting until the reads from it end before its owner may mutate it).

Ownership (SECURITY.md): a handle belongs to the client that opened it: the client id ``cid`` it
sent (a random credential its connection keeps across reconnects), or, without one, the connection
itself. Only the owner may act on a handle (publish, unpublish, transactions, close) or re-bind it
with ``hb``; others get ``not_owner``. Re-opening a (replica, shard) that a live handle of another
owner holds is refused until that handle has been silent for ``takeover_after`` seconds (a
restarted worker waits that long, an impostor cannot evict a live one). A model's shape
(``num_shards``) is fixed by its first open and released when its last replica goes away; the
number of models and handles (in all and per owner) is capped.

A *reservation* ``(replica, shard, txn)`` in ``source.readers`` pins a source buffer: it is taken
when a replicate/update transaction picks the source and released when the reader finishes, fails
over to another source, or dies. A handle is never told it may mutate its buffer (unpublish, update,
replicate reply) while it holds reservations.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from tent_core.ratelog import RateLimitedLog

from .protocol import (
    E_BAD_MESSAGE,
    E_BARRIER,
    E_LIMIT,
    E_MODEL,
    E_NOT_OWNER,
    E_STATE,
    E_TXN,
    E_UNAVAILABLE,
    E_UNKNOWN_HANDLE,
    TXN_OPS,
    PackedList,
    ProtocolError,
    parse_version,
    ref_bytes,
    validate,
)

log = logging.getLogger("refhub.state")

IDLE, PUBLISHED, RECEIVING, DRAINING = 0, 1, 2, 3
STATE_NAMES = {IDLE: "idle", PUBLISHED: "published", RECEIVING: "receiving", DRAINING: "draining"}

Reply = tuple[Any, dict[str, Any]]
ResKey = tuple[str, int, int]  # (replica name, shard, txn index)


@dataclass(eq=False)
class Handle:
    hid: int
    client: Any
    model: Model
    replica: Replica
    shard: int
    last_seen: float
    owner: Any = None  # ("cid", bytes) or ("conn", client): who may act on this handle
    ref_bytes: int = 0  # packed size of `ref`, charged to the owner
    state: int = IDLE
    version: int | None = None
    ref: dict | None = None
    complete: bool = False  # holds the whole of `version`
    seeding: bool = False  # receiving over the cross-datacenter path
    src: Handle | None = None
    src_key: ResKey | None = None
    readers: dict = field(default_factory=dict)  # ResKey -> version being read
    pending: tuple[Any, dict] | None = None  # reply deferred until readers drain
    closing: bool = False
    seq: int = 0
    suspect_until: float = 0.0
    alive: bool = True


@dataclass(eq=False)
class Txn:
    op: str
    args: dict
    decider: int
    decided: bool = False
    result: dict | None = None
    sources: dict = field(default_factory=dict)  # shard -> reserved source Handle
    waiters: dict = field(default_factory=dict)  # shard -> (handle, rid)
    consumed: set = field(default_factory=set)
    deadline: float | None = None


@dataclass(eq=False)
class Replica:
    name: str
    model: Model
    num_shards: int
    dc: str
    spot: bool
    kind: str
    created: float
    shards: dict = field(default_factory=dict)  # shard -> Handle
    txns: dict = field(default_factory=dict)  # k -> Txn
    formed: bool = False
    barrier_queue: list = field(default_factory=list)  # (client, msg) held until all shards opened
    seeding: set = field(default_factory=set)  # versions this replica seeds into its datacenter


@dataclass(eq=False)
class Model:
    name: str
    num_shards: int
    keep_latest: int = 0
    replicas: dict = field(default_factory=dict)
    holders: dict = field(default_factory=dict)  # version -> [dict(Handle -> None) per shard], insertion-ordered
    ever: set = field(default_factory=set)  # versions that have ever been complete
    announced: set = field(default_factory=set)  # versions any shard has published (retention counts these)
    seeders: dict = field(default_factory=dict)  # (version, dc) -> set(replica name)
    pending: set = field(default_factory=set)  # (replica name, k) undecided txns
    checksums: dict = field(default_factory=dict)  # (version, shard) -> publisher's checksum
    retained: frozenset = frozenset()
    retained_key: tuple | None = None
    offload_handles: dict = field(default_factory=dict)  # Handle -> None: the (few) offload replicas' shards


class ServerState:
    """Soft state of one reference server. Deterministic given the sequence of calls."""

    def __init__(
        self,
        *,
        hb_timeout: float = 5.0,
        barrier_timeout: float = 30.0,
        suspect_s: float | None = None,
        epoch: str = "0",
        pipeline: bool = True,
        takeover_after: float | None = None,
        max_handles: int = 1 << 18,
        max_handles_per_owner: int = 4096,
        max_models: int = 1 << 16,
        max_ref_bytes_per_owner: int = 256 << 20,
        max_ref_bytes: int = 4 << 30,
    ) -> None:
        self.pipeline = pipeline  # False: only complete replicas serve (for the burst benchmark's baseline)
        self.hb_timeout = hb_timeout
        self.barrier_timeout = barrier_timeout
        self.suspect_s = hb_timeout if suspect_s is None else suspect_s
        self.epoch = epoch
        self.takeover_after = hb_timeout / 2 if takeover_after is None else takeover_after
        self.max_handles = max_handles
        self.max_handles_per_owner = max_handles_per_owner
        self.max_models = max_models
        self.max_ref_bytes_per_owner = max_ref_bytes_per_owner
        self.max_ref_bytes = max_ref_bytes
        self.owned: dict[Any, int] = {}  # owner -> live handles
        self.ref_bytes: dict[Any, int] = {}  # owner -> packed bytes of its handles' references
        self.ref_bytes_total = 0
        self.stats_hook: Any = None  # the I/O shell's counters (frames, drops, sessions), merged into stats
        self._now = 0.0  # the time of the call being handled: the log limiter's clock (no clock reads)
        self.rlog = RateLimitedLog(log, clock=lambda: self._now)
        self.models: dict[str, Model] = {}
        self.handles: dict[int, Handle] = {}
        self._next_hid = 1
        self.ops = 0
        self.errors = 0
        self.failures = 0

    # ------------------------------------------------------------------ entry points

    def handle(self, client: Any, msg: Any, now: float) -> list[Reply]:
        """Process one request (already decoded). Never raises for a bad message."""
        out: list[Reply] = []
        self._now = now
        rid = msg.get("rid", 0) if isinstance(msg, dict) else 0
        if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid < 1 << 63:
            rid = 0
        checked: dict = {}
        try:
            op = validate(msg, checked)
        except ProtocolError as exc:
            self.errors += 1
            self.rlog.warning("bad-message", "bad message from %.60r: %s", client, exc)
            out.append((client, {"rid": rid, "ok": False, "err": E_BAD_MESSAGE, "msg": str(exc)}))
            return out
        self.ops += 1
        if "ref" in checked and checked["ref"] is not msg["ref"]:
            # the layout with the encoding validate() made: stored and sent to readers as those bytes
            msg = {**msg, "ref": checked["ref"]}
        try:
            self._dispatch(op, client, msg, rid, now, out)
        except Exception:  # a bug must not take the server down
            self.errors += 1
            if self.rlog.allow("internal")[0]:
                log.exception("internal error on %s from %.60r", op, client)
            out.append((client, {"rid": rid, "ok": False, "err": "internal", "msg": f"internal error on {op}"}))
        return out

    def tick(self, now: float) -> list[Reply]:
        """Apply timeouts: silent handles fail (whole replica), barriers and waits expire."""
        out: list[Reply] = []
        self._now = now
        limit = now - self.hb_timeout
        dead = {h.replica for h in self.handles.values() if h.last_seen < limit}
        for rep in dead:
            if rep.model.replicas.get(rep.name) is rep:
                self.rlog.warning("hb", "replica %s/%s missed heartbeats: removed", rep.model.name, rep.name)
                self.failures += 1
                self._remove_replica(rep, now, out)
        for model in self.models.values():
            for rep in list(model.replicas.values()):
                if not rep.formed and rep.barrier_queue and now - rep.created > self.barrier_timeout:
                    for client, m in rep.barrier_queue:
                        out.append((client, _err(m.get("rid", 0), E_BARRIER, "not all shards of the replica registered")))
                    rep.barrier_queue.clear()
            if model.pending:
                for rname, k in list(model.pending):
                    rep = model.replicas.get(rname)
                    txn = rep.txns.get(k) if rep else None
                    if txn is not None and txn.deadline is not None and now >= txn.deadline and not txn.decided:
                        self._decided(rep, k, txn, {"ok": True, "met": False, "timeout": True}, now, out)
        return out

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, op: str, client: Any, msg: dict, rid: int, now: float, out: list[Reply]) -> None:
        if op == "open":
            self._open(client, msg, rid, now, out)
            return
        if op == "hb":
            unknown = []
            denied = []
            me = _owner(client, msg)
            for hid in msg["hs"]:
                h = self.handles.get(hid)
                if h is None:
                    unknown.append(hid)
                elif h.owner != me:
                    denied.append(hid)  # not ours: neither kept alive nor re-bound
                else:
                    h.last_seen = now
                    h.client = client
            rep = {"rid": rid, "ok": True, "unknown": unknown, "epoch": self.epoch}
            if denied:
                rep["denied"] = denied
            out.append((client, rep))
            return
        if op == "stats":
            out.append((client, {"rid": rid, "ok": True, **self.stats()}))
            return
        if op == "list" and "h" not in msg:
            model = self.models.get(msg.get("model", ""))
            out.append((client, {"rid": rid, "ok": True, **(self._list(model) if model else _EMPTY_LIST)}))
            return
        h = self.handles.get(msg["h"])
        if h is None:
            out.append((client, _err(rid, E_UNKNOWN_HANDLE, f"handle {msg['h']} is not registered (epoch {self.epoch})")))
            return
        if h.owner != _owner(client, msg):
            self.rlog.warning("not-owner", "client %.60r tried %s on handle %d it does not own", client, op, h.hid)
            out.append((client, _err(rid, E_NOT_OWNER, f"handle {h.hid} belongs to another client")))
            return
        if op in ("publish", "replicate", "update") and msg.get("ref"):
            # references are kept per handle and sent to every reader: the owner's total is capped
            size = ref_bytes(msg["ref"])
            mine = self.ref_bytes.get(h.owner, 0) - h.ref_bytes + size
            if mine > self.max_ref_bytes_per_owner or self.ref_bytes_total - h.ref_bytes + size > self.max_ref_bytes:
                out.append((client, _err(rid, E_LIMIT, "references too large (per-client or server limit)")))
                return
        h.last_seen = now
        h.client = client
        rep = h.replica
        if not rep.formed and op != "close":
            rep.barrier_queue.append((client, msg))
            return
        if op in TXN_OPS:
            self._txn_call(h, op, msg, rid, now, out)
        elif op == "publish":
            self._publish(h, msg, rid, now, out)
        elif op == "unpublish":
            self._unpublish(h, rid, now, out)
        elif op == "progress":
            self._progress(h, msg, rid, now, out)
        elif op == "replicate_done":
            self._replicate_done(h, msg.get("ok", True), rid, now, out)
        elif op == "close":
            self._close(h, rid, now, out)

    # ------------------------------------------------------------------ open / close / failure

    def _open(self, client: Any, msg: dict, rid: int, now: float, out: list[Reply]) -> None:
        mname = msg["model"]
        n = msg["num_shards"]
        owner = _owner(client, msg)
        # every check first: a refused open changes nothing
        if len(self.handles) >= self.max_handles or self.owned.get(owner, 0) >= self.max_handles_per_owner:
            out.append((client, _err(rid, E_LIMIT, "too many open handles (server or client limit)")))
            return
        model = self.models.get(mname)
        if model is None and len(self.models) >= self.max_models:
            out.append((client, _err(rid, E_LIMIT, f"too many models ({self.max_models})")))
            return
        if model is not None and model.num_shards != n:
            out.append((client, _err(rid, E_MODEL, f"model {mname} has {model.num_shards} shards (held by "
                                                    f"{len(model.replicas)} replica(s)), not {n}")))
            return
        rname = msg["replica"]
        shard = msg["shard"]
        rep = model.replicas.get(rname) if model is not None else None
        held = rep.shards.get(shard) if rep is not None else None
        if held is not None and held.owner != owner and now - held.last_seen < self.takeover_after:
            out.append((client, _err(rid, E_NOT_OWNER, f"replica {rname} shard {shard} of {mname} is held by another "
                                                       f"live client (retry after {self.takeover_after:g}s of its silence)")))
            return
        if model is None:
            model = self.models[mname] = Model(mname, n)
        retain = msg.get("retain") or {}
        model.keep_latest = max(model.keep_latest, retain.get("keep_latest", 0))
        if rep is not None and (shard in rep.shards or (rep.formed and rep.kind != "offload")):
            # A shard re-opening (restart, failover) invalidates its whole old replica.
            self.rlog.info("reopen", "replica %s/%s re-registered: dropping the old instance", mname, rname)
            self._remove_replica(rep, now, out)
            rep = None
        if rep is None:
            rep = model.replicas[rname] = Replica(
                rname, model, n, msg.get("datacenter") or "default", bool(msg.get("spot", False)),
                msg.get("kind") or "normal", now,
            )
        hid = self._next_hid
        self._next_hid += 1
        if rep.kind == "offload":
            rep.formed = True  # offload replicas hold whichever shards had the last copy: no barrier
        h = Handle(hid, client, model, rep, shard, now, owner)
        self.owned[owner] = self.owned.get(owner, 0) + 1
        if rep.kind == "offload":
            model.offload_handles[h] = None
        rep.shards[shard] = h
        self.handles[hid] = h
        out.append((client, {"rid": rid, "ok": True, "h": hid, "epoch": self.epoch, "hb_timeout": self.hb_timeout}))
        if len(rep.shards) == rep.num_shards and not rep.formed:
            rep.formed = True
            queued, rep.barrier_queue = rep.barrier_queue, []
            for c, m in queued:
                out.extend(self.handle(c, m, now))

    def _close(self, h: Handle, rid: int, now: float, out: list[Reply]) -> None:
        self._leave_holders(h)
        if h.state == RECEIVING:
            self._release_src(h, now, out)
        h.closing = True
        h.state = DRAINING
        h.pending = (h.client, {"rid": rid, "ok": True})
        self._maybe_drained(h, now, out)
        self._reeval(h.model, now, out)

    def _drop(self, h: Handle, now: float, out: list[Reply]) -> None:
        """Forget a closed handle (its readers have drained)."""
        h.alive = False
        self._disown(h)
        self.handles.pop(h.hid, None)
        h.model.offload_handles.pop(h, None)
        rep = h.replica
        if rep.shards.get(h.shard) is h:
            del rep.shards[h.shard]
        self._gc_txns(rep, now, out)
        if not rep.shards and h.model.replicas.get(rep.name) is rep:
            self._forget_replica(rep, now, out)

    def _remove_replica(self, rep: Replica, now: float, out: list[Reply]) -> None:
        """Failure (or re-registration): drop every shard of the replica at once."""
        for h in list(rep.shards.values()):
            self._leave_holders(h)
            if h.state == RECEIVING or h.src is not None:
                self._release_src(h, now, out)
            h.alive = False
            h.pending = None
            self._disown(h)
            self.handles.pop(h.hid, None)
            h.model.offload_handles.pop(h, None)
        rep.shards.clear()
        self._forget_replica(rep, now, out)

    def _forget_replica(self, rep: Replica, now: float, out: list[Reply]) -> None:
        model = rep.model
        for k, txn in list(rep.txns.items()):
            for s, src in txn.sources.items():
                if s not in txn.consumed:
                    src.readers.pop((rep.name, s, k), None)
                    self._maybe_drained(src, now, out)
            model.pending.discard((rep.name, k))
        rep.txns.clear()
        for v in rep.seeding:
            model.seeders.get((v, rep.dc), set()).discard(rep.name)
        rep.seeding.clear()
        if model.replicas.get(rep.name) is rep:
            del model.replicas[rep.name]
        if not model.replicas and self.models.get(model.name) is model:
            del self.models[model.name]  # the name (and its shape) is free again
            return
        self._reeval(model, now, out)

    def _set_ref(self, h: Handle, ref: dict) -> None:
        size = ref_bytes(ref) if ref else 0
        self._charge(h, size - h.ref_bytes)
        h.ref = ref
        h.ref_bytes = size

    def _charge(self, h: Handle, delta: int) -> None:
        if delta:
            n = self.ref_bytes.get(h.owner, 0) + delta
            if n > 0:
                self.ref_bytes[h.owner] = n
            else:
                self.ref_bytes.pop(h.owner, None)
            self.ref_bytes_total += delta

    def _disown(self, h: Handle) -> None:
        self._charge(h, -h.ref_bytes)
        h.ref_bytes = 0
        n = self.owned.get(h.owner, 0) - 1
        if n > 0:
            self.owned[h.owner] = n
        else:
            self.owned.pop(h.owner, None)

    # ------------------------------------------------------------------ holders / reservations

    def _join_holders(self, h: Handle) -> None:
        per = h.model.holders.get(h.version)
        if per is None:
            per = h.model.holders[h.version] = [{} for _ in range(h.model.num_shards)]
        per[h.shard][h] = None

    def _leave_holders(self, h: Handle) -> None:
        per = h.model.holders.get(h.version)
        if per is not None:
            per[h.shard].pop(h, None)
            if not any(per):
                del h.model.holders[h.version]
                for s in range(h.model.num_shards):
                    h.model.checksums.pop((h.version, s), None)

    def _release_src(self, h: Handle, now: float, out: list[Reply]) -> None:
        src, key = h.src, h.src_key
        h.src = None
        h.src_key = None
        if src is not None and key is not None:
            src.readers.pop(key, None)
            self._maybe_drained(src, now, out)
        if h.seeding:
            h.seeding = False
            self._end_seeding(h.replica, h.version, now, out)

    def _end_seeding(self, rep: Replica, v: int | None, now: float, out: list[Reply]) -> None:
        if v in rep.seeding and not any(x.seeding and x.version == v for x in rep.shards.values()):
            rep.seeding.discard(v)
            s = rep.model.seeders.get((v, rep.dc))
            if s is not None:
                s.discard(rep.name)
                if not s:
                    del rep.model.seeders[(v, rep.dc)]

    def _blocking_readers(self, h: Handle) -> bool:
        """Readers that forbid mutating h's buffer: all of them, except readers of the version h is now receiving."""
        if h.state == RECEIVING:
            return any(v != h.version for v in h.readers.values())
        return bool(h.readers)

    def _maybe_drained(self, h: Handle, now: float, out: list[Reply]) -> None:
        if not h.alive or self._blocking_readers(h):
            return
        if h.state == DRAINING:
            if h.closing:
                self._drop(h, now, out)
            else:
                h.state = IDLE
                h.version = None
                h.complete = False
        if h.pending is not None:
            client, reply = h.pending
            h.pending = None
            out.append((client, reply))

    def _valid_source(self, src: Handle, key: ResKey, v: int) -> bool:
        if not src.alive or key not in src.readers or src.version != v:
            return False
        return src.state in (PUBLISHED, RECEIVING) or (src.state == DRAINING and src.complete)

    def _pick(self, model: Model, v: int, shard: int, rep: Replica, now: float, exclude: Handle | None = None) -> Handle | None:
        """Least-loaded eligible holder of (v, shard), same datacenter first (None if none anywhere)."""
        per = model.holders.get(v)
        if per is None:
            return None
        best = None
        best_key = None
        dc = rep.dc
        for c in per[shard]:
            if c.replica is rep or c is exclude or c.suspect_until > now or c.seeding:
                continue
            if not self.pipeline and c.state != PUBLISHED:
                continue
            k = (c.replica.dc != dc, len(c.readers), c.state != PUBLISHED)
            if k == (False, 0, False):
                return c  # an idle, complete, same-datacenter copy: nothing beats it
            if best_key is None or k < best_key:
                best, best_key = c, k
        return best

    def _available(self, model: Model, v: int) -> bool:
        per = model.holders.get(v)
        return per is not None and all(any(not c.seeding for c in s) for s in per)

    def _retained(self, model: Model) -> set[int]:
        if model.keep_latest <= 0 or not model.announced:
            return _NO_VERSIONS
        key = (model.keep_latest, len(model.announced), max(model.announced))
        if model.retained_key != key:
            model.retained_key = key
            model.retained = frozenset(sorted(model.announced)[-model.keep_latest:])
        return model.retained

    # ------------------------------------------------------------------ publish / unpublish

    def _publish(self, h: Handle, msg: dict, rid: int, now: float, out: list[Reply]) -> None:
        v = msg["version"]
        if h.state == PUBLISHED and h.version == v:
            if msg.get("ref"):
                self._set_ref(h, msg["ref"])
            out.append((h.client, {"rid": rid, "ok": True}))
            return
        if h.state != IDLE:
            out.append((h.client, _err(rid, E_STATE, f"publish({v}) while {STATE_NAMES[h.state]} version {h.version}: unpublish first")))
            return
        h.state = PUBLISHED
        h.version = v
        h.complete = True
        self._set_ref(h, msg.get("ref") or {})
        self._join_holders(h)
        cks = msg.get("checksum")
        if cks is not None:
            # packed once: every replicate reply of this version carries the list
            h.model.checksums.setdefault((v, h.shard), PackedList(cks) if type(cks) is list else cks)
        out.append((h.client, {"rid": rid, "ok": True}))
        self._on_new_copy(h, now, out)

    def _on_new_copy(self, h: Handle, now: float, out: list[Reply]) -> None:
        model = h.model
        v = h.version
        new_version = v not in model.announced
        if new_version:
            model.announced.add(v)
            if len(model.announced) > 256:
                model.announced.discard(min(model.announced))
        if v not in model.ever and self._available(model, v):
            model.ever.add(v)
            if len(model.ever) > 256:
                model.ever.discard(min(model.ever))
        retained = self._retained(model)
        if h.replica.kind != "offload" and not h.replica.spot:
            self._release_offloads(model, v, h.shard, out)
        if new_version:
            for ov in [x for x in model.holders if x not in retained and x < v]:
                for s in range(model.num_shards):
                    self._release_offloads(model, ov, s, out)
        self._reeval(model, now, out)

    def _release_offloads(self, model: Model, v: int, shard: int, out: list[Reply]) -> None:
        # walk the few offload handles, not every holder: a publish must not cost O(replicas)
        if not model.offload_handles:
            return
        per = model.holders.get(v)
        if per is None:
            return
        holders = per[shard]
        for c in [c for c in holders if c in model.offload_handles] if len(holders) < len(model.offload_handles) else [
            c for c in model.offload_handles if c in holders
        ]:
            if c.replica.kind == "offload" and c.state == PUBLISHED and not c.closing:
                out.append((c.client, {"ev": "release", "h": c.hid, "version": v}))

    def _last_retained_copy(self, h: Handle) -> bool:
        """h (non-spot) holds the only non-spot published copy of its shard of a retained version."""
        if h.replica.spot or h.version not in self._retained(h.model):
            return False
        per = h.model.holders.get(h.version)
        for c in per[h.shard] if per else ():
            if c.replica is not h.replica and c.state == PUBLISHED and not c.replica.spot:
                return False
        return True

    def _unpublish(self, h: Handle, rid: int, now: float, out: list[Reply]) -> None:
        if h.state == IDLE:
            out.append((h.client, {"rid": rid, "ok": True}))
            return
        if h.state != PUBLISHED:
            out.append((h.client, _err(rid, E_STATE, f"unpublish while {STATE_NAMES[h.state]}")))
            return
        model = h.model
        v = h.version
        if self._last_retained_copy(h):
            if h.replica.kind == "offload":  # still the last copy: keep serving it
                out.append((h.client, {"rid": rid, "ok": False, "err": "retained", "keep": True, "msg": f"last copy of retained version {v}"}))
            else:
                out.append((h.client, {"rid": rid, "ok": True, "offload": True, "version": v}))
            return
        self._leave_holders(h)
        h.state = DRAINING
        h.pending = (h.client, {"rid": rid, "ok": True})
        self._maybe_drained(h, now, out)
        self._reeval(model, now, out)

    # ------------------------------------------------------------------ transactions

    def _txn_call(self, h: Handle, op: str, msg: dict, rid: int, now: float, out: list[Reply]) -> None:
        rep = h.replica
        retry = msg.get("txn")
        if retry is not None:  # re-issue of call `retry` after an offload
            txn = rep.txns.get(retry)
            if txn is None or txn.op != op or not txn.decided or h.shard in txn.consumed:
                out.append((h.client, _err(rid, E_TXN, f"no pending call {retry} to resume")))
                return
            self._consume(h, retry, txn, rid, msg, now, out)
            return
        k = h.seq
        h.seq += 1
        txn = rep.txns.get(k)
        if txn is None:
            # validate() bounded the timeout (finite, >= 0): computing the deadline cannot fail
            deadline = now + float(msg.get("timeout", 30.0)) if op == "wait" else None
            txn = rep.txns[k] = Txn(op, msg, h.shard, deadline=deadline)
            self._try_decide(rep, k, txn, now, out)
            if not txn.decided:
                rep.model.pending.add((rep.name, k))
        elif txn.op != op:
            self.rlog.warning("txn", "replica %s shard %d: txn %d is %s, got %s", rep.name, h.shard, k, txn.op, op)
            txn.consumed.add(h.shard)
            out.append((h.client, _err(rid, E_TXN, f"call {k} of this replica is {txn.op}, not {op}")))
            self._gc_txns(rep, now, out)
            return
        if txn.decided:
            self._consume(h, k, txn, rid, msg, now, out)
        else:
            txn.waiters[h.shard] = (h, rid, msg)

    def _try_decide(self, rep: Replica, k: int, txn: Txn, now: float, out: list[Reply]) -> None:
        model = rep.model
        op = txn.op
        if op == "list":
            self._decided(rep, k, txn, {"ok": True, **self._list(model)}, now, out)
            return
        if op == "wait":
            if self._pred(model, txn.args["pred"]):
                self._decided(rep, k, txn, {"ok": True, "met": True}, now, out)
            return
        decider = rep.shards.get(txn.decider)
        if op == "replicate":
            kind, val = parse_version(txn.args["version"])
            avail = sorted(v for v in model.holders if self._available(model, v))
            if kind == "rel":
                if not avail:
                    return  # wait for a first version
                v = avail[-1] - val
            else:
                v = val
            if decider is not None and decider.state == PUBLISHED and decider.version == v:
                self._decided(rep, k, txn, {"ok": True, "have": True, "version": v}, now, out)
                return
            if v not in avail:
                if v in model.ever or (kind == "rel") or (model.ever and v < min(model.ever)):
                    self._decided(rep, k, txn, _err(0, E_UNAVAILABLE, f"version {v} is no longer available"), now, out)
                return  # not published yet: wait
            plan = self._plan(rep, v, now)
            if plan is None:
                return  # smart skipping: a seeding replica is filling our datacenter
            self._go(rep, k, txn, v, plan, now, out)
            return
        if op == "update":
            cur = decider.version if decider is not None and decider.state == PUBLISHED else None
            for v in sorted((x for x in model.holders if self._available(model, x)), reverse=True):
                if cur is not None and v <= cur:
                    break
                plan = self._plan(rep, v, now)
                if plan is not None:
                    self._go(rep, k, txn, v, plan, now, out)
                    return
            self._decided(rep, k, txn, {"ok": True, "noop": True, "version": cur}, now, out)

    def _plan(self, rep: Replica, v: int, now: float) -> tuple[dict, bool] | None:
        """Pick a source per shard. Returns (sources, cross_dc) or None to skip (someone seeds our DC)."""
        model = rep.model
        srcs = {}
        remote = False
        for s in range(rep.num_shards):
            c = self._pick(model, v, s, rep, now)
            if c is None:
                return None
            if c.replica.dc != rep.dc:
                remote = True
            srcs[s] = c
        if remote:
            seeders = model.seeders.get((v, rep.dc))
            if seeders and rep.name not in seeders:
                return None
        return srcs, remote

    def _go(self, rep: Replica, k: int, txn: Txn, v: int, plan: tuple[dict, bool], now: float, out: list[Reply]) -> None:
        srcs, remote = plan
        txn.sources = srcs
        for s, src in srcs.items():
            src.readers[(rep.name, s, k)] = v
        if remote:
            rep.seeding.add(v)
            rep.model.seeders.setdefault((v, rep.dc), set()).add(rep.name)
        self._decided(rep, k, txn, {"ok": True, "version": v, "cross_dc": remote}, now, out)

    def _decided(self, rep: Replica, k: int, txn: Txn, result: dict, now: float, out: list[Reply]) -> None:
        txn.decided = True
        txn.result = result
        rep.model.pending.discard((rep.name, k))
        waiters, txn.waiters = txn.waiters, {}
        for _s, (h, rid, msg) in waiters.items():
            if h.alive:
                self._consume(h, k, txn, rid, msg, now, out)

    def _consume(self, h: Handle, k: int, txn: Txn, rid: int, msg: dict, now: float, out: list[Reply]) -> None:
        rep = h.replica
        res = txn.result
        assert res is not None
        txn.consumed.add(h.shard)
        src = txn.sources.get(h.shard)
        if txn.op in ("replicate", "update") and "cross_dc" in res:
            v = res["version"]
            key = (rep.name, h.shard, k)
            if h.state == PUBLISHED and h.version == v:
                if src is not None:
                    src.readers.pop(key, None)
                    self._maybe_drained(src, now, out)
                out.append((h.client, {"rid": rid, "ok": True, "have": True, "version": v}))
                self._gc_txns(rep, now, out)
                return
            if h.state in (RECEIVING, DRAINING):
                if src is not None:
                    src.readers.pop(key, None)
                    self._maybe_drained(src, now, out)
                out.append((h.client, _err(rid, E_STATE, f"{txn.op} while {STATE_NAMES[h.state]}")))
                self._gc_txns(rep, now, out)
                return
            if h.state == PUBLISHED and self._last_retained_copy(h):
                # Overwriting the last copy of a retained version: offload it first, then resume call k.
                txn.consumed.discard(h.shard)
                out.append((h.client, {"rid": rid, "ok": True, "offload": True, "version": h.version, "txn": k}))
                return
            if src is None or not self._valid_source(src, key, v):
                if src is not None:
                    src.readers.pop(key, None)
                    self._maybe_drained(src, now, out)
                src = self._pick(h.model, v, h.shard, rep, now)
                if src is None:
                    out.append((h.client, _err(rid, E_UNAVAILABLE, f"version {v}: no source left for shard {h.shard}")))
                    self._gc_txns(rep, now, out)
                    return
                src.readers[key] = v
            # Revoke the old version: not a source any more; the reply waits for its readers.
            if h.state == PUBLISHED:
                self._leave_holders(h)
            h.state = RECEIVING
            h.version = v
            h.complete = False
            self._set_ref(h, msg.get("ref") or {})
            h.src = src
            h.src_key = key
            h.seeding = src.replica.dc != rep.dc
            if h.seeding:
                rep.seeding.add(v)
                h.model.seeders.setdefault((v, rep.dc), set()).add(rep.name)
            self._join_holders(h)
            reply = {"rid": rid, "ok": True, "version": v, "src": self._src_info(src, rep), "cross_dc": h.seeding,
                     "checksum": h.model.checksums.get((v, h.shard))}
            self._tell_serving(src, v, out)
            h.pending = (h.client, reply)
            self._maybe_drained(h, now, out)
            self._gc_txns(rep, now, out)
            self._reeval(h.model, now, out)
            return
        reply = dict(res)
        reply["rid"] = rid
        out.append((h.client, reply))
        self._gc_txns(rep, now, out)

    def _gc_txns(self, rep: Replica, now: float, out: list[Reply]) -> None:
        live = len(rep.shards)
        for k in [k for k, t in rep.txns.items() if t.decided and len(t.consumed) >= max(live, 1)]:
            t = rep.txns.pop(k)
            for s, src in t.sources.items():
                if s not in t.consumed:
                    src.readers.pop((rep.name, s, k), None)
                    self._maybe_drained(src, now, out)

    @staticmethod
    def _src_info(src: Handle, rep: Replica) -> dict:
        return {
            "h": src.hid,
            "ref": src.ref,
            "partial": src.state == RECEIVING,
            "replica": src.replica.name,
            "dc": src.replica.dc,
        }

    def _reeval(self, model: Model, now: float, out: list[Reply]) -> None:
        if not model.pending:
            return
        for rname, k in sorted(model.pending):
            rep = model.replicas.get(rname)
            txn = rep.txns.get(k) if rep else None
            if txn is None:
                model.pending.discard((rname, k))
                continue
            if not txn.decided:
                self._try_decide(rep, k, txn, now, out)

    # ------------------------------------------------------------------ transfers

    def _progress(self, h: Handle, msg: dict, rid: int, now: float, out: list[Reply]) -> None:
        if h.state != RECEIVING:
            out.append((h.client, _err(rid, E_STATE, f"progress while {STATE_NAMES[h.state]}")))
            return
        failed = msg.get("failed", False) or msg.get("corrupt", False)
        src = h.src
        key = h.src_key
        v = h.version
        if src is not None and key is not None and not failed and self._valid_source(src, key, v):
            out.append((h.client, {"rid": rid, "ok": True}))
            return
        if src is not None and failed:
            src.suspect_until = now + self.suspect_s
            self.rlog.info("src-failed", "handle %d reports source %d failed (%s)", h.hid, src.hid,
                           "corrupt" if msg.get("corrupt") else "io")
        was_seeding = h.seeding
        if src is not None and key is not None:
            src.readers.pop(key, None)
            self._maybe_drained(src, now, out)
        h.src = None
        new = self._pick(h.model, v, h.shard, h.replica, now, exclude=src)
        if new is None:
            per = h.model.holders.get(v)
            if per is None or not any(c is not h for c in per[h.shard]):
                self._abort_receive(h, (h.client, _err(rid, E_UNAVAILABLE, f"version {v}: no source left for shard {h.shard}")), now, out)
            else:
                out.append((h.client, {"rid": rid, "ok": True, "retry": True}))
            return
        key = key or (h.replica.name, h.shard, -h.hid)
        new.readers[key] = v
        h.src = new
        h.src_key = key
        h.seeding = new.replica.dc != h.replica.dc
        if was_seeding and not h.seeding:
            self._end_seeding(h.replica, v, now, out)
        out.append((h.client, {"rid": rid, "ok": True, "src": self._src_info(new, h.replica), "cross_dc": h.seeding}))
        self._tell_serving(new, v, out)

    @staticmethod
    def _tell_serving(src: Handle, v: int, out: list[Reply]) -> None:
        """A reader was routed to src's still-receiving copy of v (pipeline replication): src's own pull
        may then keep the progress word that reader waits on close behind its landed bytes."""
        if src.state == RECEIVING and src.version == v:
            out.append((src.client, {"ev": "serving", "h": src.hid, "version": v}))

    def _abort_receive(self, h: Handle, reply: tuple[Any, dict] | None, now: float, out: list[Reply]) -> None:
        """h stops receiving; its reply (if any) waits until pipeline readers of its buffer are re-routed."""
        self._leave_holders(h)
        self._release_src(h, now, out)
        h.state = DRAINING
        h.complete = False
        h.pending = reply
        self._maybe_drained(h, now, out)
        self._reeval(h.model, now, out)

    def _replicate_done(self, h: Handle, ok: bool, rid: int, now: float, out: list[Reply]) -> None:
        if h.state != RECEIVING:
            out.append((h.client, _err(rid, E_STATE, f"replicate_done while {STATE_NAMES[h.state]}")))
            return
        if not ok:
            self._abort_receive(h, (h.client, {"rid": rid, "ok": True}), now, out)
            return
        was_seeding = h.seeding
        self._release_src(h, now, out)
        if was_seeding:
            self._leave_holders(h)
        h.state = PUBLISHED
        h.complete = True
        self._join_holders(h)
        out.append((h.client, {"rid": rid, "ok": True, "version": h.version}))
        self._on_new_copy(h, now, out)

    # ------------------------------------------------------------------ queries

    def _list(self, model: Model) -> dict:
        versions = {}
        for v, per in model.holders.items():
            complete = {}
            receiving = 0
            for s in per:
                for c in s:
                    if c.state == PUBLISHED:
                        complete[c.replica.name] = complete.get(c.replica.name, 0) + 1
                    else:
                        receiving += 1
            full = sum(1 for n in complete.values() if n == model.num_shards)
            versions[v] = {"replicas": full, "receiving_shards": receiving, "available": self._available(model, v)}
        avail = [v for v, d in versions.items() if d["available"]]
        return {
            "model": model.name,
            "num_shards": model.num_shards,
            "versions": versions,
            "latest": max(avail) if avail else None,
            "retained": sorted(self._retained(model)),
            "replicas": len(model.replicas),
        }

    def _pred(self, model: Model, pred: dict) -> bool:
        ((name, arg),) = pred.items()
        if name == "version_at_least":
            return any(v >= arg and self._available(model, v) for v in model.holders)
        if name == "version_available":
            return self._available(model, arg)
        if name == "version_gone":
            return arg not in model.holders
        if name == "replicas_at_least":
            v, n = arg
            per = model.holders.get(v)
            if per is None:
                return False
            counts: dict[str, int] = {}
            for c in per[0]:
                if c.state == PUBLISHED:
                    counts[c.replica.name] = 1
            full = [r for r in counts if all(any(c.replica.name == r and c.state == PUBLISHED for c in s) for s in per)]
            return len(full) >= n
        return False

    def stats(self) -> dict:
        extra = self.stats_hook() if self.stats_hook is not None else {}
        return {
            **extra,
            "epoch": self.epoch,
            "models": len(self.models),
            "handles": len(self.handles),
            "owners": len(self.owned),
            "ops": self.ops,
            "errors": self.errors,
            "failures": self.failures,
        }

    # ------------------------------------------------------------------ introspection for tests

    def check_invariants(self) -> None:
        """Internal consistency (tests call this after every step)."""
        for h in self.handles.values():
            assert h.alive
            if h.state in (PUBLISHED, RECEIVING) and not h.seeding:
                per = h.model.holders.get(h.version)
                assert per is not None and h in per[h.shard], f"handle {h.hid} missing from holders"
            if h.state == IDLE:
                assert not h.readers, f"idle handle {h.hid} has readers"
        owned: dict[Any, int] = {}
        for h in self.handles.values():
            owned[h.owner] = owned.get(h.owner, 0) + 1
            assert self.models.get(h.model.name) is h.model, f"handle {h.hid} of a forgotten model"
            assert h.replica.model.replicas.get(h.replica.name) is h.replica, f"handle {h.hid} of a forgotten replica"
        assert owned == self.owned, "per-owner handle counts drifted"
        refs: dict[Any, int] = {}
        for h in self.handles.values():
            if h.ref_bytes:
                refs[h.owner] = refs.get(h.owner, 0) + h.ref_bytes
        assert refs == self.ref_bytes and sum(refs.values()) == self.ref_bytes_total, "reference byte counts drifted"
        for model in self.models.values():
            assert model.replicas, f"model {model.name} has no replica but was kept"
            for rname, k in model.pending:
                rep = model.replicas.get(rname)
                txn = rep.txns.get(k) if rep else None
                assert txn is not None and not txn.decided, f"pending ({rname}, {k}) is not an undecided txn"
                assert txn.op != "wait" or txn.deadline is not None, "a wait without a deadline"
            for v, per in model.holders.items():
                for s in per:
                    for c in s:
                        assert c.alive and c.version == v and c.state in (PUBLISHED, RECEIVING), (v, c.hid, c.state)


_NO_VERSIONS: frozenset = frozenset()
_EMPTY_LIST = {"versions": {}, "latest": None, "retained": [], "replicas": 0}


def _owner(client: Any, msg: dict) -> Any:
    cid = msg.get("cid")
    return ("cid", cid.encode() if isinstance(cid, str) else cid) if cid is not None else ("conn", client)


def _err(rid: int, code: str, msg: str) -> dict:
    return {"rid": rid, "ok": False, "err": code, "msg": msg}


__all__ = ["ServerState", "Handle", "Replica", "Model", "IDLE", "PUBLISHED", "RECEIVING", "DRAINING", "E_BAD_MESSAGE"]
