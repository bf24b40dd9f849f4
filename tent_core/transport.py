"""The transport plugin interface.

A transport plugin is a pip-installable distribution that registers, under the
entry-point group ``tent_core.transports``, a module implementing the
``tent_register_transports`` hook (see :mod:`tent_core.plugin_spec`). The hook adds a
factory returning a :class:`Transport`.

Division of labour: the core owns resolution, slicing, rail scheduling, retries and
completion accounting. A transport owns only its fabric: it advertises a descriptor,
exports/releases local buffers, connects to peers (returning rails), and provides a
compiled slice executor (:class:`tent_core.executor.Executor`) the core submits to.
"""

from __future__ import annotations

import abc
from typing import Any

from .types import Availability, BufferInfo, CapabilityProfile, PeerInfo, PeerLink


class TransportContext:
    """What the engine hands a transport at start()."""

    def __init__(self, *, engine_id: str, host_id: str, config: dict[str, Any], bind_host: str) -> None:
        self.engine_id = engine_id
        self.host_id = host_id
        self.config = config  # this transport's section of the engine config
        self.bind_host = bind_host  # the address the engine's control port listens on


class Transport(abc.ABC):
    """One fabric. Instances are per engine."""

    name: str = ""
    version: str = "0"
    # On a single rail, requests longer than this are cut into slices of this size so the
    # executor can run them in parallel (0 = hand the executor whole requests; it may split).
    split_bytes: int = 0
    # Slices up to this long may be run (a copy) or sent (a network request) on the submitting
    # thread, through the executor's optional submit_inline (executor_abi.h): no hand-off to a
    # worker, no wake-up on the critical path. 0 = never. Ignored when the executor lacks it.
    inline_bytes: int = 0

    @abc.abstractmethod
    def probe(self) -> Availability:
        """Cheap, side-effect free check: is the hardware/library here?"""

    @abc.abstractmethod
    def capabilities(self) -> CapabilityProfile: ...

    @abc.abstractmethod
    def start(self, ctx: TransportContext) -> None:
        """Create the executor, open listeners. Called once, after probe() said available."""

    @property
    @abc.abstractmethod
    def executor(self) -> Any:
        """The compiled slice executor (a :class:`tent_core.executor.Executor`)."""

    @abc.abstractmethod
    def local_descriptor(self) -> dict[str, Any]:
        """msgpack-able description peers need to reach us (addresses, ports, pid...)."""

    def export_buffer(self, buf: BufferInfo) -> dict[str, Any] | None:
        """A local buffer was registered; make it reachable. Returns a per-buffer opaque
        descriptor advertised to peers (or None)."""
        return None

    def release_buffer(self, buf: BufferInfo) -> None:
        """A local buffer is being unregistered; after return no peer may touch it."""

    def can_reach(self, peer: PeerInfo) -> str | None:
        """None if this transport can talk to `peer`, else the reason it cannot."""
        return None if self.name in peer.transports else f"peer does not offer {self.name}"

    @abc.abstractmethod
    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        """Prepare to move data with `peer`. `remote_buffers` are the peer's buffers
        (addr, length, perm, kind and this transport's per-buffer descriptor).
        May be called again when the peer's buffer list changed."""

    def abort_rail(self, link: PeerLink, rail: int) -> int:
        """The engine paused this rail (it looks dead): fail its queued and in-flight slices now
        with a retryable status so they are re-routed, instead of each waiting out a timeout.
        Optional; returns how many queued slices were handed back."""
        return 0

    def disconnect(self, link: PeerLink) -> None:
        """Forget a peer (it died or the engine closes)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop threads, close listeners, destroy the executor."""

    def rail_names(self) -> list[str]:
        """Local rails (interfaces) for display."""
        return []
