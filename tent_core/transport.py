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
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from .auth import ClusterAuth, default_auth, resolve
from .errors import ConfigError, ProtocolError
from .types import Availability, BufferInfo, CapabilityProfile, PeerInfo, PeerLink

# Keys the engine puts into every transport's section (they may be set there too): a slice that
# moves no byte for this long fails with TENT_E_TIMEOUT (from EngineConfig.slice_timeout_s).
CORE_CONFIG_KEYS: Mapping[str, Any] = {"slice_timeout_ms": 500}
_FROM_ENV: Any = object()


def resolve_config(name: str, keys: Mapping[str, Any], section: Mapping[str, Any] | None) -> dict[str, Any]:
    """Transport `name`'s config: the defaults in `keys` (plus :data:`CORE_CONFIG_KEYS`) overlaid
    with `section`. A key nobody declared is refused, naming the known ones; a value is converted
    to its default's type (TOML and environment strings), None defaults take any value."""
    from .config import _coerce  # the engine config's own conversion rules

    known = {**CORE_CONFIG_KEYS, **keys}
    section = dict(section or {})
    unknown = sorted(set(section) - set(known))
    if unknown:
        raise ConfigError(
            f"transports.{name}: unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"{name} accepts: {', '.join(sorted(known))}"
        )
    out = dict(known)
    for key, value in section.items():
        default = known[key]
        if default is None or value is None:
            out[key] = value
        elif isinstance(default, bool) and type(value) is int and value in (0, 1):
            out[key] = bool(value)
        else:
            where = f"transports.{name}.{key}"
            try:
                out[key] = _coerce(value, default, where)
            except (TypeError, ValueError) as exc:
                msg = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
                raise ConfigError(f"{msg} (default {default!r})") from exc
    return out


@dataclass(frozen=True)
class AccessControl:
    """What a link refuses by itself, below the core's own initiator-side checks (the core checks
    every request against the peer's advertised buffers before submitting). The conformance kit
    tests exactly what is claimed here and reports the rest as skipped with `reason`."""

    bounds: bool = True  # slices outside the peer's registered buffers fail with TENT_E_BOUNDS
    permission: bool = True  # slices against a buffer's permission fail with TENT_E_PERMISSION
    revocation: bool = True  # once the peer's release_buffer() returned, slices into that buffer fail
    reason: str = ""  # why something is not enforced


class TransportContext:
    """What the engine hands a transport at start()."""

    def __init__(
        self,
        *,
        engine_id: str,
        host_id: str,
        config: dict[str, Any],
        bind_host: str,
        auth: ClusterAuth | None = _FROM_ENV,
        require_auth: str | None = None,
    ) -> None:
        self.engine_id = engine_id
        self.host_id = host_id
        self.config = config  # this transport's section of the engine config
        self.bind_host = bind_host  # the address the engine's control port listens on
        self._auth = auth
        # when a missing token is an error (EngineConfig.require_auth; default from $TENT_REQUIRE_AUTH)
        self.require_auth = require_auth or os.environ.get("TENT_REQUIRE_AUTH", "non_loopback")

    @property
    def auth(self) -> ClusterAuth | None:
        """The cluster secret (None: authentication off, loopback only). A transport authenticates
        every connection its listeners accept with ``auth.key(<its purpose>)`` (tent_core.auth);
        when the engine did not pass one, it comes from $TENT_AUTH_TOKEN[_FILE]."""
        if self._auth is _FROM_ENV:
            self._auth = default_auth([self.bind_host], what="transport")
        return self._auth

    def check_exposure(self, binds: list[str], what: str = "transport") -> None:
        """A transport without `auth` about to listen on `binds`: raises AuthRequiredError unless the
        engine's require_auth policy allows it (loopback only, by default)."""
        if self.auth is None:
            resolve("", binds, require=self.require_auth, what=what)


