"""What RDMA engines tell each other: device descriptors, per-buffer keys, the QP handshake.

Plain data in, plain data out (msgpack-able dicts), validated on the way in: a malformed or hostile
message raises :class:`tent_core.errors.ProtocolError` and never reaches the verbs calls.

- transport descriptor (``local_descriptor``): ``{"incarnation": str, "devices": [device...]}``;
  a device is ``{"name", "port", "gid" (32 hex digits), "gid_index", "lid", "mtu" (IB enum 1..5),
  "link_layer", "ipv4" (or ""), "rd_atom", "max_msg", "numa", "pci"}``.
- per-buffer descriptor (``export_buffer``): ``{"rkeys": [rkey of device 0, 1, ...]}``.
- handshake (``op: transport``, body below), initiator -> target::

      {"kind": "connect", "initiator": engine_id, "incarnation": str,
       "qps": [{"dev": target device name, "qpn", "psn", "gid", "lid", "mtu", "rd_atom"}...],
       "replace": [passive handles this connect supersedes]}
      -> {"ok": true, "qps": [{"handle", "qpn", "psn", "gid", "lid", "mtu", "rd_atom"}...]}
      {"kind": "release", "initiator": engine_id, "incarnation": str, "handles": [...]}
      -> {"ok": true, "released": n}
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

import numpy as np

from tent_core.errors import ProtocolError

MAX_QPS_PER_MESSAGE = 256
MAX_DEVICES = 16
_U24 = (1 << 24) - 1
_U32 = (1 << 32) - 1


@dataclass(frozen=True)
class RemoteDevice:
    name: str
    port: int
    gid: bytes
    lid: int
    mtu: int
    link_layer: str
    ipv4: str
    rd_atom: int
    numa: int
    pci: str


@dataclass(frozen=True)
class QpEnd:
    """One end of a QP handshake."""

    qpn: int
    psn: int
    gid: bytes
    lid: int
    mtu: int
    rd_atom: int


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ProtocolError(f"rdma: {what} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def _str(v: Any, what: str, maxlen: int = 256) -> str:
    if not isinstance(v, str) or len(v) > maxlen:
        raise ProtocolError(f"rdma: {what} must be a string of at most {maxlen} characters")
    return v


def _gid(v: Any) -> bytes:
    if not isinstance(v, str) or len(v) != 32:
        raise ProtocolError("rdma: gid must be 32 hex digits")
    try:
        return bytes.fromhex(v)
    except ValueError as exc:
        raise ProtocolError("rdma: gid must be 32 hex digits") from exc


def gid_ipv4(gid: bytes) -> str:
    mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    return str(mapped) if mapped is not None else ""


def parse_devices(desc: Any) -> list[RemoteDevice]:
    """A peer's transport descriptor -> its devices (ProtocolError when malformed)."""
    if not isinstance(desc, dict) or not isinstance(desc.get("devices"), list):
        raise ProtocolError("rdma: descriptor must hold a 'devices' list")
    devs = desc["devices"]
    if not devs or len(devs) > MAX_DEVICES:
        raise ProtocolError(f"rdma: a peer advertises 1..{MAX_DEVICES} devices, got {len(devs)}")
    out = []
    for d in devs:
        if not isinstance(d, dict):
            raise ProtocolError("rdma: device entries must be maps")
        gid = _gid(d.get("gid"))
        out.append(
            RemoteDevice(
                name=_str(d.get("name"), "device name", 64),
                port=_int(d.get("port", 1), 1, 255, "port"),
                gid=gid,
                lid=_int(d.get("lid", 0), 0, 0xFFFF, "lid"),
                mtu=_int(d.get("mtu", 3), 1, 5, "mtu"),
                link_layer=_str(d.get("link_layer", "Ethernet"), "link_layer", 32),
                ipv4=_str(d.get("ipv4", "") or gid_ipv4(gid), "ipv4", 64),
                rd_atom=_int(d.get("rd_atom", 0), 0, 255, "rd_atom"),
                numa=_int(d.get("numa", -1), -1, 1 << 16, "numa"),
                pci=_str(d.get("pci", ""), "pci", 64),
            )
        )
    return out


def _subnet24(ip: str) -> str | None:
    try:
        return str(ipaddress.IPv4Network(f"{ip}/24", strict=False))
    except ValueError:
        return None


