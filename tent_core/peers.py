"""The peer directory: remote engines, their segments, and the routes (connected transports) to them.

`PeerDirectory` answers the submit path's questions about a remote segment name: which peer
(fetched once over the peer's control port with ``describe``, then cached), which registered
remote buffers an offset range covers and whether the request may touch them (`map_remote`), how
a class of requests is routed (`plan`: a `routing.Decision` or `StagedPath`, cached per peer), and
which connected `Route` serves a Decision (`route`: connects lazily, rails acquired from
`tent_core.rails`). Routing choices themselves are the Router's; this module holds the state.

Where a peer's description comes from: by default its own control port (the peer is named by that
port, ``host:port``); with a cluster directory (`use_directory`, ``[directory]`` in the config) the
directory, where engines publish themselves under fixed names (`tent_core.directory`).

Peer lifecycle: each peer carries a `liveness.PeerLiveness`. When a slice runs out of every path,
recovery tells it; nothing in flight is disturbed. `check` (run by the engine's peer watch, never on
the submit path) probes the peer's control endpoint: a refused connection means the process is gone
(the peer is DEAD: new requests fail at once with the reason, `resolve` says so); an answer re-reads
its description: the same process keeps its routes (dead transports are given another chance), a
restarted process (new pid or new transport endpoints) replaces the peer and retires the old one's
routes. A dead peer is used again as soon as a check is answered.
"""

from __future__ import annotations

import bisect
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import errors
from .config import PeerConfig, SchedulerConfig
from .liveness import CheckResult, PeerLiveness
from .metadata import ControlClient
from .policy_rules import RequestTraits, Rule
from .rail_monitor import RailMonitor
from .rails import RAILS, Rail
from .request import parse_segment_name
from .routing import Decision, Path, Router
from .transport import Transport
from .types import MemoryKind, OpCode, PeerInfo, PeerLink, Permission

if TYPE_CHECKING:
    from .directory import EngineDirectory

log = logging.getLogger(__name__)

_PERM_READ, _PERM_WRITE = int(Permission.READ), int(Permission.WRITE)
_REMOTE_CACHE_MAX = 65536


@dataclass
class RemoteBuffer:
    offset: int
    addr: int
    length: int
    perm: int  # Permission bits as a plain int: checked on every request
    kind: MemoryKind
    desc: dict[str, Any]
    # transports that cannot serve this buffer, so plans for it leave them out: those whose descriptor
    # marks the buffer as local to its process ({"local": true}: e.g. a READ-only CUDA buffer nvlink
    # does not share over IPC; another process routes around them) and those in `unreachable`
    hidden: frozenset[str] = frozenset()
    # transport -> why it can never reach this buffer (Transport.buffer_unreachable): the error text
    # when no transport is left
    unreachable: Mapping[str, str] = field(default_factory=dict)

    def view(self) -> dict[str, Any]:
        """The buffer as Transport.buffer_unreachable() sees it (an entry of the peer's description)."""
        return {"offset": self.offset, "addr": self.addr, "length": self.length, "perm": self.perm,
                "kind": self.kind.value, "desc": self.desc}

    def where(self, engine_id: str) -> str:
        return f"{engine_id} buffer {self.addr:#x} ({self.length} bytes at segment offset {self.offset})"


@dataclass(eq=False)
class Route:
    """One connected transport to one peer, with its rails."""

    transport: Transport
    link: PeerLink
    rails: list[Rail]
    indices: list[int] = field(default_factory=list)  # rail.info.index of each rail, for rule filters

    def __post_init__(self) -> None:
        self.indices = [r.info.index for r in self.rails]


