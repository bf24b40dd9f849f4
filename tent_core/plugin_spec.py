"""Hook specifications for transport plugins (pluggy project name ``tent``).

A plugin distribution declares, in its pyproject.toml::

    [project.entry-points."tent_core.transports"]
    tcp = "tent_tcp.plugin"

and the module implements::

    from tent_core.plugin_spec import hookimpl

    @hookimpl
    def tent_register_transports(registry):
        registry.add("tcp", TcpTransport, abi_version=EXECUTOR_ABI_VERSION, version=__version__)

The module must import cheaply and without the fabric's libraries: anything that
may be missing (libibverbs, CUDA) is loaded inside the factory or in probe().
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from .plugin_manager import TransportRegistry

PROJECT = "tent"
ENTRY_POINT_GROUP = "tent_core.transports"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def tent_register_transports(registry: TransportRegistry) -> None:
    """Add transport factories with ``registry.add(name, factory, abi_version=..., version=...)``."""
