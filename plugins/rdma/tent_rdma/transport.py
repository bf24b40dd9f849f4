"""The RDMA transport: devices, memory registration, the QP handshake, QP recovery.

Data moves in the compiled executor (one-sided RDMA READ/WRITE); this module is the control side:

- start(): pick devices and GIDs from sysfs (topology.py), create the executor, start the
  maintenance thread.
- export_buffer(): register the buffer with every device (ibv_reg_mr; access flags from the
  buffer's permission, so the NIC refuses what the owner did not grant), advertise the rkeys.
- connect(): pair local and remote devices into rails, create qps_per_rail RC QPs per rail, run
  the handshake over the engine's control plane (op "transport"), give the executor the peer's
  regions and keys.
- handle_control(): the target side of the handshake (passive QPs, bounded, released when the
  initiator disconnects, reconnects, restarts or stops answering pings).
- maintenance: QPs the executor reports broken (error completion, timeout, port down, aborted
  rail) are recreated and handshaken again once their port is up, with back-off per peer.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tent_core.auth import ClusterAuth
from tent_core.errors import PeerUnreachableError, ProtocolError
from tent_core.executor import Executor
from tent_core.metadata import ControlClient
from tent_core.transport import AccessControl, Transport, TransportContext
from tent_core.types import (
    Availability,
    BufferInfo,
    CapabilityProfile,
    MemoryKind,
    PeerInfo,
    PeerLink,
    RailInfo,
)

from . import __version__, discovery, gpu, protocol, topology
from .native import RdmaExecutor, get_lib, library_status, probe_ports

log = logging.getLogger(__name__)

# executor knobs passed through from the transport's config section (their defaults: config_keys)
_EXECUTOR_KEYS = (
    "qps_per_rail",
    "max_send_wr",
    "chunk_bytes",
    "slice_timeout_ms",
    "qp_timeout",
    "retry_cnt",
    "rnr_retry",
    "spin_us",
    "cq_depth",
    "max_rd_atomic",
    "traffic_class",
    "service_level",
    "max_passive_qps",
)
# Topology penalty per affinity tier (same NUMA node / near / far), as the C++ TENT's 1/5/10.
DEFAULT_TIER_PENALTIES = (1.0, 5.0, 10.0)
FENCE_TIMEOUT_S = 2.0
MAINTENANCE_TICK_S = 0.1  # broken QPs are rebuilt within a tick; idle cost stays low
RECONNECT_BACKOFF_S = (0.05, 5.0)
PASSIVE_PING_EVERY_S = 10.0
PASSIVE_PING_FAILURES = 3


def _as_list(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [s.strip() for s in v.split(",") if s.strip()]
    return [str(s) for s in v]


@dataclass
class _PeerState:
    engine_id: str
    incarnation: str
    key: tuple[Any, ...]
    link: PeerLink
    devices: list[protocol.RemoteDevice]
    rail_devs: list[tuple[int, int]]  # (local index, remote index) per rail
    qps_per_rail: int
    passive: dict[tuple[int, int], int] = field(default_factory=dict)  # (rail, k) -> target's handle
    fresh: set[tuple[int, int]] = field(default_factory=set)  # recreated and fenced, awaiting a handshake
    retry_at: float = 0.0
    backoff: float = RECONNECT_BACKOFF_S[0]


@dataclass
class _Session:
    """QPs this engine holds for one initiator (target side)."""

    incarnation: str
    handles: set[int] = field(default_factory=set)
    ping_failures: int = 0


class RdmaTransport(Transport):
    name = "rdma"
    version = __version__
    # The executor cuts slices into work requests itself (chunk_bytes, the port's max message
    # size) and spreads them over the rail's QPs: a single-rail request needs no pre-split.
    split_bytes = 0
    config_keys = {
        # RDMA devices to use ("mlx5_0,mlx5_1" or a list; "name:port" picks a port); default: every
        # device with an ACTIVE port and a usable GID
        "devices": None,
        # GID table index for every device; default: a RoCE v2 IPv4-mapped GID, else the first valid
        "gid_index": None,
        # each device's nominal Gbit/s (a list, same order as the devices), a hint for the scheduler
        "nominal_gbps": None,
        # topology penalty per affinity tier (same NUMA node as this process / near / far)
        "tier_penalties": None,
        # deadline of one QP handshake (or fence) over the control plane
        "handshake_timeout_s": 5.0,
        # RC QPs per rail: work requests spread over them (one QP serialises on one responder)
        "qps_per_rail": 2,
        # outstanding work requests per QP (capped at the device's max_qp_wr)
        "max_send_wr": 64,
        # a slice is cut into work requests of at most this many bytes (and the port's max message)
        "chunk_bytes": 1 << 20,
        # QP local ACK timeout exponent: 4.096 us * 2^qp_timeout per try (14: 67 ms)
        "qp_timeout": 14,
        # transport retries before a work request fails with a retry-exceeded error (max 7)
        "retry_cnt": 7,
        # receiver-not-ready retries (7 = infinite)
        "rnr_retry": 7,
        # completion pollers spin this long before sleeping on the completion channel
        "spin_us": 20,
        # completion queue entries per device
        "cq_depth": 4096,
        # outstanding RDMA READs per QP (0 = the device's maximum)
        "max_rd_atomic": 0,
        # RoCE traffic class (DSCP << 2) and InfiniBand service level of our QPs
        "traffic_class": 0,
        "service_level": 0,
        # QPs this engine accepts from all initiators together (target side): a bound on their memory
        "max_passive_qps": 4096,
    }

    def __init__(self) -> None:
        self._exec: RdmaExecutor | None = None
        self._devices: list[topology.ChosenDevice] = []
        self._dev_info: list[dict[str, Any]] = []
        self._engine_id = ""
        self._incarnation = secrets.token_hex(8)
        self._lock = threading.RLock()
        self._peers: dict[str, _PeerState] = {}
        self._by_handle: dict[int, _PeerState] = {}
        self._sessions: dict[str, _Session] = {}
        self._clients: dict[str, ControlClient] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu = gpu.GpuDirect(None, "off: transport not started")
        self._handshake_timeout = 5.0
        self._nominal: list[float] = []
        self._penalties: list[float] = []
        self._next_ping = 0.0
        self._auth: ClusterAuth | None = None

    # ---- discovery -------------------------------------------------------------------
    def probe(self) -> Availability:
        try:
            get_lib()
        except (FileNotFoundError, OSError) as exc:
            return Availability.unavailable(f"rdma executor library unusable: {exc}")
        reason = library_status()
        if reason is not None:
            return Availability.unavailable(reason)
        try:
            ports = probe_ports()
        except RuntimeError as exc:
            return Availability.unavailable(f"libibverbs lists no devices: {exc}")
        if not ports:
            return Availability.unavailable("no RDMA device (libibverbs lists none; load a driver or rdma_rxe)")
        if not any(p.active for p in ports):
            down = ", ".join(f"{p.device}/{p.port}" for p in ports)
            return Availability.unavailable(f"no RDMA port is ACTIVE ({down})")
        source, rows = discovery.inventory()
        return Availability(True, discovery.summary(rows, source))

    def capabilities(self) -> CapabilityProfile:
        pairs = {(MemoryKind.HOST, MemoryKind.HOST)}
        if self._gpu.mode is not None:
            pairs |= {(MemoryKind.HOST, MemoryKind.CUDA), (MemoryKind.CUDA, MemoryKind.HOST), (MemoryKind.CUDA, MemoryKind.CUDA)}
        # same host works too (loopback QPs), but shared memory beats a NIC round trip there
        return CapabilityProfile(kind_pairs=frozenset(pairs), same_host=True, cross_host=True, rank=30)

    @property
    def gpu_direct(self) -> gpu.GpuDirect:
        return self._gpu

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, ctx: TransportContext) -> None:
        cfg = self.resolve_config(ctx.config)
        # every handshake, fence and ping goes over the engine's control plane, authenticated with
        # the cluster secret like the engine's own requests: only cluster members get QPs to us
        self._auth = ctx.auth
        wanted = _as_list(cfg.get("devices"))
        gid_index = cfg.get("gid_index")
        chosen, skipped = topology.choose_devices(
            topology.list_devices(), wanted or None, int(gid_index) if gid_index is not None else None
        )
        if skipped:
            log.info("rdma: left out %s", "; ".join(skipped))
        if not chosen:
            raise RuntimeError(f"no usable RDMA device ({'; '.join(skipped) or 'none found'})")
        self._devices = chosen
        self._nominal = [float(x) for x in _as_list(cfg.get("nominal_gbps"))]
        tiers = [float(x) for x in _as_list(cfg.get("tier_penalties"))] or list(DEFAULT_TIER_PENALTIES)
        # The engine plans per rail, not per buffer: the NUMA node this process runs on stands in
        # for its buffers' (first-touch places them there), giving each rail its affinity tier.
        node, slit = topology.process_numa_node(), topology.numa_distances()
        self._penalties = [tiers[min(topology.affinity_tier(node, d.numa_node, slit), len(tiers) - 1)] for d in chosen]
        self._handshake_timeout = float(cfg.get("handshake_timeout_s", 5.0))
        ex_cfg: dict[str, Any] = {k: int(cfg[k]) for k in _EXECUTOR_KEYS if cfg.get(k) is not None}
        ex_cfg["devices"] = ",".join(d.name for d in chosen)
        ex_cfg["ports"] = ",".join(str(d.port) for d in chosen)
        ex_cfg["gid_indexes"] = ",".join(str(d.gid.index) for d in chosen)
        self._exec = RdmaExecutor(ex_cfg)
        self._dev_info = [self._exec.device_info(i) for i in range(len(chosen))]
        self._engine_id = ctx.engine_id
        self._gpu = gpu.gpu_direct_status(bool(get_lib().has_dmabuf()))
        self._thread = threading.Thread(target=self._maintain, name="tent-rdma-maint", daemon=True)
        self._thread.start()
        log.info(
            "rdma transport %s: %s; GPU memory %s",
            ctx.engine_id,
            ", ".join(f"{d.name}/{d.port} gid {d.gid.index} ({d.gid.ipv4 or d.gid.gid})" for d in chosen),
            self._gpu.reason,
        )

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            peers = list(self._peers.values())
        for st in peers:
            self._release_remote(st)
        with self._lock:
            ex, self._exec = self._exec, None
            self._peers.clear()
            self._by_handle.clear()
            self._sessions.clear()
            clients, self._clients = self._clients, {}
        for c in clients.values():
            c.close()
        if ex is not None:
            ex.close()

    @property
    def executor(self) -> Executor:
        if self._exec is None:
            raise RuntimeError("rdma transport not started")
        return self._exec.executor

    @property
    def native(self) -> RdmaExecutor:
        if self._exec is None:
            raise RuntimeError("rdma transport not started")
        return self._exec

    def local_descriptor(self) -> dict[str, Any]:
        devs = []
        for d, info in zip(self._devices, self._dev_info, strict=True):
            devs.append(
                {
                    "name": d.name,
                    "port": d.port,
                    "gid": info["gid"].hex(),
                    "gid_index": d.gid.index,
                    "lid": info["lid"],
                    "mtu": info["mtu"],
                    "link_layer": d.link_layer,
                    "ipv4": d.gid.ipv4 or "",
                    "rd_atom": info["rd_atom"],
                    "max_msg": info["max_msg"],
                    "numa": d.numa_node,
                    "pci": d.pci,
                }
            )
        return {"incarnation": self._incarnation, "devices": devs}

    def rail_names(self) -> list[str]:
        return [f"{d.name}/{d.port} ({d.gid.ipv4 or d.netdev})" for d in self._devices]

    # ---- buffers -----------------------------------------------------------------------
    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        if buf.length <= 0:
            return None
        ndev = len(self._devices)
        if buf.kind == MemoryKind.HOST:
            try:
                keys = self.native.register(int(buf.addr), int(buf.length), int(buf.perm), ndev)
            except OSError as exc:
                raise OSError(
                    exc.errno,
                    f"rdma: cannot register {buf.length} bytes at {buf.addr:#x}: {exc.strerror}"
                    " (RLIMIT_MEMLOCK too low? `ulimit -l unlimited`)",
                ) from exc
            return {"rkeys": keys}
        if buf.kind == MemoryKind.CUDA and self._gpu.mode == "dmabuf":
            fd, offset = gpu.export_dmabuf(int(buf.addr), int(buf.length))
            try:
                keys = self.native.register_dmabuf(fd, offset, int(buf.length), int(buf.addr), int(buf.perm), ndev)
            finally:
                import os

                os.close(fd)
            return {"rkeys": keys}
        if buf.kind == MemoryKind.CUDA and self._gpu.mode == "peermem":
            return {"rkeys": self.native.register(int(buf.addr), int(buf.length), int(buf.perm), ndev)}
        return None

    def release_buffer(self, buf: BufferInfo) -> None:
        ex = self._exec
        if ex is not None and buf.length > 0:
            ex.unregister(int(buf.addr), int(buf.length))

    # ---- peers (initiator side) -------------------------------------------------------------
    def can_reach(self, peer: PeerInfo) -> str | None:
        desc = peer.transports.get(self.name)
        if not desc:
            return f"peer does not offer {self.name}"
        try:
            remote = protocol.parse_devices(desc)
        except ProtocolError as exc:
            return str(exc)
        local = [(d.gid.ipv4 or "", d.link_layer) for d in self._devices]
        if not protocol.pair_devices(local, [(r.ipv4, r.link_layer) for r in remote]):
            return "no RDMA device of the peer shares a link layer with ours"
        return None

    def _call(self, engine_id: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
        if engine_id == self._engine_id:  # loopback: the engine talking to itself
            return self.handle_control(body)
        with self._lock:
            client = self._clients.get(engine_id)
            if client is None:
                client = self._clients[engine_id] = ControlClient(engine_id, auth=self._auth)
        reply = client.call({"op": "transport", "transport": self.name, "body": body}, timeout)
        if not reply.get("ok"):
            raise PeerUnreachableError(f"rdma handshake with {engine_id} refused: {reply.get('error')}")
        return reply

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        desc = peer.transports.get(self.name) or {}
        remote = protocol.parse_devices(desc)
        incarnation = protocol._str(desc.get("incarnation", ""), "incarnation", 64)
        key = (incarnation, tuple((r.name, r.gid) for r in remote))
        ex = self.native
        with self._lock:
            known = self._peers.get(peer.engine_id)
        if known is not None and known.key == key:
            self._set_regions(known, remote_buffers)
            return known.link
        if known is not None:  # the peer restarted or changed its devices
            self._forget(known)

        local = [(d.gid.ipv4 or "", d.link_layer) for d in self._devices]
        pairs = protocol.pair_devices(local, [(r.ipv4, r.link_layer) for r in remote])
        if not pairs:
            raise PeerUnreachableError(f"rdma: no device pair reaches {peer.engine_id}")
        handle = ex.add_peer([i for i, _ in pairs], [j for _, j in pairs], len(remote))
        nrails, nqps = ex.peer_shape(handle)
        infos = []
        for idx, (i, j) in enumerate(pairs):
            ld, rd = self._devices[i], remote[j]
            speeds = [self._nominal[i]] if i < len(self._nominal) else []
            infos.append(
                RailInfo(
                    index=idx,
                    name=f"{ld.name}->{peer.engine_id.rsplit(':', 1)[0]}/{rd.name}",
                    nominal_gbps=min(speeds) if speeds else 0.0,
                    penalty=self._penalties[i],
                    numa_node=ld.numa_node,
                    pci=ld.pci,
                )
            )
        st = _PeerState(peer.engine_id, incarnation, key, PeerLink(handle=handle, rails=infos), remote, pairs, nqps)
        try:
            self._handshake(st, [(r, k) for r in range(nrails) for k in range(nqps)], replace=[])
            self._set_regions(st, remote_buffers)
        except BaseException:
            ex.remove_peer(handle)
            self._release_remote(st)
            raise
        with self._lock:
            self._peers[peer.engine_id] = st
            self._by_handle[handle] = st
        log.info("rdma: connected to %s: %s (%d QPs per rail)", peer.engine_id, [r.name for r in infos], nqps)
        return st.link

    def _handshake(self, st: _PeerState, qps: list[tuple[int, int]], replace: list[int]) -> None:
        """Run the handshake for (rail, k) QPs in state INIT/RECONNECTING; READY on return."""
        ex = self.native
        entries = []
        for r, k in qps:
            qpn, psn, _ = ex.qp_info(st.link.handle, r, k)
            li = self._dev_info[st.rail_devs[r][0]]
            end = protocol.QpEnd(qpn, psn, li["gid"], li["lid"], li["mtu"], li["rd_atom"])
            entries.append(protocol.qp_entry(end, dev=st.devices[st.rail_devs[r][1]].name))
        body = {
            "kind": "connect",
            "initiator": self._engine_id,
            "incarnation": self._incarnation,
            "qps": entries,
            "replace": replace,
        }
        reply = self._call(st.engine_id, body, self._handshake_timeout)
        got = reply.get("qps")
        if not isinstance(got, list) or len(got) != len(qps):
            raise ProtocolError(f"rdma: {st.engine_id} answered {len(got) if isinstance(got, list) else 'no'} QPs for {len(qps)}")
        for (r, k), q in zip(qps, got, strict=True):
            end = protocol.parse_qp_entry(q)
            handle = protocol._int(q.get("handle"), 1, (1 << 63) - 1, "handle")
            st.passive[(r, k)] = handle
            ex.connect_qp(st.link.handle, r, k, end.qpn, end.psn, end.gid, end.lid, end.mtu, end.rd_atom)

    def _set_regions(self, st: _PeerState, remote_buffers: list[dict[str, Any]]) -> None:
        addrs, lens, perms, rkeys = protocol.pack_regions(remote_buffers, self.name, len(st.devices))
        self.native.set_regions(st.link.handle, addrs, lens, perms, rkeys)

    def _release_remote(self, st: _PeerState) -> None:
        handles = sorted(set(st.passive.values()))
        st.passive.clear()
        if not handles:
            return
        body = {"kind": "release", "initiator": self._engine_id, "incarnation": self._incarnation, "handles": handles}
        try:
            self._call(st.engine_id, body, min(self._handshake_timeout, 1.0))
        except Exception as exc:  # the peer may be gone; its pinger reclaims them
            log.debug("rdma: release at %s failed: %s", st.engine_id, exc)

    def _forget(self, st: _PeerState) -> None:
        with self._lock:
            if self._peers.get(st.engine_id) is st:
                del self._peers[st.engine_id]
            self._by_handle.pop(st.link.handle, None)
            ex = self._exec
        if ex is not None:
            ex.remove_peer(st.link.handle)
        self._release_remote(st)

    def access_control(self, link: PeerLink) -> AccessControl:
        """Everything is refused by the target's NIC itself: every registered buffer is its own
        memory region (so an rkey covers that buffer and nothing else: bounds), registered with
        remote-write access only when the owner granted WRITE (permission), and deregistered by
        release_buffer() (revocation: the rkey dies with the region)."""
        return AccessControl(bounds=True, permission=True, revocation=True)

    def abort_rail(self, link: PeerLink, rail: int) -> int:
        ex = self._exec
        return ex.abort_rail(link.handle, rail) if ex is not None else 0

    def disconnect(self, link: PeerLink) -> None:
        with self._lock:
            st = self._by_handle.get(link.handle)
        if st is not None:
            self._forget(st)
        elif self._exec is not None:
            self._exec.remove_peer(link.handle)

    def rail_counters(self, link: PeerLink, rail: int) -> dict[str, int]:
        return self.native.rail_counters(link.handle, rail)

    # ---- target side --------------------------------------------------------------------------
    def handle_control(self, body: Any) -> dict[str, Any]:
        kind = body.get("kind") if isinstance(body, dict) else None
        if kind == "connect":
            return self._accept(protocol.parse_connect(body))
        if kind == "release":
            initiator, incarnation, handles = protocol.parse_release(body)
            return {"ok": True, "released": self._release_sessions(initiator, incarnation, handles)}
        raise ProtocolError(f"rdma: unknown control message kind {kind!r}")

    def _accept(self, req: protocol.ConnectRequest) -> dict[str, Any]:
        ex = self.native
        by_name = {d.name: i for i, d in enumerate(self._devices)}
        for dev, _ in req.qps:
            if dev not in by_name:
                raise ProtocolError(f"rdma: no device {dev!r} here")
        with self._lock:
            sess = self._sessions.get(req.initiator)
            if sess is not None and sess.incarnation != req.incarnation:
                stale = list(sess.handles)  # the initiator restarted: its old QPs are dead weight
                for h in stale:
                    ex.release_qp(h)
                sess = None
            if sess is None:
                sess = self._sessions[req.initiator] = _Session(req.incarnation)
            for h in req.replace:
                if h in sess.handles:
                    sess.handles.discard(h)
                    ex.release_qp(h)
        out: list[dict[str, Any]] = []
        made: list[int] = []
        try:
            for dev, end in req.qps:
                i = by_name[dev]
                handle, qpn, psn = ex.accept_qp(i, end.qpn, end.psn, end.gid, end.lid, end.mtu)
                made.append(handle)
                info = self._dev_info[i]
                mine = protocol.QpEnd(qpn, psn, info["gid"], info["lid"], info["mtu"], info["rd_atom"])
                out.append(protocol.qp_entry(mine, handle=handle))
        except OSError as exc:
            for h in made:
                ex.release_qp(h)
            raise ProtocolError(f"rdma: cannot accept QPs: {exc}") from exc
        with self._lock:
            sess.handles.update(made)
        return {"ok": True, "qps": out}

    def _release_sessions(self, initiator: str, incarnation: str, handles: list[int]) -> int:
        n = 0
        with self._lock:
            sess = self._sessions.get(initiator)
            if sess is None or sess.incarnation != incarnation:
                return 0
            for h in handles:
                if h in sess.handles and self._exec is not None:
                    sess.handles.discard(h)
                    n += self._exec.release_qp(h)
            if not sess.handles:
                del self._sessions[initiator]
        return n

    def passive_qps(self) -> int:
        return self._exec.passive_count() if self._exec is not None else 0

    # ---- maintenance ----------------------------------------------------------------------------
    def _maintain(self) -> None:
        while not self._stop.wait(MAINTENANCE_TICK_S):
            try:
                self._reconnect_broken()
                self._ping_initiators()
            except Exception:
                log.exception("rdma maintenance failed")

    def _reconnect_broken(self) -> None:
        """QPs the executor gave up on (error, timeout, port down, aborted rail).

        1. our end is destroyed and recreated (nothing of the old QP can land here any more);
        2. the peer drops its end (fence: late packets of the old QP land nowhere there either);
        3. only then are the slices that failed on it handed back to the engine for a retry
           elsewhere - a WRITE retried on another rail can no longer be overtaken by its ghost;
        4. the fresh QP is handshaken once its port is up (back-off per peer).
        """
        ex = self._exec
        if ex is None:
            return
        broken = ex.collect_broken()
        if not broken:
            return
        groups: dict[int, list[tuple[int, int]]] = {}
        for peer, r, k in broken:
            groups.setdefault(peer, []).append((r, k))
        for peer, qps in groups.items():
            with self._lock:
                st = self._by_handle.get(peer)
            stale = [q for q in qps if st is None or q not in st.fresh]
            for r, k in stale:
                try:
                    ex.reset_qp(peer, r, k)
                except OSError as exc:  # could not create the new QP: the old one is gone anyway
                    log.warning("rdma: recreating QP %d/%d failed: %s", r, k, exc)
            if st is not None:
                old = [st.passive.pop(q) for q in stale if q in st.passive]
                if old:
                    self._fence(st, old)
                st.fresh.update(stale)
            for r, k in stale:
                ex.release_deferred(peer, r, k)
            now = time.monotonic()
            ready = [] if st is None or now < st.retry_at else [q for q in qps if ex.port_active(st.rail_devs[q[0]][0])]
            for q in qps:
                if q not in ready:
                    ex.release_claim(peer, *q)  # collected again later
            if not ready or st is None:
                continue
            try:
                self._handshake(st, ready, replace=[])
                st.fresh.difference_update(ready)
                st.backoff = RECONNECT_BACKOFF_S[0]
                log.info("rdma: %d QP(s) to %s reconnected", len(ready), st.engine_id)
            except Exception as exc:
                for q in ready:
                    ex.release_claim(peer, *q)
                st.retry_at = time.monotonic() + st.backoff
                log.info("rdma: reconnecting to %s failed (%s); next try in %.2f s", st.engine_id, exc, st.backoff)
                st.backoff = min(st.backoff * 2, RECONNECT_BACKOFF_S[1])

    def _fence(self, st: _PeerState, handles: list[int]) -> None:
        body = {"kind": "release", "initiator": self._engine_id, "incarnation": self._incarnation, "handles": handles}
        try:
            self._call(st.engine_id, body, min(self._handshake_timeout, FENCE_TIMEOUT_S))
        except Exception as exc:
            # unreachable: a dead process's QPs died with it; a live but cut-off one gets no packets
            # over a broken path either. The slices are released regardless, to be retried or failed.
            log.info("rdma: fence at %s failed (%s); releasing the failed slices anyway", st.engine_id, exc)

    def _ping_initiators(self) -> None:
        """Passive QPs of initiators that stopped answering are released (bounded: one ping a tick)."""
        now = time.monotonic()
        if now < self._next_ping:
            return
        with self._lock:
            names = [n for n in self._sessions if n != self._engine_id]
        if not names:
            self._next_ping = now + PASSIVE_PING_EVERY_S
            return
        self._next_ping = now + PASSIVE_PING_EVERY_S / len(names)
        name = names[int(now * 1000) % len(names)]
        # the cached client keeps its authenticated session (a fresh one costs a handshake round
        # trip), and the deadline is the handshake's: a slow but live initiator (an emulated guest,
        # a loaded host) must not lose its QPs to a short ping timeout
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                client = self._clients[name] = ControlClient(name, auth=self._auth)
        try:
            client.call({"op": "ping"}, self._handshake_timeout)
            ok = True
        except Exception:
            ok = False
        with self._lock:
            sess = self._sessions.get(name)
            if sess is None:
                return
            sess.ping_failures = 0 if ok else sess.ping_failures + 1
            if sess.ping_failures >= PASSIVE_PING_FAILURES:
                log.info("rdma: initiator %s is gone; releasing its %d QP(s)", name, len(sess.handles))
                for h in sess.handles:
                    if self._exec is not None:
                        self._exec.release_qp(h)
                del self._sessions[name]
                if name not in self._peers:  # bounded: no client kept for an initiator that is gone
                    gone = self._clients.pop(name, None)
                    if gone is not None:
                        gone.close()