@dataclass(eq=False)
class Peer:
    engine_id: str
    info: PeerInfo
    client: ControlClient | None
    same_host: bool
    reachable: tuple[str, ...]  # our transports that can talk to this peer
    segments: dict[str, list[RemoteBuffer]] = field(default_factory=dict)
    starts: dict[str, list[int]] = field(default_factory=dict)
    raw_buffers: list[dict[str, Any]] = field(default_factory=list)
    epochs: dict[str, int] = field(default_factory=dict)  # segment -> the peer's epoch we read it at
    routes: dict[str, Route] = field(default_factory=dict)
    plans: dict[tuple[Any, ...], Path] = field(default_factory=dict)
    dead_transports: set[str] = field(default_factory=set)
    connect_errors: dict[str, str] = field(default_factory=dict)  # why a transport could not connect
    liveness: PeerLiveness = field(default=None)  # type: ignore[assignment]  # set by PeerDirectory
    retired: bool = False
    restarted: bool = False  # retired because a new process answers under this engine id
    lock: threading.RLock = field(default_factory=threading.RLock)
    # held from a describe's request to the application of its reply: two threads re-reading the
    # peer at once (staged workers meeting the same new staging slots) must not apply their replies
    # out of order, or the older view (an incremental part, a table without the newest buffers)
    # replaces the newer one and buffers both read vanish from the map
    refresh_lock: threading.RLock = field(default_factory=threading.RLock)
    # transport -> why it cannot serve a given remote buffer (PeerDirectory._judge); None: all can
    judge: Callable[[RemoteBuffer], dict[str, str]] | None = None

    def __post_init__(self) -> None:
        if self.liveness is None:
            self.liveness = PeerLiveness(self.engine_id)

    def load_segments(self, segments: Mapping[str, list[dict[str, Any]]], epochs: Mapping[str, int] | None = None) -> None:
        seg_map: dict[str, list[RemoteBuffer]] = {}
        starts: dict[str, list[int]] = {}
        raw: list[dict[str, Any]] = []
        other_process = self.info.pid != os.getpid()
        for name, bufs in segments.items():
            rb = _remote_buffers(bufs, other_process, self.judge)
            seg_map[name] = rb
            starts[name] = [r.offset for r in rb]
            raw.extend(dict(b, segment=name) for b in bufs)
        self.segments, self.starts, self.raw_buffers = seg_map, starts, raw
        self.epochs = {k: int(v) for k, v in (epochs or {}).items() if k in seg_map}

    def update_segment(self, name: str, part: Mapping[str, Any]) -> None:
        """Apply the peer's answer to a one-segment describe (`LocalSegments.describe_segment`):
        gone, its buffers registered since (appended), or all of them. Every list touched is a new
        object, so readers holding the old ones see a consistent (older) view."""
        if not part.get("found"):
            self.segments.pop(name, None)
            self.starts.pop(name, None)
            self.epochs.pop(name, None)
            self.raw_buffers = [b for b in self.raw_buffers if b.get("segment") != name]
            return
        new = _remote_buffers(part["buffers"], self.info.pid != os.getpid(), self.judge)
        raw_new = [dict(b, segment=name) for b in part["buffers"]]
        old = self.segments.get(name)
        if part.get("incremental") and old is not None and (not new or not old or new[0].offset > old[-1].offset):
            bufs, raw = old + new, self.raw_buffers + raw_new
        else:
            bufs, raw = new, [b for b in self.raw_buffers if b.get("segment") != name] + raw_new
        self.segments[name] = bufs
        self.starts[name] = [r.offset for r in bufs]
        self.raw_buffers = raw
        self.epochs[name] = int(part["epoch"])


def _remote_buffers(bufs: list[dict[str, Any]], other_process: bool,
                    judge: Callable[[RemoteBuffer], dict[str, str]] | None = None) -> list[RemoteBuffer]:
    out = sorted(
        (
            RemoteBuffer(int(b["offset"]), int(b["addr"]), int(b["length"]), int(b["perm"]), MemoryKind(b["kind"]), b["desc"],
                         _hidden(b["desc"]) if other_process else frozenset())
            for b in bufs
        ),
        key=lambda r: r.offset,
    )
    if judge is not None:
        for rb in out:
            why = judge(rb)
            if why:
                rb.unreachable = why
                rb.hidden = rb.hidden | frozenset(why)
    return out


def _hidden(desc: Any) -> frozenset[str]:
    if not isinstance(desc, Mapping):
        return frozenset()
    return frozenset(t for t, d in desc.items() if isinstance(d, Mapping) and d.get("local"))