class Transport(abc.ABC):
    """One fabric. Instances are per engine."""

    name: str = ""
    version: str = "0"
    # This transport's config keys (its section `transports.<name>` of the engine config) with
    # their defaults: the one place they are published. The engine refuses a section with any
    # other key; start() gets the defaults overlaid with the section (see resolve_config).
    config_keys: ClassVar[Mapping[str, Any]] = {}
    # On a single rail, requests longer than this are cut into slices of this size so the
    # executor can run them in parallel (0 = hand the executor whole requests; it may split).
    split_bytes: int = 0
    # Slices up to this long may be run (a copy) or sent (a network request) on the submitting
    # thread, through the executor's optional submit_inline (executor_abi.h): no hand-off to a
    # worker, no wake-up on the critical path. 0 = never. Ignored when the executor lacks it.
    inline_bytes: int = 0
    # One request of at most this many bytes run inline is complete when submit returns (the
    # submitting thread copied it: a same-host copy), not merely sent; 0 = no such guarantee.
    # Callers may then do work on the landed bytes right after submit, on the same core.
    inline_completes_bytes: int = 0
    # Such an inline READ (up to inline_bytes) is copied by the executor itself, which folds the bytes
    # into the digest armed for the submit (``engine.submit(..., digest=d)``, tent/digest.h) as it
    # copies them, while they are in this core's cache. False: the caller folds them afterwards.
    inline_digest: bool = False
    # READ answers, on whatever thread receives them, fold into the digest armed for the submit whose
    # stream range holds their destination (``engine.submit(..., digest=[d1, d2, ...])``; one digest per
    # stream, ``Digest(start, end)``): each received run right after it landed; runs of a stream that
    # land out of order (several connections) are folded in order as the gaps close (tent/digest.h).
    # The caller then folds only what was not (``Digest.land(buffer)`` of the landed range).
    receive_digest: bool = False
    # Waiting READs (``engine.submit_when``, tent_wait_t in executor_abi.h): the target answers a READ
    # only once a word in its registered memory reached a range (or fails it, E_NOT_READY). The
    # engine arms conditions only for peers whose every route declares this; others are refused.
    wait_read: bool = False

    def word_written(self) -> None:
        """This process advanced a word its waiting READs' conditions may name (``wait_read``): READs
        parked on it look again now. Called often (the engine's ``word_written``): keep it cheap. A
        transport that polls its parked READs' words on a timer may ignore it."""

    def wait_config(self, max_parked: int, max_wait_ms: int) -> Mapping[str, Any] | None:
        """Entries of this transport's config section (merged over the given one) under which its
        target parks at most `max_parked` waiting READs at once (more are answered E_NOT_READY at
        once, never queued) and parks one for up to `max_wait_ms` (no shorter cap of its own, on
        either side). For the conformance kit's waiting-READ checks: a short cap would turn a READ
        the kit holds parked on a loaded host into a timed-out one, and the bound is checked by
        exceeding it. None (the default): no such entries; the kit then runs those checks with the
        section as given and skips the bound check."""
        return None

    @abc.abstractmethod
    def probe(self) -> Availability:
        """Cheap, side-effect free check: is the hardware/library here?"""

    @abc.abstractmethod
    def capabilities(self) -> CapabilityProfile: ...

    @abc.abstractmethod
    def start(self, ctx: TransportContext) -> None:
        """Create the executor, open listeners. Called once, after probe() said available.
        Read the config through ``self.resolve_config(ctx.config)``."""

    def resolve_config(self, section: Mapping[str, Any] | None) -> dict[str, Any]:
        """`section` checked against :attr:`config_keys` and completed with their defaults."""
        return resolve_config(self.name, self.config_keys, section)

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

    def buffer_unreachable(self, peer: PeerInfo, buffer: Mapping[str, Any], link: PeerLink | None) -> str | None:
        """Why this transport can never move bytes to or from the peer's registered `buffer`, or None
        when it can (or cannot tell yet). `buffer` is one entry of the peer's description: ``addr``,
        ``length``, ``perm``, ``kind`` and ``desc`` (every transport's per-buffer descriptor, as its
        export_buffer() returned it on the peer). `link` is this transport's link to the peer once
        connected (the answer may depend on what connect negotiated), None before: answer from the
        descriptors alone and return None when only connecting would tell.

        The core asks on the control path, never per request: when it reads the peer's buffers and
        after connect. A transport named here is left out of every plan for that buffer: another
        transport serves it, or the request fails at submit with this reason (instead of its slices
        failing retryably until the deadline). Optional; the default serves everything its
        capabilities() admit."""
        return None

    @abc.abstractmethod
    def connect(self, peer: PeerInfo, remote_buffers: list[dict[str, Any]]) -> PeerLink:
        """Prepare to move data with `peer`. `remote_buffers` are the peer's buffers
        (addr, length, perm, kind and this transport's per-buffer descriptor).
        May be called again when the peer's buffer list changed."""

    def access_control(self, link: PeerLink) -> AccessControl:
        """What `link` refuses by itself (see :class:`AccessControl`); everything by default."""
        return AccessControl()

    def abort_rail(self, link: PeerLink, rail: int, in_flight: bool = True) -> int:
        """The engine paused this rail: hand its queued slices back now (status E_REROUTED, so they
        are re-routed untouched) and, with `in_flight`, cut the ones being served short with a
        retryable status instead of each waiting out a timeout. Optional; returns how many queued
        slices were handed back."""
        return 0

    def handle_control(self, body: Any) -> dict[str, Any]:
        """A message from a peer's instance of this transport, sent over the engine's control
        plane (``{"op": "transport", "transport": name, "body": body}``); returns the reply map
        (``{"ok": True, ...}``). For handshakes such as RDMA's QP exchange. Raise
        :class:`tent_core.errors.ProtocolError` on a malformed body: the peer gets an error reply."""
        raise ProtocolError(f"transport {self.name} takes no control messages")

    def disconnect(self, link: PeerLink) -> None:
        """Forget a peer (it died or the engine closes)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop threads, close listeners, destroy the executor."""

    def rail_names(self) -> list[str]:
        """Local rails (interfaces) for display."""
        return []
