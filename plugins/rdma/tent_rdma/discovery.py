"""Device inventory for `tent plugins` and the probe: devices, ports, link state, GIDs.

pyverbs (rdma-core's Python binding; Debian ``python3-pyverbs`` or ``pip install
tent-rdma[pyverbs]``) is used when it imports; otherwise the same facts come from libibverbs
(through the executor library) and sysfs. The data path never needs pyverbs.
"""

from __future__ import annotations

import logging
from typing import Any

from . import topology

log = logging.getLogger(__name__)

_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_LAYERS = {0: "Unspecified", 1: "InfiniBand", 2: "Ethernet"}


def pyverbs_inventory() -> list[dict[str, Any]] | None:
    """[{device, port, state, link_layer, active_mtu, gids: [(index, gid)]}] through pyverbs, or
    None when pyverbs is not importable or cannot list devices."""
    try:
        import pyverbs.device as pd  # type: ignore[import-not-found]
    except ImportError:
        return None
    out: list[dict[str, Any]] = []
    try:
        devices = pd.get_device_list()
    except Exception as exc:  # pyverbs raises its own PyverbsRDMAError
        log.debug("pyverbs cannot list devices: %s", exc)
        return None
    for dev in devices:
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        try:
            with pd.Context(name=name) as ctx:
                attr = ctx.query_device()
                for port in range(1, attr.phys_port_cnt + 1):
                    pattr = ctx.query_port(port)
                    gids = []
                    for idx in range(min(pattr.gid_tbl_len, 16)):
                        try:
                            g = str(ctx.query_gid(port, idx))
                        except Exception:
                            continue
                        if g and g.strip("0:"):
                            gids.append((idx, g))
                    out.append(
                        {
                            "device": name,
                            "port": port,
                            "state": _STATES.get(int(pattr.state), str(pattr.state)),
                            "link_layer": _LAYERS.get(int(pattr.link_layer), str(pattr.link_layer)),
                            "active_mtu": 128 << int(pattr.active_mtu),
                            "gids": gids,
                        }
                    )
        except Exception as exc:
            log.debug("pyverbs cannot query %s: %s", name, exc)
    return out


def sysfs_inventory(root: str = topology.SYSFS) -> list[dict[str, Any]]:
    out = []
    for dev in topology.list_devices(root):
        for p in dev.ports:
            out.append(
                {
                    "device": dev.name,
                    "port": p.port,
                    "state": p.state,
                    "link_layer": p.link_layer,
                    "netdev": dev.netdev,
                    "numa": dev.numa_node,
                    "pci": dev.pci,
                    "gids": [(g.index, g.gid) for g in p.gids if g.gid.strip("0:")],
                }
            )
    return out


def inventory() -> tuple[str, list[dict[str, Any]]]:
    """(source, rows): pyverbs when importable, else sysfs."""
    rows = pyverbs_inventory()
    if rows is not None:
        return "pyverbs", rows
    return "sysfs", sysfs_inventory()


def summary(rows: list[dict[str, Any]], source: str) -> str:
    parts = []
    for r in rows:
        gid = ""
        if r.get("gids"):
            gid = f" gids {len(r['gids'])}"
        parts.append(f"{r['device']}/{r['port']} {r['state']} {r['link_layer']}{gid}")
    return f"{'; '.join(parts) or 'no devices'} (via {source})"
