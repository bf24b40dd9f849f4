"""Discovering transport plugins through pluggy entry points.

Discovery survives broken plugins: each entry point is loaded on its own inside a
try/except (pluggy's bulk loader aborts on the first failure); failures are
remembered with their reason for ``tent plugins``. Environment knobs:
``TENT_PLUGINS`` (comma-separated allowlist of entry-point names) and
``TENT_DISABLED_PLUGINS`` (blocklist).
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from . import plugin_spec
from .executor import EXECUTOR_ABI_VERSION
from .transport import Transport
from .types import Availability

log = logging.getLogger(__name__)


@dataclass
class TransportEntry:
    name: str
    factory: Callable[[], Transport]
    abi_version: int
    version: str
    distribution: str = ""
    description: str = ""


@dataclass
class BrokenPlugin:
    name: str
    distribution: str
    reason: str


class TransportRegistry:
    """Handed to ``tent_register_transports``; plugins call :meth:`add`."""

    def __init__(self) -> None:
        self.entries: dict[str, TransportEntry] = {}
        self.broken: list[BrokenPlugin] = []
        self._current_dist = ""

    def add(
        self,
        name: str,
        factory: Callable[[], Transport],
        *,
        abi_version: int,
        version: str = "0",
        description: str = "",
    ) -> None:
        if abi_version != EXECUTOR_ABI_VERSION:
            self.broken.append(
                BrokenPlugin(name, self._current_dist, f"executor ABI {abi_version}, core speaks {EXECUTOR_ABI_VERSION}")
            )
            return
        if name in self.entries:
            log.warning("transport %r registered twice; keeping the first (%s)", name, self.entries[name].distribution)
            return
        self.entries[name] = TransportEntry(name, factory, abi_version, version, self._current_dist, description)


@dataclass
class PluginSet:
    registry: TransportRegistry
    manager: pluggy.PluginManager
    probes: dict[str, Availability] = field(default_factory=dict)


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var, "").strip()
    return {p.strip() for p in raw.split(",") if p.strip()} if raw else None


def discover(extra_plugins: list[Any] | None = None, autoload: bool = True) -> PluginSet:
    """Load every installed transport plugin, skipping (and recording) broken ones.

    `extra_plugins` are plugin objects/modules registered directly (tests, embedders).
    """
    pm = pluggy.PluginManager(plugin_spec.PROJECT)
    pm.add_hookspecs(plugin_spec)
    registry = TransportRegistry()
    allow = _env_list("TENT_PLUGINS")
    block = _env_list("TENT_DISABLED_PLUGINS") or set()
    if autoload:
        for ep in md.entry_points(group=plugin_spec.ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist else ""
            if ep.name in block or (allow is not None and ep.name not in allow):
                log.debug("plugin %s disabled by environment", ep.name)
                continue
            if pm.get_plugin(ep.name) is not None:
                continue
            try:
                module = ep.load()
                pm.register(module, name=ep.name)
            except Exception as exc:  # a broken plugin must not stop the engine
                reason = f"{type(exc).__name__}: {exc}"
                log.warning("transport plugin %s (%s) failed to load: %s", ep.name, dist, reason)
                registry.broken.append(BrokenPlugin(ep.name, dist, reason))
                continue
            registry._current_dist = dist
            try:
                module.tent_register_transports(registry=registry)
            except Exception as exc:
                reason = f"tent_register_transports raised {type(exc).__name__}: {exc}"
                log.warning("transport plugin %s: %s", ep.name, reason)
                registry.broken.append(BrokenPlugin(ep.name, dist, reason))
                pm.unregister(module)
            registry._current_dist = ""
    for plugin in extra_plugins or []:
        pm.register(plugin)
        registry._current_dist = getattr(plugin, "__name__", type(plugin).__name__)
        plugin.tent_register_transports(registry=registry)
        registry._current_dist = ""
    pm.check_pending()
    return PluginSet(registry, pm)


def instantiate(entry: TransportEntry) -> tuple[Transport | None, Availability]:
    """Create a transport and probe it; never raises."""
    try:
        transport = entry.factory()
    except Exception as exc:
        return None, Availability.unavailable(f"factory failed: {type(exc).__name__}: {exc}")
    try:
        avail = transport.probe()
    except Exception as exc:
        avail = Availability.unavailable(f"probe failed: {type(exc).__name__}: {exc}")
    return transport, avail
