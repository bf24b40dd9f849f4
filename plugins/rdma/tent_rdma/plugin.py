"""Entry point module (group ``tent_core.transports``): registers the RDMA transport."""

from __future__ import annotations

from typing import Any

from tent_core.executor import EXECUTOR_ABI_VERSION
from tent_core.plugin_spec import hookimpl

from . import __version__


@hookimpl
def tent_register_transports(registry: Any) -> None:
    from .transport import RdmaTransport

    registry.add(
        "rdma",
        RdmaTransport,
        abi_version=EXECUTOR_ABI_VERSION,
        version=__version__,
        description="one-sided RDMA READ/WRITE over RC QPs (libibverbs, multi-NIC)",
    )
