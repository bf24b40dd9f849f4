"""What the host's RDMA devices look like, read from sysfs: ports, GIDs, netdevs, NUMA node, PCI address.

Pure functions over a sysfs root (``/sys`` by default, a folder of the same shape in tests): no
verbs calls, no library. The executor opens what :func:`choose_devices` picks, with the GID index
:func:`select_gid` chooses.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

SYSFS = "/sys"
_PCI_ADDR = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

# GID preference: RoCE v2 routes over IP (ECMP, across subnets); an IPv4-mapped GID follows the
# netdev's IPv4 address, which is what rails are paired by. Lower is better.
GID_RANK_ROCE2_V4 = 0
GID_RANK_ROCE2_V6 = 1
GID_RANK_ROCE2_LINKLOCAL = 2
GID_RANK_V1_OR_IB = 3
GID_RANK_OTHER = 4


@dataclass(frozen=True)
class GidEntry:
    index: int
    gid: str  # "fe80:0000:...:b049" as sysfs writes it
    type: str  # "RoCE v2", "IB/RoCE v1", "" when unknown
    netdev: str = ""

    @property
    def raw(self) -> bytes:
        return ipaddress.IPv6Address(self.gid).packed

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address of an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
        mapped = ipaddress.IPv6Address(self.gid).ipv4_mapped
        return str(mapped) if mapped is not None else None


@dataclass
class PortInfo:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", ...
    link_layer: str  # "Ethernet" / "InfiniBand"
    gids: list[GidEntry] = field(default_factory=list)
    rate: str = ""

    @property
    def active(self) -> bool:
        return self.state.upper() == "ACTIVE"


@dataclass
class DeviceInfo:
    name: str
    ports: list[PortInfo]
    netdev: str = ""  # the Ethernet netdev behind a RoCE device ("" for IB)
    pci: str = ""  # PCI address of the NIC ("" when not on PCI)
    numa_node: int = -1  # -1: unknown / single node


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def gid_rank(entry: GidEntry) -> int:
    """Preference of a GID table entry (lower is better); zero GIDs are never chosen."""
    addr = ipaddress.IPv6Address(entry.gid)
    v2 = "v2" in entry.type.lower()
    if v2 and addr.ipv4_mapped is not None:
        return GID_RANK_ROCE2_V4
    if v2 and not addr.is_link_local:
        return GID_RANK_ROCE2_V6
    if v2:
        return GID_RANK_ROCE2_LINKLOCAL
    if entry.type:
        return GID_RANK_V1_OR_IB
    return GID_RANK_OTHER


def select_gid(entries: list[GidEntry], link_layer: str = "Ethernet", prefer_ipv4: str | None = None) -> GidEntry | None:
    """The GID to use on a port.

    InfiniBand: index 0 (the port GID). RoCE: RoCE v2 first, IPv4-mapped before global IPv6
    before link-local; `prefer_ipv4` picks the entry carrying that address when present. Entries
    that are all zero (unused slots) are skipped. None when the port has no usable GID.
    """
    usable = [e for e in entries if ipaddress.IPv6Address(e.gid) != ipaddress.IPv6Address(0)]
    if not usable:
        return None
    if link_layer.lower() == "infiniband":
        return min(usable, key=lambda e: e.index)
    if prefer_ipv4:
        for e in usable:
            if e.ipv4 == prefer_ipv4 and "v2" in e.type.lower():
                return e
    return min(usable, key=lambda e: (gid_rank(e), e.index))


def read_port(root: Path, device: str, port: int) -> PortInfo:
    pdir = root / "class" / "infiniband" / device / "ports" / str(port)
    state = _read(pdir / "state")  # "4: ACTIVE"
    state = state.split(":", 1)[1].strip() if ":" in state else state
    gids: list[GidEntry] = []
    gdir = pdir / "gids"
    try:
        names = sorted(os.listdir(gdir), key=lambda s: int(s) if s.isdigit() else 1 << 30)
    except OSError:
        names = []
    for name in names:
        if not name.isdigit():
            continue
        gid = _read(gdir / name)
        if not gid:
            continue
        try:
            ipaddress.IPv6Address(gid)
        except ValueError:
            continue
        gtype = _read(pdir / "gid_attrs" / "types" / name)
        ndev = _read(pdir / "gid_attrs" / "ndevs" / name)
        gids.append(GidEntry(int(name), gid, gtype, ndev))
    return PortInfo(device, port, state or "UNKNOWN", _read(pdir / "link_layer") or "Ethernet", gids, _read(pdir / "rate"))


def pci_of(path: Path) -> tuple[str, int]:
    """(PCI address, NUMA node) of the device a sysfs path leads to, walking up from it."""
    try:
        real = Path(os.path.realpath(path))
    except OSError:
        return "", -1
    for part in [real, *real.parents]:
        if _PCI_ADDR.match(part.name):
            node = _read(part / "numa_node")
            try:
                numa = int(node)
            except ValueError:
                numa = -1
            return part.name, numa
    return "", -1


def read_device(root: Path, name: str) -> DeviceInfo:
    ddir = root / "class" / "infiniband" / name
    try:
        port_names = sorted(int(p) for p in os.listdir(ddir / "ports") if p.isdigit())
    except OSError:
        port_names = []
    ports = [read_port(root, name, p) for p in port_names]
    netdev = _read(ddir / "parent")  # software devices (rxe, siw) name their netdev here
    if not netdev:
        for p in ports:
            for g in p.gids:
                if g.netdev:
                    netdev = g.netdev
                    break
            if netdev:
                break
    pci, numa = pci_of(ddir / "device") if (ddir / "device").exists() else ("", -1)
    if not pci and netdev:
        pci, numa = pci_of(root / "class" / "net" / netdev / "device")
    return DeviceInfo(name, ports, netdev, pci, numa)


def list_devices(root: str | os.PathLike[str] = SYSFS) -> list[DeviceInfo]:
    base = Path(root)
    try:
        names = sorted(os.listdir(base / "class" / "infiniband"))
    except OSError:
        return []
    return [read_device(base, n) for n in names]


@dataclass(frozen=True)
class ChosenDevice:
    name: str
    port: int
    gid: GidEntry
    link_layer: str
    netdev: str
    pci: str
    numa_node: int
    active: bool


def choose_devices(
    devices: list[DeviceInfo],
    wanted: list[str] | None = None,
    gid_index: int | None = None,
) -> tuple[list[ChosenDevice], list[str]]:
    """The (device, port) pairs to open and why others were left out.

    `wanted` names devices (optionally "name:port"); by default every device port that is ACTIVE
    and has a usable GID. A wanted port that is down is still chosen (its rails fail fast until
    it comes up). `gid_index` forces a GID table index.
    """
    chosen: list[ChosenDevice] = []
    skipped: list[str] = []
    want: dict[str, int | None] | None = None
    if wanted:
        want = {}
        for w in wanted:
            name, _, port = w.partition(":")
            want[name] = int(port) if port.isdigit() else None
        missing = sorted(set(want) - {d.name for d in devices})
        skipped.extend(f"{m}: no such RDMA device" for m in missing)
    for dev in devices:
        if want is not None and dev.name not in want:
            continue
        for p in dev.ports:
            if want is not None and want[dev.name] is not None and want[dev.name] != p.port:
                continue
            if want is None and not p.active:
                skipped.append(f"{dev.name}/{p.port}: port {p.state}")
                continue
            if gid_index is not None:
                entry = next((g for g in p.gids if g.index == gid_index), None)
            else:
                entry = select_gid(p.gids, p.link_layer)
            if entry is None:
                skipped.append(f"{dev.name}/{p.port}: no usable GID")
                continue
            chosen.append(ChosenDevice(dev.name, p.port, entry, p.link_layer, dev.netdev, dev.pci, dev.numa_node, p.active))
            break  # one port per device: rails are per NIC
    return chosen, skipped


def affinity_tier(buffer_node: int, nic_node: int, distance: dict[tuple[int, int], int] | None = None) -> int:
    """Affinity tier of a NIC for memory on `buffer_node` (0 = same NUMA node, 1 = a near node,
    2 = a far one); unknown nodes count as tier 0 (nothing to prefer). `distance` is the SLIT
    table (node, node) -> distance, as /sys/devices/system/node/nodeN/distance lists it."""
    if buffer_node < 0 or nic_node < 0 or buffer_node == nic_node:
        return 0
    if distance:
        d = distance.get((buffer_node, nic_node))
        if d is not None and d <= 20:
            return 1
        return 2
    return 1


def numa_distances(root: str | os.PathLike[str] = SYSFS) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    base = Path(root) / "devices" / "system" / "node"
    try:
        nodes = sorted(int(n[4:]) for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        return out
    for n in nodes:
        row = _read(base / f"node{n}" / "distance").split()
        for j, d in enumerate(row):
            if j < len(nodes) and d.isdigit():
                out[(n, nodes[j])] = int(d)
    return out


def process_numa_node() -> int:
    """The NUMA node this process's allowed CPUs sit on, when they sit on exactly one (else -1)."""
    try:
        cpus = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return -1
    base = Path(SYSFS) / "devices" / "system" / "node"
    nodes = set()
    try:
        for n in os.listdir(base):
            if not (n.startswith("node") and n[4:].isdigit()):
                continue
            for c in cpus:
                if (base / n / f"cpu{c}").exists():
                    nodes.add(int(n[4:]))
                    break
    except OSError:
        return -1
    return nodes.pop() if len(nodes) == 1 else -1
