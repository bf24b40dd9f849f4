"""`tent doctor`: what this host offers TENT, and what to fix.

Reads /sys, /proc and the installed plugins only (no traffic, no root needed): transports and why some
are unavailable, NICs with their NUMA node, RDMA devices and their ports, GPUs, NUMA nodes, the
memlock limit (RDMA registration pins memory), ptrace permission (the same-host transport's
one-sided copies), hugepages. Every finding that limits TENT comes with the fix.

The inspection functions take the filesystem root as an argument so tests can run them on a fake
tree; `report()` gathers everything into plain data (`--json` prints it as is).
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import platform
import resource
import socket
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# RDMA registration pins memory: below this memlock limit large registrations fail.
MEMLOCK_MIN_BYTES = 64 << 30
_CAP_SYS_PTRACE = 19


@dataclass
class Fix:
    area: str
    problem: str
    fix: str


@dataclass
class Report:
    host: dict[str, Any] = field(default_factory=dict)
    transports: list[dict[str, Any]] = field(default_factory=list)
    numa: list[dict[str, Any]] = field(default_factory=list)
    nics: list[dict[str, Any]] = field(default_factory=list)
    rdma: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    limits: dict[str, Any] = field(default_factory=dict)
    fixes: list[Fix] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


def _int(text: str, default: int = -1) -> int:
    try:
        return int(text, 0)
    except ValueError:
        return default


def _numa_of(dev: Path) -> int:
    """NUMA node of a device: the first numa_node found walking up its sysfs path (-1 unknown)."""
    try:
        p = dev.resolve()
    except OSError:
        return -1
    for d in (p, *p.parents):
        f = d / "numa_node"
        if f.exists():
            return _int(_read(f))
        if d.name.startswith("pci") or d == d.parent:
            break
    return -1


def _ipv4(ifname: str) -> str:
    """The interface's IPv4 address ('' if none), via SIOCGIFADDR."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return ""


