"""The TCP transport: descriptors, buffer export, rail pairing; data moves in the C executor."""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any

from tent_core.executor import Executor
from tent_core.transport import Transport, TransportContext
from tent_core.types import (
    Availability,
    BufferInfo,
    CapabilityProfile,
    MemoryKind,
    PeerInfo,
    PeerLink,
    RailInfo,
)

from . import __version__
from .native import TcpExecutor, executor_path

log = logging.getLogger(__name__)

_EXECUTOR_KEYS = (
    "threads", "conns_per_rail", "slice_timeout_ms", "connect_timeout_ms", "sockbuf", "pipeline", "pipeline_bytes",
    "auth_timeout_ms", "max_conns", "idle_timeout_ms", "unregister_timeout_ms", "congestion_ms", "connect_backoff_ms",
    "qos_bulk_conns", "qos_window_ms", "qos_bulk_nice", "qos_bulk_piece", "qos_serve_nice", "busy_poll_us",
    "busy_poll_adaptive", "receive_digest", "wait_read", "wait_max_ms", "wait_max_parked", "wait_conns",
)
_ANY = {"", "0.0.0.0", "*"}


@dataclass(frozen=True)
class LocalRail:
    ip: str  # address we bind to (and advertise)
    port: int
    gbps: float


def _resolve_ipv4(host: str) -> str:
    if host in _ANY:
        return "0.0.0.0"
    try:
        return str(ipaddress.IPv4Address(host))
    except ValueError:
        return socket.gethostbyname(host)


def _advertised_ip(ip: str) -> str:
    """A listener on INADDR_ANY is advertised with this host's primary address."""
    if ip != "0.0.0.0":
        return ip
    try:
        addr = socket.gethostbyname(socket.gethostname())
        if not addr.startswith("127."):
            return addr
    except OSError:
        pass
    return "127.0.0.1"


def _subnet24(ip: str) -> str | None:
    try:
        return str(ipaddress.IPv4Network(f"{ip}/24", strict=False))
    except ValueError:
        return None


def pair_rails(local: list[str], remote: list[str]) -> list[tuple[int, int]]:
    """(local index, remote index) pairs.

    Rails whose IPv4 addresses share a /24 are paired (within one /24 the k-th local goes
    with the k-th remote, wrapping the shorter side); if no /24 is shared at all (or the
    addresses are not IPv4), pair by index: local i -> remote i mod len(remote).
    """
    if not local or not remote:
        return []
    groups: dict[str, tuple[list[int], list[int]]] = {}
    for i, ip in enumerate(local):
        net = _subnet24(ip)
        if net is not None:
            groups.setdefault(net, ([], []))[0].append(i)
    for j, ip in enumerate(remote):
        net = _subnet24(ip)
        if net is not None and net in groups:
            groups[net][1].append(j)
    pairs: list[tuple[int, int]] = []
    for locs, rems in groups.values():
        if not rems:
            continue
        for k in range(max(len(locs), len(rems))):
            pairs.append((locs[k % len(locs)], rems[k % len(rems)]))
    if not pairs:
        pairs = [(i, i % len(remote)) for i in range(len(local))]
    return sorted(pairs)