def _identity(desc: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes when the process behind an engine id restarts."""
    return (desc.get("host_id"), desc.get("pid"), repr(sorted((desc.get("transports") or {}).items())))


class PeerDirectory:
    """Peers of one engine (including the engine itself, for staged paths' local legs)."""

    def __init__(
        self,
        engine_id: str,
        host_id: str,
        transports: Mapping[str, Transport],
        router: Router,
        describe_self: Callable[[], dict[str, Any]],
        monitor: RailMonitor,
        *,
        control_timeout_s: float,
        scheduler: SchedulerConfig | None = None,
        peer_config: PeerConfig | None = None,
        control_client: Callable[[str], ControlClient] | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.host_id = host_id
        self._transports = transports
        self._router = router
        self._describe_self = describe_self
        self._monitor = monitor
        self._control_timeout_s = control_timeout_s
        self._scheduler = scheduler
        self._peer_config = peer_config or PeerConfig()
        # how to reach a peer's control port (the engine passes its auth and bounds)
        self.control_client: Callable[[str], ControlClient] = control_client or ControlClient
        self._lock = threading.RLock()
        self._peers: dict[str, Peer] = {}
        self._remote_cache: dict[str, tuple[Peer, str]] = {}
        # called whenever what a cached plan relies on changes (a peer's buffers, routes, dead
        # transports, suspicion): the engine's plan cache drops its entries
        self.on_change: Callable[[], None] = lambda: None
        self.directory: EngineDirectory | None = None  # peers are described by the directory, not their port

    def use_directory(self, directory: EngineDirectory) -> None:
        """Resolve every peer name through `directory` from now on (it is closed with this object)."""
        self.directory = directory

    # ---- lookup --------------------------------------------------------------------------------

    def peers(self) -> list[Peer]:
        return list(self._peers.values())

    def lookup(self, engine_id: str) -> Peer | None:
        """The known peer, without contacting anyone."""
        return self._peers.get(engine_id)

    def resolve(self, remote: str, timeout: float) -> tuple[Peer, str]:
        """'host:port/segment' -> (peer, segment name). A peer known to be dead fails at once."""
        target = self._remote_cache.get(remote)
        if target is not None and not target[0].retired:
            self._fail_if_dead(target[0])
            return target
        engine_id, seg = parse_segment_name(remote)
        peer = self.get(engine_id, timeout)
        if len(self._remote_cache) < _REMOTE_CACHE_MAX or remote in self._remote_cache:
            self._remote_cache[remote] = (peer, seg)
        return peer, seg

    @staticmethod
    def _fail_if_dead(peer: Peer) -> None:
        if peer.liveness.dead:
            with peer.lock:
                why = peer.liveness.fail_fast(time.monotonic())
            if why:
                raise errors.PeerUnreachableError(why)

    def get(self, engine_id: str, timeout: float | None = None) -> Peer:
        timeout = self._control_timeout_s if timeout is None else timeout
        peer = self._peers.get(engine_id)
        if peer is None:
            fetched = self._fetch(engine_id, timeout)
            with self._lock:
                peer = self._peers.setdefault(engine_id, fetched)
            if peer is not fetched and fetched.client is not None:
                fetched.client.close()  # another thread won the race
        else:
            self._fail_if_dead(peer)
        return peer

    def _describe(self, engine_id: str, client: ControlClient | None, timeout: float) -> dict[str, Any]:
        if engine_id == self.engine_id:
            return self._describe_self()
        if self.directory is not None:
            return self.directory.describe_peer(engine_id)
        assert client is not None
        desc = client.call({"op": "describe"}, timeout)
        if not desc.get("ok"):
            raise errors.PeerUnreachableError(f"engine {engine_id} refused describe: {desc.get('error')}")
        return desc

    def _fetch(self, engine_id: str, timeout: float, client: ControlClient | None = None) -> Peer:
        if client is None and engine_id != self.engine_id and self.directory is None:
            client = self.control_client(engine_id)
            try:
                desc = self._describe(engine_id, client, timeout)
            except BaseException:
                client.close()
                raise
        else:
            desc = self._describe(engine_id, client, timeout)
        return self._build(engine_id, desc, client)

    def _build(self, engine_id: str, desc: Mapping[str, Any], client: ControlClient | None) -> Peer:
        info = PeerInfo(engine_id, str(desc["host_id"]), int(desc["pid"]), dict(desc["transports"]),
                        dict(desc.get("staging") or {}))
        reachable = tuple(n for n, t in self._transports.items() if t.can_reach(info) is None)
        peer = Peer(engine_id, info, client, desc["host_id"] == self.host_id, reachable,
                    liveness=PeerLiveness(engine_id, self._peer_config))  # fmt: skip
        if any(self._judges(n) for n in reachable):
            peer.judge = lambda rb, p=peer: self._judge(p, rb)
        peer.load_segments(desc["segments"], desc.get("epochs"))
        return peer

    def refresh(self, engine_id: str, timeout: float | None = None) -> Peer:
        """Re-read a peer's segments (it registered new memory) and hand them to its routes."""
        timeout = self._control_timeout_s if timeout is None else timeout
        peer = self.get(engine_id, timeout)
        with peer.refresh_lock:
            desc = self._describe(engine_id, peer.client, timeout)
            with peer.lock:
                peer.load_segments(desc["segments"], desc.get("epochs"))
                self.on_change()
                for r in peer.routes.values():
                    r.transport.connect(peer.info, peer.raw_buffers)
        return peer

    def refresh_segment(self, peer: Peer, seg: str, timeout: float | None = None) -> Peer:
        """Re-read one segment of a peer: only the buffers it registered since we read it (when none
        left the segment meanwhile), so the cost does not grow with the buffers it already holds."""
        timeout = self._control_timeout_s if timeout is None else timeout
        peer = self.get(peer.engine_id, timeout)
        if peer.client is None:
            return self.refresh(peer.engine_id, timeout)
        with peer.refresh_lock:  # what we know and the reply to it are applied together
            known = peer.segments.get(seg)
            msg = {"op": "describe", "segment": seg, "epoch": peer.epochs.get(seg, 0) if known else 0,
                   "from_offset": known[-1].offset + 1 if known else 0}
            part = peer.client.call(msg, timeout)
            if not part.get("ok"):
                raise errors.PeerUnreachableError(f"engine {peer.engine_id} refused describe: {part.get('error')}")
            with peer.lock:
                if "found" not in part:  # a peer that only knows the whole-table describe answered with it
                    peer.load_segments(part["segments"], part.get("epochs"))
                else:
                    peer.update_segment(seg, part)
                self.on_change()
                for r in peer.routes.values():
                    r.transport.connect(peer.info, peer.raw_buffers)
        return peer

    def buffers(self, engine_id: str, refresh: bool = False) -> list[dict[str, Any]]:
        """A peer's registered buffers as its description lists them (``segment``, ``offset``,
        ``addr``, ``length``, ``perm``, ``kind``); `refresh` re-reads an already known peer first."""
        known = engine_id in self._peers
        peer = self.refresh(engine_id) if refresh and known else self.get(engine_id)
        keys = ("segment", "offset", "addr", "length", "perm", "kind")
        return [{k: b[k] for k in keys} for b in peer.raw_buffers]

    def ping(self, engine_id: str, timeout: float | None = None) -> float:
        """Round trip (seconds) to a peer's control port, found through the directory when there is
        one. Raises PeerUnreachableError when the peer is unknown or does not answer."""
        timeout = self._control_timeout_s if timeout is None else timeout
        if engine_id == self.engine_id:
            return 0.0
        endpoint = engine_id
        if self.directory is not None:
            endpoint = str(self.directory.describe_peer(engine_id).get("control") or "")
            if not endpoint:
                raise errors.PeerUnreachableError(f"the directory has no control endpoint for {engine_id!r}")
        client = self.control_client(endpoint)
        try:
            t0 = time.monotonic()
            rep = client.call({"op": "ping"}, timeout)
            if not rep.get("ok"):
                raise errors.PeerUnreachableError(f"engine {engine_id} refused ping: {rep.get('error')}")
            return time.monotonic() - t0
        finally:
            client.close()

    # ---- liveness checks, restart, forgetting ----------------------------------------------------

    def check(self, peer: Peer, timeout: float) -> tuple[CheckResult, str]:
        """Probe a peer whose paths fail (blocking, bounded by `timeout` per step; the engine's peer
        watch calls it, never the submit path): a TCP connect to its control endpoint (refused = the
        process is gone), then a describe (with a directory: the directory's entry, and a ping of
        the control port). An answer re-reads the peer: the same process gets its transports back,
        a restarted one replaces it (see the module docstring)."""
        if peer.engine_id == self.engine_id:
            return CheckResult.ANSWERED, "this engine"
        with peer.refresh_lock:  # the description read here must not overtake a newer one (see Peer)
            return self._check(peer, timeout)

    def _check(self, peer: Peer, timeout: float) -> tuple[CheckResult, str]:
        t0 = time.monotonic()
        endpoint = peer.engine_id
        listed: dict[str, Any] | None = None
        if self.directory is not None:
            try:
                listed = self.directory.describe_peer(peer.engine_id)
            except errors.TentError as exc:
                return CheckResult.NO_ANSWER, f"directory: {exc}"
            endpoint = str(listed.get("control") or "")
            if not endpoint:
                return CheckResult.NO_ANSWER, f"the directory lists no control endpoint for {peer.engine_id}"
        host, _, port = endpoint.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                pass
        except ConnectionRefusedError:
            return CheckResult.REFUSED, f"connect to {endpoint} refused"
        except (OSError, ValueError) as exc:
            return CheckResult.NO_ANSWER, f"connect to {endpoint}: {exc or type(exc).__name__}"
        left = max(0.05, timeout - (time.monotonic() - t0))
        try:
            if listed is not None:
                client = self.control_client(endpoint)
                try:
                    rep = client.call({"op": "ping"}, left)
                finally:
                    client.close()
                if not rep.get("ok"):
                    return CheckResult.NO_ANSWER, f"ping refused: {rep.get('error')}"
                desc = listed
            else:
                desc = self._describe(peer.engine_id, peer.client, left)
        except errors.PeerUnreachableError as exc:
            return CheckResult.NO_ANSWER, str(exc)
        except errors.TentError as exc:
            return CheckResult.NO_ANSWER, f"bad reply: {exc}"
        self._apply_description(peer, desc)
        return CheckResult.ANSWERED, f"pid {desc.get('pid')}"

    def _apply_description(self, peer: Peer, desc: Mapping[str, Any]) -> None:
        """A fresh description of `peer`: reload it in place, or replace the peer if it restarted."""
        with peer.lock:
            if peer.retired or self._peers.get(peer.engine_id) is not peer:
                return
            if _identity(desc) == (peer.info.host_id, peer.info.pid, repr(sorted(peer.info.transports.items()))):
                peer.load_segments(desc["segments"], desc.get("epochs"))
                for r in peer.routes.values():
                    r.transport.connect(peer.info, peer.raw_buffers)
                peer.dead_transports.clear()
                peer.connect_errors.clear()
                peer.plans.clear()
                self.on_change()
                return
            log.info("engine %s restarted: reconnecting", peer.engine_id)
            fresh = self._build(peer.engine_id, desc, peer.client)
            peer.client = None  # the new peer owns the control connection now
            peer.restarted = True
            with self._lock:
                self._peers[peer.engine_id] = fresh
        self._retire(peer)

    def forget(self, peer: Peer) -> None:
        """Drop a peer now: cached names, routes (disconnected, rails released), control connection."""
        with self._lock:
            if self._peers.get(peer.engine_id) is peer:
                del self._peers[peer.engine_id]
        self._retire(peer)

    def _retire(self, peer: Peer) -> None:
        with self._lock:
            peer.retired = True
        self.on_change()
        with self._lock:
            for key in [k for k, (p, _) in self._remote_cache.items() if p is peer]:
                del self._remote_cache[key]
        with peer.lock:
            routes, peer.routes = list(peer.routes.values()), {}
            peer.plans.clear()
        for route in routes:
            self._drop_route(peer, route)
        if peer.client is not None:
            peer.client.close()
            peer.client = None

    def _drop_route(self, peer: Peer, route: Route) -> None:
        try:
            route.transport.disconnect(route.link)
        except Exception:
            log.exception("disconnect of %s from %s failed", route.transport.name, peer.engine_id)
        for rail in route.rails:
            if RAILS.release(rail):
                self._monitor.forget(rail.slot)

    def close(self) -> None:
        """Withdraw from the directory (if any), then drop every peer."""
        directory, self.directory = self.directory, None
        if directory is not None:
            directory.close()
        with self._lock:
            peers, self._peers = list(self._peers.values()), {}
        for peer in peers:
            self._retire(peer)

    # ---- per-buffer reachability -------------------------------------------------------------------

    def _judges(self, name: str) -> bool:
        """Does transport `name` tell buffers apart (overrides Transport.buffer_unreachable)?"""
        t = self._transports.get(name)
        return t is not None and type(t).buffer_unreachable is not Transport.buffer_unreachable

    def _ask(self, peer: Peer, name: str, rb: RemoteBuffer) -> str | None:
        route = peer.routes.get(name)
        try:
            why = self._transports[name].buffer_unreachable(peer.info, rb.view(), route.link if route else None)
        except Exception:  # a plugin's bug must not break planning: it is asked again after connect
            log.exception("%s.buffer_unreachable failed for %s", name, rb.where(peer.engine_id))
            return None
        return str(why) if why else None

    def _judge(self, peer: Peer, rb: RemoteBuffer) -> dict[str, str]:
        """transport -> why it can never reach `rb` (the peer's transports that tell buffers apart)."""
        out: dict[str, str] = {}
        for name in peer.reachable:
            if self._judges(name):
                why = self._ask(peer, name, rb)
                if why:
                    out[name] = why
        return out

    def _rejudge(self, peer: Peer, name: str) -> None:
        """Transport `name` just connected (its answers may depend on the link): ask it again about
        every buffer of the peer (caller holds peer.lock, then calls on_change)."""
        if not self._judges(name):
            return
        other_process = peer.info.pid != os.getpid()
        for bufs in peer.segments.values():
            for rb in bufs:
                why = {k: v for k, v in rb.unreachable.items() if k != name}
                mine = self._ask(peer, name, rb)
                if mine:
                    why[name] = mine
                if why != rb.unreachable:
                    rb.unreachable = why  # before hidden: a reader that sees the new hidden finds its reason
                    rb.hidden = (_hidden(rb.desc) if other_process else frozenset()) | frozenset(why)

    # ---- remote memory --------------------------------------------------------------------------

    def map_remote(
        self, peer: Peer, seg: str, offset: int, length: int, op: OpCode, refreshed: bool = False
    ) -> list[tuple[RemoteBuffer, int, int]]:
        """[offset, offset+length) of a remote segment -> (buffer, addr, length) pieces. An unknown
        segment or range re-reads the peer once (it may have registered since), then raises."""
        bufs = peer.segments.get(seg)
        if bufs is None:
            if not refreshed:
                peer = self.refresh_segment(peer, seg)
                return self.map_remote(peer, seg, offset, length, op, True)
            raise errors.UnknownSegmentError(f"engine {peer.engine_id} has no segment {seg!r}")
        starts = peer.starts[seg]
        pieces: list[tuple[RemoteBuffer, int, int]] = []
        pos, end = offset, offset + length
        need = _PERM_READ if op == OpCode.READ else _PERM_WRITE
        while True:
            i = bisect.bisect_right(starts, pos) - 1
            b = bufs[i] if i >= 0 else None
            if b is None or pos >= b.offset + max(b.length, 1) or (b.length == 0 and pos != b.offset):
                if not refreshed:
                    peer = self.refresh_segment(peer, seg)
                    return self.map_remote(peer, seg, offset, length, op, True)
                if pieces or (b is not None and pos == b.offset + b.length):
                    raise errors.OutOfBoundsError(
                        f"{peer.engine_id}/{seg}: range [{offset}, {end}) runs past registered memory at offset {pos}"
                    )
                raise errors.NotRegisteredError(f"{peer.engine_id}/{seg}: offset {pos} is not inside a registered buffer")
            if not (b.perm & need):
                raise errors.PermissionDeniedError(
                    f"{peer.engine_id}/{seg}: buffer at offset {b.offset} is registered {Permission(b.perm)!r}, "
                    f"{op.name} needs {Permission(need).name}"
                )
            take = min(end, b.offset + b.length) - pos
            pieces.append((b, b.addr + (pos - b.offset), take))
            pos += take
            if pos >= end:
                return pieces

    # ---- routing state --------------------------------------------------------------------------

    def plan(self, peer: Peer, traits: RequestTraits, op: OpCode, rule: Rule | None,
             hidden: frozenset[str] = frozenset(), excluded: Mapping[str, str] | None = None) -> Path:
        """The Router's plan for (kinds, rule, op) to `peer`, cached on the peer. `hidden`: transports
        the remote buffer is not shared with (RemoteBuffer.hidden); its plans are cached apart.
        `excluded`: the reasons of those that can never reach it (RemoteBuffer.unreachable), for the
        error when nothing is left."""
        key = (traits.local_kind, traits.remote_kind, op, rule) if not hidden else (
            traits.local_kind, traits.remote_kind, op, rule, hidden)
        plan = peer.plans.get(key)
        if plan is None:
            local_reachable = self.get(self.engine_id).reachable if traits.local_kind != MemoryKind.HOST else ()
            reachable = tuple(t for t in peer.reachable if t not in hidden) if hidden else peer.reachable
            plan = self._router.plan(traits, reachable, local_reachable, op, rule, peer.info.staging, excluded)
            if not isinstance(plan, Decision):
                log.info("synthesized path to %s: %s", peer.engine_id, plan.describe())
            peer.plans[key] = plan
        return plan

    def route(self, peer: Peer, decision: Decision, rbuf: RemoteBuffer | None = None) -> Route:
        """The first transport of `decision` that is connected or connects to `peer` and can reach
        the remote buffer `rbuf` (connecting may tell it cannot: RemoteBuffer.hidden)."""
        routes = peer.routes
        for name in decision.transports:
            if name in peer.dead_transports or (rbuf is not None and name in rbuf.hidden):
                continue
            route = routes.get(name)
            if route is None:
                route = self.connect(peer, name)
            if route is not None and (rbuf is None or name not in rbuf.hidden):
                return route
        what = rbuf.where(peer.engine_id) if rbuf is not None else peer.engine_id
        cannot = dict(rbuf.unreachable) if rbuf is not None else {}
        raise errors.NoPathError(
            f"no transport can reach {what} for {decision.local_kind.value}<->{decision.remote_kind.value}"
            f" (tried {', '.join(decision.transports)}"
            + (f"; down for this peer: {', '.join(sorted(peer.dead_transports))}" if peer.dead_transports else "")
            + ")"
            + "".join(f"; {n}: {e}" for n, e in sorted(cannot.items()))
            + "".join(f"; {n}: {e}" for n, e in sorted(peer.connect_errors.items()) if n not in cannot)
        )

    def connect(self, peer: Peer, name: str) -> Route | None:
        """Connect transport `name` to `peer` (once); None if it cannot (then it is dead for the peer)."""
        with peer.lock:
            route = peer.routes.get(name)
            if route is not None or name in peer.dead_transports or peer.retired:
                return route
            transport = self._transports.get(name)
            if transport is None:
                return None
            try:
                link = transport.connect(peer.info, peer.raw_buffers)
            except Exception as exc:
                log.warning("transport %s cannot connect to %s: %s; trying the next one", name, peer.engine_id, exc)
                peer.dead_transports.add(name)
                peer.connect_errors[name] = f"{type(exc).__name__}: {exc}"
                return None
            rails = [RAILS.acquire(name, peer.engine_id, ri, self._scheduler) for ri in link.rails]
            route = peer.routes[name] = Route(transport, link, rails)
            self._rejudge(peer, name)
            self.on_change()
            return route

    def mark_dead(self, peer: Peer, transport: str, replacement: str) -> None:
        if transport not in peer.dead_transports:
            log.warning("transport %s to %s keeps failing; substituting %s", transport, peer.engine_id, replacement)
            peer.dead_transports.add(transport)
            self.on_change()


__all__ = ["Peer", "PeerDirectory", "RemoteBuffer", "Route"]