def numa_nodes(root: Path = Path("/")) -> list[dict[str, Any]]:
    out = []
    base = root / "sys/devices/system/node"
    for d in sorted(base.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        mem_kb = 0
        for line in _read(d / "meminfo").splitlines():
            if "MemTotal:" in line:
                mem_kb = _int(line.split()[-2], 0)
        out.append({"node": int(d.name[4:]), "cpus": _read(d / "cpulist"), "memory_bytes": mem_kb * 1024})
    return out


def nics(root: Path = Path("/")) -> list[dict[str, Any]]:
    out = []
    base = root / "sys/class/net"
    for d in sorted(base.iterdir()) if base.exists() else []:
        name = d.name
        virtual = "devices/virtual" in str(d.resolve()) if d.is_symlink() else not (d / "device").exists()
        driver = ""
        if (d / "device/driver").exists():
            driver = (d / "device/driver").resolve().name
        speed = _int(_read(d / "speed"), -1)
        out.append(
            {
                "name": name,
                "state": _read(d / "operstate", "unknown"),
                "speed_mbps": speed if speed > 0 else None,
                "mtu": _int(_read(d / "mtu"), 0),
                "numa_node": _numa_of(d / "device") if (d / "device").exists() else -1,
                "driver": driver,
                "virtual": virtual,
                "ipv4": _ipv4(name) if root == Path("/") else "",
            }
        )
    return out


def rdma_devices(root: Path = Path("/")) -> list[dict[str, Any]]:
    out = []
    base = root / "sys/class/infiniband"
    for d in sorted(base.iterdir()) if base.exists() else []:
        ports = []
        for p in sorted((d / "ports").glob("*"), key=lambda x: _int(x.name, 0)):
            gids = [g for g in (p / "gids").glob("*") if _read(g) not in ("", "0000:0000:0000:0000:0000:0000:0000:0000")]
            ports.append(
                {
                    "port": _int(p.name, 0),
                    "state": _read(p / "state").partition(":")[2].strip() or _read(p / "state"),
                    "link_layer": _read(p / "link_layer"),
                    "rate": _read(p / "rate"),
                    "gids": len(gids),
                }
            )
        netdevs = sorted(x.name for x in (d / "device/net").glob("*")) if (d / "device/net").exists() else []
        parent = _read(d / "parent")  # soft-RoCE (rxe) names its netdev here
        out.append(
            {
                "name": d.name,
                "netdevs": netdevs or ([parent] if parent else []),
                "numa_node": _numa_of(d / "device") if (d / "device").exists() else -1,
                "node_type": _read(d / "node_type"),
                "ports": ports,
            }
        )
    return out


def gpus(root: Path = Path("/")) -> list[dict[str, Any]]:
    """NVIDIA GPUs from the driver's /proc tree, Ascend NPUs from /dev/davinci*."""
    out: list[dict[str, Any]] = []
    base = root / "proc/driver/nvidia/gpus"
    for i, d in enumerate(sorted(base.iterdir()) if base.exists() else []):
        info = {}
        for line in _read(d / "information").splitlines():
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
        bdf = d.name.lower()
        out.append(
            {
                "index": i,
                "vendor": "nvidia",
                "model": info.get("Model", ""),
                "pci": bdf,
                "numa_node": _numa_of(root / "sys/bus/pci/devices" / bdf),
            }
        )
    for i, dev in enumerate(sorted((root / "dev").glob("davinci[0-9]*"))):
        out.append({"index": i, "vendor": "huawei", "model": "Ascend NPU", "pci": dev.name, "numa_node": -1})
    return out


def _loadable(lib: str) -> str:
    """'' when the shared library loads, else the loader's message."""
    try:
        ctypes.CDLL(lib)
        return ""
    except OSError as exc:
        return str(exc)


def limits(root: Path = Path("/")) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    cap_eff = 0
    for line in _read(root / "proc/self/status").splitlines():
        if line.startswith("CapEff:"):
            cap_eff = int(line.split()[1], 16)
    scope_text = _read(root / "proc/sys/kernel/yama/ptrace_scope")
    meminfo = {}
    for line in _read(root / "proc/meminfo").splitlines():
        k, _, v = line.partition(":")
        meminfo[k] = v.split()
    hp_size = _int(meminfo.get("Hugepagesize", ["0"])[0], 0) * 1024
    thp = _read(root / "sys/kernel/mm/transparent_hugepage/enabled")
    return {
        "memlock_soft_bytes": None if soft == resource.RLIM_INFINITY else soft,
        "memlock_hard_bytes": None if hard == resource.RLIM_INFINITY else hard,
        "ptrace_scope": _int(scope_text) if scope_text else None,
        "cap_sys_ptrace": bool(cap_eff >> _CAP_SYS_PTRACE & 1),
        "hugepages_total": _int(meminfo.get("HugePages_Total", ["0"])[0], 0),
        "hugepages_free": _int(meminfo.get("HugePages_Free", ["0"])[0], 0),
        "hugepage_bytes": hp_size,
        "transparent_hugepages": thp[thp.find("[") + 1 : thp.find("]")] if "[" in thp else thp,
        "libibverbs": _loadable("libibverbs.so.1") or "loads",
        "libcuda": _loadable("libcuda.so.1") or "loads",
    }


def transports() -> list[dict[str, Any]]:
    from .plugin_manager import discover, instantiate

    rows = []
    ps = discover()
    for name, entry in sorted(ps.registry.entries.items()):
        transport, avail = instantiate(entry)
        rows.append(
            {
                "name": name,
                "distribution": entry.distribution,
                "version": entry.version,
                "available": avail.available,
                "reason": avail.reason,
            }
        )
        close = getattr(transport, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # an unstarted transport may not close cleanly; nothing leaks from doctor
                log.debug("closing an unstarted %s transport failed", name, exc_info=True)
    for b in ps.registry.broken:
        rows.append({"name": b.name, "distribution": b.distribution, "version": "", "available": False, "reason": f"broken: {b.reason}"})
    return rows


def findings(rep: Report) -> list[Fix]:
    """Pure: what limits TENT on this host and how to fix it, from the gathered facts."""
    fixes: list[Fix] = []
    lim = rep.limits
    names = {t["name"]: t for t in rep.transports}
    for t in rep.transports:
        if not t["available"]:
            fixes.append(Fix(f"transport {t['name']}", t["reason"] or "unavailable", _transport_fix(t["name"], t["reason"])))
    if "rdma" not in names:
        fixes.append(Fix("transport rdma", "the tent-rdma plugin is not installed", "pip install tent-rdma (RDMA NICs: ConnectX, EFA, soft-RoCE)"))
    if rep.rdma:
        soft = lim.get("memlock_soft_bytes")
        if soft is not None and soft < MEMLOCK_MIN_BYTES:
            fixes.append(
                Fix(
                    "memlock",
                    f"RLIMIT_MEMLOCK is {soft} bytes: RDMA cannot pin large buffers",
                    "ulimit -l unlimited (or '* - memlock unlimited' in /etc/security/limits.conf; "
                    "docker run --ulimit memlock=-1)",
                )
            )
        for dev in rep.rdma:
            for p in dev["ports"]:
                if p["state"].upper() != "ACTIVE":
                    fixes.append(Fix(f"rdma {dev['name']} port {p['port']}", f"port state {p['state']}", "check the cable/switch port and the subnet manager (ibstat)"))
                elif p["link_layer"].lower() == "ethernet" and p["gids"] == 0:
                    fixes.append(Fix(f"rdma {dev['name']} port {p['port']}", "RoCE port without a GID", "give its netdev an IP address (RoCE GIDs come from it)"))
        if lim.get("libibverbs") != "loads":
            fixes.append(Fix("libibverbs", "RDMA devices exist but libibverbs does not load", "apt-get install libibverbs1 ibverbs-providers"))
    scope = lim.get("ptrace_scope")
    if scope is not None and scope >= 1 and not lim.get("cap_sys_ptrace"):
        fixes.append(
            Fix(
                "ptrace",
                f"kernel.yama.ptrace_scope={scope}: same-host one-sided copies (process_vm_readv) between unrelated processes are refused",
                "sysctl kernel.yama.ptrace_scope=0, or grant CAP_SYS_PTRACE; otherwise tent-shm serves only engine-allocated (memfd) buffers",
            )
        )
    if rep.gpus and lim.get("libcuda") != "loads":
        fixes.append(Fix("cuda", "GPUs present but libcuda does not load", "install the NVIDIA driver's user-space library (libcuda.so.1)"))
    if lim.get("hugepages_total", 0) == 0 and lim.get("transparent_hugepages") == "never":
        fixes.append(Fix("hugepages", "no hugepages and transparent hugepages off", "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (fewer TLB misses on large buffers)"))
    multi_numa = len(rep.numa) > 1
    if multi_numa:
        for n in rep.nics:
            if not n["virtual"] and n["numa_node"] < 0:
                fixes.append(Fix(f"nic {n['name']}", "NUMA node unknown", "BIOS/firmware does not report it: rail affinity falls back to no penalty"))
    return fixes


def _transport_fix(name: str, reason: str) -> str:
    r = reason.lower()
    if "cuda" in r or "libcuda" in r:
        return "needs an NVIDIA GPU and driver (libcuda.so.1); harmless on CPU-only hosts"
    if "ibverbs" in r or "rdma" in r:
        return "needs RDMA NICs and libibverbs1 + ibverbs-providers"
    if "ptrace" in r or "process_vm" in r:
        return "allow ptrace between the processes (see ptrace below) or use engine-allocated buffers"
    if "io_uring" in r:
        return "kernel >= 5.1 with io_uring enabled (sysctl kernel.io_uring_disabled=0)"
    if name == "ascend":
        return "needs Ascend NPUs and the CANN runtime"
    return "see the reason"


def report(root: Path = Path("/"), with_transports: bool = True) -> Report:
    rep = Report()
    rep.host = {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    rep.transports = transports() if with_transports else []
    rep.numa = numa_nodes(root)
    rep.nics = nics(root)
    rep.rdma = rdma_devices(root)
    rep.gpus = gpus(root)
    rep.limits = limits(root)
    rep.fixes = findings(rep)
    return rep


def mooncake_topology(device_filter: list[str] | None = None, root: Path = Path("/")) -> dict[str, Any]:
    """Mooncake's get_local_topology shape: {"cpu:N" / "cuda:K": {"preferred_hca": [...], "avail_hca": [...]}};
    empty when the host has no RDMA device (as Mooncake reports it)."""
    devs = [d for d in rdma_devices(root) if not device_filter or d["name"] in device_filter]
    if not devs:
        return {}
    every = [d["name"] for d in devs]
    out: dict[str, Any] = {}
    for n in numa_nodes(root) or [{"node": 0}]:
        near = [d["name"] for d in devs if d["numa_node"] == n["node"]]
        out[f"cpu:{n['node']}"] = {"preferred_hca": near or every, "avail_hca": [x for x in every if x not in near]}
    for g in gpus(root):
        if g["vendor"] != "nvidia":
            continue
        near = [d["name"] for d in devs if d["numa_node"] == g["numa_node"] and g["numa_node"] >= 0]
        out[f"cuda:{g['index']}"] = {"preferred_hca": near or every, "avail_hca": [x for x in every if x not in near]}
    return out


def _gb(n: int | None) -> str:
    if n is None:
        return "unlimited"
    if n >= 1 << 30:
        return f"{n / (1 << 30):.1f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.0f} KiB"


def render(rep: Report, console: Any) -> None:
    """Rich tables, one per area, then what to fix."""
    from rich.table import Table

    h = rep.host
    console.print(f"[bold]tent doctor[/] on {h['hostname']}: kernel {h['kernel']}, {h['cpus']} CPUs, Python {h['python']}")
    t = Table(title="transports")
    for c in ("name", "distribution", "version", "status", "reason"):
        t.add_column(c)
    for r in rep.transports:
        st = "[green]available[/]" if r["available"] else "[yellow]unavailable[/]"
        t.add_row(r["name"], r["distribution"], r["version"], st, r["reason"])
    console.print(t)
    t = Table(title="NUMA nodes")
    for c in ("node", "cpus", "memory"):
        t.add_column(c)
    for n in rep.numa:
        t.add_row(str(n["node"]), n["cpus"], _gb(n["memory_bytes"]))
    console.print(t)
    t = Table(title="NICs")
    for c in ("name", "state", "speed", "mtu", "NUMA", "driver", "IPv4"):
        t.add_column(c)
    for n in rep.nics:
        speed = f"{n['speed_mbps'] / 1000:g} Gb/s" if n["speed_mbps"] else "-"
        numa = "-" if n["numa_node"] < 0 else str(n["numa_node"])
        t.add_row(n["name"], n["state"], speed, str(n["mtu"]), numa, n["driver"] or ("virtual" if n["virtual"] else ""), n["ipv4"])
    console.print(t)
    t = Table(title="RDMA devices")
    for c in ("device", "netdev", "NUMA", "port", "state", "link", "rate", "GIDs"):
        t.add_column(c)
    for d in rep.rdma:
        for p in d["ports"] or [{"port": "-", "state": "-", "link_layer": "-", "rate": "-", "gids": 0}]:
            t.add_row(d["name"], ",".join(d["netdevs"]), str(d["numa_node"]), str(p["port"]), p["state"], p["link_layer"], p["rate"], str(p["gids"]))
    if not rep.rdma:
        t.add_row("none", "", "", "", "", "", "", "")
    console.print(t)
    t = Table(title="GPUs / accelerators")
    for c in ("index", "vendor", "model", "PCI", "NUMA"):
        t.add_column(c)
    for g in rep.gpus:
        t.add_row(str(g["index"]), g["vendor"], g["model"], g["pci"], str(g["numa_node"]))
    if not rep.gpus:
        t.add_row("none", "", "", "", "")
    console.print(t)
    lim = rep.limits
    t = Table(title="limits and kernel settings")
    t.add_column("setting")
    t.add_column("value")
    scope = lim["ptrace_scope"]
    rows = [
        ("memlock (soft / hard)", f"{_gb(lim['memlock_soft_bytes'])} / {_gb(lim['memlock_hard_bytes'])}"),
        ("ptrace_scope (yama)", "not enforced (no yama)" if scope is None else str(scope)),
        ("CAP_SYS_PTRACE", "yes" if lim["cap_sys_ptrace"] else "no"),
        ("hugepages (free / total)", f"{lim['hugepages_free']} / {lim['hugepages_total']} x {_gb(lim['hugepage_bytes'])}"),
        ("transparent hugepages", lim["transparent_hugepages"] or "-"),
        ("libibverbs.so.1", lim["libibverbs"]),
        ("libcuda.so.1", lim["libcuda"]),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    t = Table(title="what to fix")
    for c in ("area", "problem", "fix"):
        t.add_column(c)
    for f in rep.fixes:
        t.add_row(f.area, f.problem, f.fix)
    if not rep.fixes:
        t.add_row("-", "nothing found", "")
    console.print(t)


__all__ = ["Fix", "Report", "findings", "gpus", "limits", "mooncake_topology", "nics", "numa_nodes", "rdma_devices", "render", "report"]