def pair_devices(local: list[tuple[str, str]], remote: list[tuple[str, str]]) -> list[tuple[int, int]]:
    """Rails as (local index, remote index) pairs, from (ipv4, link_layer) of each side's devices.

    Devices of one link layer only pair with each other. Devices whose IPv4 addresses share a /24
    are paired (the k-th local with the k-th remote of that subnet, wrapping the shorter side):
    on a rail-optimized fabric NIC i of one host reaches NIC i of the other. When no subnet is
    shared (IB, or flat addressing), local i pairs with remote i mod len(remote) of its layer.
    """
    pairs: list[tuple[int, int]] = []
    layers = {ll.lower() for _, ll in local} & {ll.lower() for _, ll in remote}
    for layer in sorted(layers):
        loc = [i for i, (_, ll) in enumerate(local) if ll.lower() == layer]
        rem = [j for j, (_, ll) in enumerate(remote) if ll.lower() == layer]
        groups: dict[str, tuple[list[int], list[int]]] = {}
        for i in loc:
            net = _subnet24(local[i][0]) if local[i][0] else None
            if net:
                groups.setdefault(net, ([], []))[0].append(i)
        for j in rem:
            net = _subnet24(remote[j][0]) if remote[j][0] else None
            if net and net in groups:
                groups[net][1].append(j)
        found = []
        for ls, rs in groups.values():
            if rs:
                found.extend((ls[k % len(ls)], rs[k % len(rs)]) for k in range(max(len(ls), len(rs))))
        if not found:
            found = [(i, rem[n % len(rem)]) for n, i in enumerate(loc)]
        pairs.extend(found)
    return sorted(set(pairs))


def qp_entry(end: QpEnd, **extra: Any) -> dict[str, Any]:
    return {"qpn": end.qpn, "psn": end.psn, "gid": end.gid.hex(), "lid": end.lid, "mtu": end.mtu, "rd_atom": end.rd_atom, **extra}


def parse_qp_entry(d: Any) -> QpEnd:
    if not isinstance(d, dict):
        raise ProtocolError("rdma: QP entries must be maps")
    return QpEnd(
        qpn=_int(d.get("qpn"), 1, _U24, "qpn"),
        psn=_int(d.get("psn"), 0, _U24, "psn"),
        gid=_gid(d.get("gid")),
        lid=_int(d.get("lid", 0), 0, 0xFFFF, "lid"),
        mtu=_int(d.get("mtu", 3), 1, 5, "mtu"),
        rd_atom=_int(d.get("rd_atom", 0), 0, 255, "rd_atom"),
    )


@dataclass(frozen=True)
class ConnectRequest:
    initiator: str
    incarnation: str
    qps: list[tuple[str, QpEnd]]  # (target device name, initiator's end)
    replace: list[int]


def parse_connect(body: Any) -> ConnectRequest:
    if not isinstance(body, dict):
        raise ProtocolError("rdma: body must be a map")
    qps = body.get("qps")
    if not isinstance(qps, list) or not 0 < len(qps) <= MAX_QPS_PER_MESSAGE:
        raise ProtocolError(f"rdma: connect carries 1..{MAX_QPS_PER_MESSAGE} QPs")
    parsed = [(_str(q.get("dev") if isinstance(q, dict) else None, "dev", 64), parse_qp_entry(q)) for q in qps]
    replace = body.get("replace", [])
    if not isinstance(replace, list) or len(replace) > MAX_QPS_PER_MESSAGE:
        raise ProtocolError("rdma: replace must be a list of handles")
    return ConnectRequest(
        initiator=_str(body.get("initiator"), "initiator"),
        incarnation=_str(body.get("incarnation"), "incarnation", 64),
        qps=parsed,
        replace=[_int(h, 1, (1 << 63) - 1, "handle") for h in replace],
    )


def parse_release(body: Any) -> tuple[str, str, list[int]]:
    if not isinstance(body, dict):
        raise ProtocolError("rdma: body must be a map")
    handles = body.get("handles")
    if not isinstance(handles, list) or len(handles) > 4096:
        raise ProtocolError("rdma: release carries a list of at most 4096 handles")
    return (
        _str(body.get("initiator"), "initiator"),
        _str(body.get("incarnation"), "incarnation", 64),
        [_int(h, 1, (1 << 63) - 1, "handle") for h in handles],
    )


def pack_regions(remote_buffers: list[dict[str, Any]], transport: str, ncols: int) -> tuple[np.ndarray, ...]:
    """The peer's buffers that carry keys for all `ncols` of its devices, as the executor's arrays:
    (addrs u64, lens u64, perms u32, rkeys u32 [n, ncols]). Buffers without (valid) keys are left
    out: the executor then refuses their ranges (TENT_E_BOUNDS) instead of guessing a key."""
    rows: list[tuple[int, int, int, list[int]]] = []
    for b in remote_buffers:
        desc = (b.get("desc") or {}).get(transport) if isinstance(b.get("desc"), dict) else None
        keys = desc.get("rkeys") if isinstance(desc, dict) else None
        if not isinstance(keys, list) or len(keys) != ncols:
            continue
        if not all(isinstance(k, int) and 0 <= k <= _U32 for k in keys):
            continue
        try:
            addr, length, perm = int(b["addr"]), int(b["length"]), int(b["perm"])
        except (KeyError, TypeError, ValueError):
            continue
        if addr < 0 or length <= 0 or addr + length > (1 << 64) - 1:
            continue
        rows.append((addr, length, perm & 3, keys))
    n = len(rows)
    addrs = np.array([r[0] for r in rows], np.uint64)
    lens = np.array([r[1] for r in rows], np.uint64)
    perms = np.array([r[2] for r in rows], np.uint32)
    rkeys = np.array([r[3] for r in rows], np.uint32).reshape(n, ncols) if n else np.zeros((0, ncols), np.uint32)
    return addrs, lens, perms, np.ascontiguousarray(rkeys)