class TcpTransport(Transport):
    name = "tcp"
    split_bytes = 1 << 20  # 1 MiB slices keep every connection of a rail busy
    version = __version__
    config_keys = {
        # local addresses to listen on, one rail each (a list or "a,b"); default: the engine's bind host
        "rails": None,
        # each rail's nominal Gbit/s (a list, same order), a hint for the scheduler; default: measured
        "nominal_gbps": None,
        # parallel connections per rail keep the pipe full (measured on loopback: 4 beats 2 for
        # 64 MiB writes by ~15%)
        "conns_per_rail": 4,
        # executor threads; default: one per connection slot ((conns_per_rail + 1) x rails, at least 4)
        "threads": None,
        # A connect whose SYN is lost waits for the kernel's 1 s SYN retransmission; giving up
        # sooner and connecting afresh is what brings a rail back quickly after its link returns
        # (heartbeats of a paused rail connect while it is down). ~1000x a datacenter RTT. Also
        # bounds the auth handshake of a data connection (client side).
        "connect_timeout_ms": 250,
        # after a failed connect, a rail with no open connection fails its slices at once for this
        # long (they are re-routed) instead of each waiting for its own connect
        "connect_backoff_ms": 50,
        # a send that cannot hand the kernel a byte for this long (send buffer full, not draining)
        # is reported as congestion; 0 = a quarter of the progress timeout
        "congestion_ms": 0,
        # SO_SNDBUF/SO_RCVBUF per connection (0 = kernel autotuning)
        "sockbuf": 4 << 20,
        # congestion control of connections to a loopback peer (127/8), both sides: the first of
        # these names the kernel accepts ("" = the host's, as for every other peer). Loopback has
        # no bottleneck to pace for, but a pacing one (BBR, some hosts' default) paces there too,
        # skb by skb: a batch's 1 MiB of READ answers in one sendmsg. 16 x 64 KiB batches against
        # main on a 2-vCPU host, three runs: WRITE 1.95x / 1.40x / 2.02x, READ 1.28x / 0.96x /
        # 1.21x (docs/benchmarks.md, "tcp batches and the host's congestion control"); one request
        # at a time unchanged. reno: what an unprivileged process may always pick.
        "loopback_congestion": "cubic,reno",
        # slices of small requests (the engine's small_request_bytes; the core hints them) have their
        # own queue and an express connection slot per rail (they never wait behind large ones to
        # the same peer), and are pipelined when several wait
        "pipeline": 16,  # small requests sent back to back on one connection at most
        "pipeline_bytes": 1 << 20,  # bytes of one pipelined run at most
        # While small requests are active on a rail (one was submitted within qos_window_ms), bulk
        # runs there on qos_bulk_conns connections at most (0 = no cap): on a shared host every
        # bulk connection is a sender and a receiver thread competing with the small request's for
        # the cores, and its bytes fill kernel socket buffers. Measured (docs/benchmarks.md, "QoS
        # tail"): the P99 of 64 KiB HIGH READs beside a 64 MiB LOW stream on 2 cores.
        "qos_bulk_conns": 1,
        "qos_window_ms": 5,
        # ... and the threads moving bulk there (the client's sender, the target's receiver; a
        # target counts requests up to 256 KiB as small) run at this nice value (1-19; 20 =
        # SCHED_IDLE; 0 = off), so the small request's threads win the cores they wake up for;
        # back to their own weight when idle or once no small request came for qos_window_ms.
        # Measured (docs/benchmarks.md, "The QoS tail over tcp"): loaded P99 551 -> 75 us, the
        # stream's GB/s unchanged. Undoing it takes CAP_SYS_NICE or RLIMIT_NICE >= 20: where the
        # process has neither it is off (logged once).
        "qos_bulk_nice": 19,
        # ... and move their bytes in pieces of this many per system call, yielding the core between
        # two (0 = whole calls; else 4096 at least): a demoted thread the scheduler picked while a small request's thread
        # was runnable kept the core until its 1 MiB call blocked (150-250 us on a shared 2-vCPU
        # host), since no wake-up comes to preempt it (docs/benchmarks.md, "The QoS tail over tcp")
        "qos_bulk_piece": 128 << 10,
        # 0: only the initiator demotes its bulk threads, the target's connection threads never
        # (where its by-size notion of a small request misfires)
        "qos_serve_nice": 1,
        # A waiter reading the answer of a small request it sent, and a server connection after
        # serving one, may poll the socket (no sleep) up to this long before sleeping in the kernel;
        # 0 = always sleep (polling off). Where cores are free it saves a thread wake-up per request
        # (a quiet 2-vCPU host: a 16 B round trip 30 -> 14 us, 64 KiB one at a time 1.4 -> 1.9
        # GB/s); where they are not, a polling thread holds a core its peer needs and everything
        # gets slower (docs/benchmarks.md, small requests). Hence adaptive by default:
        "busy_poll_us": 50,
        # 1: each connection (client waiter and server side alike) learns from its own recent waits
        # whether to poll and for how long (tent/busy_poll.h in tent-core's headers): it polls
        # while most of its polls find their bytes in time on a core no other thread wanted and
        # its polled exchanges are at least a fifth shorter than its slept ones, else it sleeps at
        # once and probes now and then (at most one poll in 256 waits on a busy host). 0: poll the
        # whole busy_poll_us before every such wait. Either way at most half the CPUs (at least
        # one) of the executor's threads poll at once, and none while it moves a bulk request.
        "busy_poll_adaptive": 1,
        # READ answers fold into the digest the caller armed for the slice (engine.submit(digest=),
        # tent/digest.h) on the thread that receives them, each recv'd run right after it landed, so
        # a caller that checks what it READs (refhub) needs no second pass over the bytes. 0: off.
        "receive_digest": 1,
        # small requests up to this long leave on the submitting thread when a connection is idle
        # (one sendmsg, no hand-off before the wire; the waiter reads the answer)
        "inline_bytes": 256 << 10,
        # server side (SECURITY.md): a client that has not authenticated within this is dropped
        "auth_timeout_ms": 5000,
        # connections served at once (a thread and an fd each); more are closed at accept
        "max_conns": 256,
        # a connection without a request for this long is closed (clients reconnect on demand)
        "idle_timeout_ms": 120_000,
        # unregister waits this long for in-flight reads/writes of the buffer, then cuts them
        "unregister_timeout_ms": 5000,
        # waiting READs (engine.submit_when; the executor's header): 1 declares and sends them. The
        # target parks one wait_max_ms at most (the initiator also caps it at half its progress
        # timeout) and wait_max_parked of them at once (more are answered E_NOT_READY at once)
        "wait_read": 1,
        "wait_max_ms": 1000,
        "wait_max_parked": 64,
        # ... and a rail carries waiting READs on this many connections at once (pipelined runs of
        # them): two keep the link busy, each more is one more TCP flow on the hop (more standing
        # queue: a pipeline chain's hops trailed 40-100 ms instead of 15-20 with all five)
        "wait_conns": 2,
    }

    def __init__(self) -> None:
        self._exec: TcpExecutor | None = None
        self._rails: list[LocalRail] = []
        self._lock = threading.Lock()
        # engine_id -> (descriptor key, link)
        self._peers: dict[str, tuple[tuple[tuple[str, int], ...], PeerLink]] = {}

    def word_written(self) -> None:
        ex = self._exec
        if ex is not None and self.wait_read:
            ex.wait_doorbell()

    def wait_config(self, max_parked: int, max_wait_ms: int) -> dict[str, Any]:
        # the initiator caps a READ's wait at half its progress timeout: that must not be shorter
        return {"wait_read": 1, "wait_max_parked": max_parked, "wait_max_ms": max_wait_ms,
                "slice_timeout_ms": 2 * max_wait_ms + 1000}  # fmt: skip

    # ---- discovery -------------------------------------------------------------------
    def probe(self) -> Availability:
        try:
            executor_path()
        except FileNotFoundError as exc:
            return Availability.unavailable(str(exc))
        return Availability.ok()

    def capabilities(self) -> CapabilityProfile:
        return CapabilityProfile(
            kind_pairs=frozenset({(MemoryKind.HOST, MemoryKind.HOST)}),
            same_host=True,
            cross_host=True,
            rank=50,
            # payload leaves by sendmsg from the caller's memory (sendv_all): the kernel copies it
            kernel_copy_sends=True,
        )

    # ---- lifecycle ---------------------------------------------------------------------
    def start(self, ctx: TransportContext) -> None:
        cfg = self.resolve_config(ctx.config)
        rails = cfg["rails"] or [ctx.bind_host or "127.0.0.1"]
        if isinstance(rails, str):
            rails = [r.strip() for r in rails.split(",") if r.strip()]
        gbps = list(cfg["nominal_gbps"] or [])
        if cfg["threads"] is None:
            # one executor thread per connection slot (conns_per_rail bulk ones and the express
            # one), so no rail starves and a small request's answer is read while large ones move
            cfg["threads"] = max(4, (int(cfg["conns_per_rail"]) + 1) * max(1, len(rails)))
        exec_cfg: dict[str, Any] = {k: int(cfg[k]) for k in _EXECUTOR_KEYS}
        exec_cfg["loopback_congestion"] = str(cfg["loopback_congestion"] or "")
        self.inline_bytes = max(0, int(cfg["inline_bytes"]))
        self.receive_digest = bool(int(cfg["receive_digest"]))
        self.wait_read = bool(int(cfg["wait_read"]))
        # the bare-limit benchmark polls under the same rule (tent_bench.small)
        self.busy_poll_us = int(cfg["busy_poll_us"])
        self.busy_poll_adaptive = int(cfg["busy_poll_adaptive"])
        # ... and takes the same congestion control on loopback
        self.loopback_congestion = str(cfg["loopback_congestion"] or "")
        if ctx.auth is not None:
            # every data connection runs the handshake of tent_core.auth (tent/auth.h) with this key
            exec_cfg["auth_key"] = ctx.auth.key("tcp").hex()
        else:
            # no token: allowed only while every rail listens on loopback
            ctx.check_exposure([_resolve_ipv4(str(h)) for h in rails], what="tcp transport")
        self._exec = TcpExecutor(exec_cfg)
        try:
            for i, host in enumerate(rails):
                ip = _resolve_ipv4(str(host))
                port = self._exec.listen(ip, 0)
                g = float(gbps[i]) if i < len(gbps) else 0.0
                self._rails.append(LocalRail(_advertised_ip(ip), port, g))
        except Exception:
            self._exec.close()
            self._exec = None
            raise
        log.debug("tcp transport %s listening on %s", ctx.engine_id, [(r.ip, r.port) for r in self._rails])

    def close(self) -> None:
        with self._lock:
            ex, self._exec = self._exec, None
            self._peers.clear()
        if ex is not None:
            ex.close()

    @property
    def executor(self) -> Executor:
        if self._exec is None:
            raise RuntimeError("tcp transport not started")
        return self._exec.executor

    @property
    def native(self) -> TcpExecutor:
        """The executor with its private controls (counters, peers) — for tools and tests."""
        if self._exec is None:
            raise RuntimeError("tcp transport not started")
        return self._exec

    def local_descriptor(self) -> dict[str, Any]:
        return {"rails": [{"ip": r.ip, "port": r.port, "gbps": r.gbps} for r in self._rails]}

    def rail_names(self) -> list[str]:
        return [f"{r.ip}:{r.port}" for r in self._rails]

    # ---- buffers -----------------------------------------------------------------------
    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        if buf.kind != MemoryKind.HOST:
            return None
        # one executor registration per engine registration: releasing it removes exactly it (and its
        # permission), whatever else covers the same bytes
        buf.extra["tcp_region"] = self.native.register_region(int(buf.addr), int(buf.length), int(buf.perm))
        return None

    def release_buffer(self, buf: BufferInfo) -> None:
        region = buf.extra.pop("tcp_region", None)
        with self._lock:
            ex = self._exec
        if region is None or ex is None:
            return
        # Blocks (GIL released) until in-flight server I/O on the region drained, or was cut at
        # unregister_timeout_ms.
        ex.unregister_region(region)

    # ---- peers -------------------------------------------------------------------------
    def can_reach(self, peer: PeerInfo) -> str | None:
        desc = peer.transports.get(self.name)
        if not desc:
            return f"peer does not offer {self.name}"
        if not desc.get("rails"):
            return "peer advertises no tcp rails"
        return None

    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        desc = peer.transports.get(self.name) or {}
        remote = [(str(r["ip"]), int(r["port"]), float(r.get("gbps") or 0.0)) for r in desc.get("rails", [])]
        if not remote:
            raise ValueError(f"peer {peer.engine_id} advertises no tcp rails")
        key = tuple((ip, port) for ip, port, _ in remote)
        with self._lock:
            known = self._peers.get(peer.engine_id)
            if known is not None and known[0] == key:
                return known[1]
        if known is not None:  # the peer re-advertised different endpoints (restarted)
            self.native.remove_peer(known[1].handle)

        local = self._rails
        pairs = pair_rails([r.ip for r in local], [ip for ip, _, _ in remote])
        lips: list[str] = []
        rips: list[str] = []
        ports: list[int] = []
        infos: list[RailInfo] = []
        for idx, (i, j) in enumerate(pairs):
            lip = local[i].ip
            rip, rport, rg = remote[j]
            bind = lip
            if lip == "0.0.0.0" or (lip.startswith("127.") and not rip.startswith("127.")):
                bind = ""  # let routing choose the source address
            lips.append(bind)
            rips.append(rip)
            ports.append(rport)
            speeds = [g for g in (local[i].gbps, rg) if g > 0]
            infos.append(RailInfo(index=idx, name=f"{lip}->{rip}:{rport}", nominal_gbps=min(speeds) if speeds else 0.0))
        handle = self.native.add_peer(lips, rips, ports)
        link = PeerLink(handle=handle, rails=infos)
        with self._lock:
            self._peers[peer.engine_id] = (key, link)
        log.debug("tcp: peer %s handle %d rails %s", peer.engine_id, handle, [r.name for r in infos])
        return link

    def abort_rail(self, link: PeerLink, rail: int, in_flight: bool = True) -> int:
        ex = self._exec
        return ex.abort_rail(link.handle, rail, in_flight) if ex is not None else 0

    def disconnect(self, link: PeerLink) -> None:
        with self._lock:
            for eid, (_, known) in list(self._peers.items()):
                if known.handle == link.handle:
                    del self._peers[eid]
            ex = self._exec
        if ex is not None:
            ex.remove_peer(link.handle)
