"""Cluster metadata directory: engines publish themselves under a fixed name, peers look them up.

The embedded peer-to-peer exchange stays the default: every engine answers ``describe`` on its own
control port and a peer is named by that port (``host:port``). A *directory* is the option for
clusters: each engine publishes, under a name it chooses (``config.directory.name``, e.g. the
Mooncake-style server name ``10.0.0.5:12345``), what a peer needs to reach it, and peers resolve
names only through the directory:

- ``<prefix>engines/<name>/engine``: identity, control endpoint, pid, host identity and every
  transport's descriptor (for the TCP transport: its rails, with address and nominal rate);
- ``<prefix>engines/<name>/segments/<segment>``: the buffers of one segment (offset, address,
  length, permission, kind and the transports' opaque descriptors).

Every key of an engine hangs off one lease that the engine keeps alive; an engine that dies (even by
SIGKILL) stops renewing it and the cluster forgets it within ``lease_ttl_s``. A directory that lost
the lease (etcd restarted, a long pause) re-grants one and re-publishes what it owns.

Values are msgpack (no pickle; transport descriptors may hold bytes). `EtcdDirectory` talks to
etcd's v3 JSON gateway with the standard library only (the ``etcd3`` package is unmaintained and
breaks with current protobuf).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import urllib.error
import urllib.request
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgpack

from . import errors

if TYPE_CHECKING:
    from .config import DirectoryConfig

log = logging.getLogger(__name__)

#: At most this many keys are read per engine lookup (segments of one engine).
MAX_KEYS_PER_ENGINE = 4096
#: Values larger than this are refused before they reach etcd (its default request limit is 1.5 MiB).
MAX_VALUE_BYTES = 1 << 20


class DirectoryError(errors.TentError):
    """The directory service failed or refused a request."""


class NameTakenError(DirectoryError):
    """Another live engine already holds this name."""


def _pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


class Directory(ABC):
    """Where engines find each other. One instance belongs to one engine (it owns one lease)."""

    url: str

    @abstractmethod
    def claim(self, name: str, engine: dict[str, Any], is_alive: Callable[[dict[str, Any]], bool]) -> None:
        """Publish `engine` under `name`, or raise NameTakenError if a live engine holds it.

        A previous holder that `is_alive` says is gone (a crashed engine whose lease has not yet
        expired) is replaced at once, so a restarted engine can take its old name immediately."""

    @abstractmethod
    def publish_segment(self, name: str, segment: str, buffers: list[dict[str, Any]] | None) -> None:
        """Set (None: remove) the buffers of one segment of the engine `name` this directory claimed."""

    @abstractmethod
    def lookup(self, name: str) -> dict[str, Any] | None:
        """`{"engine": ..., "segments": {segment: buffers}}` of the engine `name`, or None if unknown."""

    @abstractmethod
    def names(self) -> list[str]:
        """Names of every engine currently in the directory."""

    @abstractmethod
    def close(self) -> None:
        """Withdraw everything this directory published (revoke the lease) and stop renewing it."""


def parse_etcd_endpoints(spec: str) -> list[str]:
    """'etcd://h:p', 'h:p', 'http://h:p', lists separated by ',' or ';' -> ['http://h:p', ...]."""
    text = spec.strip()
    if text.startswith("etcd://"):
        text = text[len("etcd://") :]
    out = []
    for part in text.replace(";", ",").split(","):
        part = part.strip().rstrip("/")
        if not part:
            continue
        if part.startswith("https://"):
            raise DirectoryError(f"etcd endpoint {part!r}: TLS endpoints are not supported; use an http:// endpoint")
        if not part.startswith("http://"):
            part = "http://" + part
        host, _, port = part[len("http://") :].rpartition(":")
        if not host or not port.isdigit():
            raise DirectoryError(f"etcd endpoint {part!r} must look like host:port")
        out.append(part)
    if not out:
        raise DirectoryError(f"no etcd endpoint in {spec!r}")
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with `prefix` (etcd range_end)."""
    b = bytearray(prefix)
    while b:
        if b[-1] < 0xFF:
            b[-1] += 1
            return bytes(b)
        b.pop()
    return b"\x00"


class EtcdDirectory(Directory):
    """The directory on etcd (v3 API through its JSON gateway, stdlib HTTP only)."""

    def __init__(
        self,
        endpoints: str | list[str],
        *,
        prefix: str = "tent/",
        lease_ttl_s: float = 10.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.endpoints = parse_etcd_endpoints(endpoints) if isinstance(endpoints, str) else [e.rstrip("/") for e in endpoints]
        self.url = "etcd://" + ",".join(e[len("http://") :] for e in self.endpoints)
        if lease_ttl_s < 1:
            raise DirectoryError(f"lease_ttl_s must be >= 1 s (etcd's granularity), got {lease_ttl_s}")
        self.prefix = prefix
        self.ttl = int(round(lease_ttl_s))
        self.timeout = timeout_s
        self.instance = uuid.uuid4().hex  # tells our own record from another engine's under the same name
        self._lock = threading.Lock()
        self._owned: dict[bytes, bytes] = {}  # key -> value we published (re-published after a lost lease)
        self._lease: str | None = None
        self._ep = 0
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None
        self._check_server()

    # ------------------------------------------------------------------ HTTP
    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST to the gateway; tries every endpoint once, starting with the last good one."""
        data = json.dumps(body).encode()
        last: Exception | None = None
        for i in range(len(self.endpoints)):
            ep = self.endpoints[(self._ep + i) % len(self.endpoints)]
            req = urllib.request.Request(ep + path, data=data, headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    out = json.loads(resp.read() or b"{}")
                self._ep = (self._ep + i) % len(self.endpoints)
                return out
            except urllib.error.HTTPError as exc:
                try:
                    detail = json.loads(exc.read() or b"{}")
                except ValueError:
                    detail = {}
                raise DirectoryError(f"etcd {ep}{path}: {detail.get('error') or exc}", ) from exc
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = exc
                continue
        raise DirectoryError(f"no etcd endpoint answered ({', '.join(self.endpoints)}): {last}")

    def _check_server(self) -> None:
        last: Exception | None = None
        for ep in self.endpoints:
            try:
                with urllib.request.urlopen(ep + "/version", timeout=self.timeout) as resp:
                    info = json.loads(resp.read())
                log.debug("etcd %s: server %s", ep, info.get("etcdserver"))
                return
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = exc
        raise DirectoryError(f"cannot reach etcd at {', '.join(self.endpoints)}: {last}")

    def _range(self, key: bytes, prefix: bool = False, limit: int = 0) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(_prefix_end(key))
        if limit:
            body["limit"] = limit
        return self._call("/v3/kv/range", body).get("kvs", [])

    # ------------------------------------------------------------------ lease
    def _grant(self) -> str:
        lease = str(self._call("/v3/lease/grant", {"TTL": self.ttl})["ID"])
        log.debug("etcd lease %s granted (ttl %ds)", lease, self.ttl)
        return lease

    def _ensure_lease(self) -> str:
        if self._lease is None:
            self._lease = self._grant()
            if self._keeper is None:
                self._keeper = threading.Thread(target=self._keepalive, name="tent-etcd-lease", daemon=True)
                self._keeper.start()
        return self._lease

    def _put(self, key: bytes, value: bytes) -> None:
        """Put under our lease; a lost lease is re-granted once and everything owned re-published."""
        for attempt in range(2):
            lease = self._ensure_lease()
            try:
                self._call("/v3/kv/put", {"key": _b64(key), "value": _b64(value), "lease": lease})
                return
            except DirectoryError as exc:
                if attempt or "lease not found" not in str(exc):
                    raise
                self._lease = None
                self._republish()

    def _republish(self) -> None:
        lease = self._ensure_lease()
        for k, v in list(self._owned.items()):
            self._call("/v3/kv/put", {"key": _b64(k), "value": _b64(v), "lease": lease})
        if self._owned:
            log.warning("etcd lease was lost; re-published %d key(s) under lease %s", len(self._owned), lease)

    def _keepalive(self) -> None:
        period = max(0.2, self.ttl / 3)
        while not self._stop.wait(period):
            with self._lock:
                if self._lease is None or self._stop.is_set():
                    continue
                try:
                    rep = self._call("/v3/lease/keepalive", {"ID": self._lease})
                    ttl = int(rep.get("result", {}).get("TTL", 0))
                    if ttl <= 0:
                        self._lease = None
                        self._republish()
                except DirectoryError as exc:
                    # keep trying: entries survive until the TTL runs out; afterwards _republish restores them
                    log.warning("etcd keepalive failed: %s", exc)

    # ------------------------------------------------------------------ keys
    def _engine_prefix(self, name: str) -> bytes:
        if not name or "/" in name:
            raise DirectoryError(f"engine name must be non-empty and contain no '/', got {name!r}")
        return f"{self.prefix}engines/{name}/".encode()

    def claim(self, name: str, engine: dict[str, Any], is_alive: Callable[[dict[str, Any]], bool]) -> None:
        base = self._engine_prefix(name)
        key = base + b"engine"
        segs = base + b"segments/"
        record = dict(engine, instance=self.instance)
        value = _pack(record)
        with self._lock:
            lease = self._ensure_lease()
            put = {"request_put": {"key": _b64(key), "value": _b64(value), "lease": lease}}
            for _ in range(3):
                rep = self._call(
                    "/v3/kv/txn",
                    {
                        "compare": [{"key": _b64(key), "target": "CREATE", "create_revision": "0"}],
                        "success": [put],
                        "failure": [{"request_range": {"key": _b64(key)}}],
                    },
                )
                if rep.get("succeeded"):
                    break
                kvs = rep.get("responses", [{}])[0].get("response_range", {}).get("kvs", [])
                if not kvs:
                    continue  # it vanished meanwhile: try to create again
                old = _unpack(base64.b64decode(kvs[0]["value"]))
                if old.get("instance") != self.instance and is_alive(old):
                    raise NameTakenError(
                        f"engine name {name!r} is held by a live engine (control {old.get('control')}, pid {old.get('pid')})"
                    )
                log.info("engine name %s: replacing a stale record (pid %s)", name, old.get("pid"))
                # take over only if nobody changed it since we looked; drop the old engine's segments
                rep = self._call(
                    "/v3/kv/txn",
                    {
                        "compare": [{"key": _b64(key), "target": "MOD", "mod_revision": kvs[0]["mod_revision"]}],
                        "success": [
                            {"request_delete_range": {"key": _b64(segs), "range_end": _b64(_prefix_end(segs))}},
                            put,
                        ],
                    },
                )
                if rep.get("succeeded"):
                    break
            else:
                raise DirectoryError(f"could not claim engine name {name!r}: it keeps changing")
            self._owned[key] = value

    def publish_segment(self, name: str, segment: str, buffers: list[dict[str, Any]] | None) -> None:
        key = self._engine_prefix(name) + b"segments/" + segment.encode()
        with self._lock:
            if buffers is None:
                self._owned.pop(key, None)
                self._call("/v3/kv/deleterange", {"key": _b64(key)})
                return
            value = _pack(buffers)
            if len(value) > MAX_VALUE_BYTES:
                raise DirectoryError(
                    f"segment {segment!r} has too many buffers for one directory entry ({len(value)} bytes)"
                )
            self._put(key, value)
            self._owned[key] = value

    def lookup(self, name: str) -> dict[str, Any] | None:
        base = self._engine_prefix(name)
        kvs = self._range(base, prefix=True, limit=MAX_KEYS_PER_ENGINE)
        engine: dict[str, Any] | None = None
        segments: dict[str, Any] = {}
        for kv in kvs:
            key = base64.b64decode(kv["key"])[len(base) :].decode()
            try:
                value = _unpack(base64.b64decode(kv.get("value", "")))
            except Exception as exc:
                log.warning("directory entry %s/%s is not valid msgpack: %s", name, key, exc)
                continue
            if key == "engine":
                engine = value
            elif key.startswith("segments/"):
                segments[key[len("segments/") :]] = value
        if engine is None:
            return None  # segments left without an engine record: an engine half torn down
        return {"engine": engine, "segments": segments}

    def names(self) -> list[str]:
        base = f"{self.prefix}engines/".encode()
        body = {"key": _b64(base), "range_end": _b64(_prefix_end(base)), "keys_only": True}
        out = []
        for kv in self._call("/v3/kv/range", body).get("kvs", []):
            rest = base64.b64decode(kv["key"])[len(base) :].decode()
            name, _, leaf = rest.rpartition("/")
            if leaf == "engine":
                out.append(name)
        return sorted(out)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            lease, self._lease = self._lease, None
            self._owned.clear()
        if lease is not None:
            try:
                self._call("/v3/lease/revoke", {"ID": lease})
            except DirectoryError as exc:
                log.info("etcd lease revoke failed (entries expire in %ds): %s", self.ttl, exc)
        if self._keeper is not None:
            self._keeper.join(timeout=self.timeout + 1)


class EngineDirectory:
    """An engine's use of a directory: publishes its record and segments, describes peers by name."""

    def __init__(
        self,
        directory: Directory,
        name: str,
        control: str,
        describe: Callable[[], dict[str, Any]],
        control_client: Callable[[str], Any] | None = None,
    ) -> None:
        self.directory = directory
        self._control_client = control_client
        self.name = name
        self.control = control
        self._describe = describe
        self._lock = threading.Lock()

    def start(self) -> None:
        """Claim the name and publish every segment the engine has now."""
        desc = self._describe()
        record = {
            "engine_id": self.name,
            "control": self.control,
            "host_id": desc["host_id"],
            "pid": desc["pid"],
            "transports": desc["transports"],
        }
        with self._lock:
            self.directory.claim(self.name, record, lambda rec: _answers_ping(rec, self._control_client))
            for segment, buffers in desc["segments"].items():
                self.directory.publish_segment(self.name, segment, buffers)
        log.info("engine %s published in %s (control %s)", self.name, self.directory.url, self.control)

    def segment_changed(self, segment: str) -> None:
        """Re-publish one segment (after register/unregister); the latest state always wins."""
        with self._lock:
            buffers = self._describe()["segments"].get(segment)
            try:
                self.directory.publish_segment(self.name, segment, buffers)
            except DirectoryError as exc:
                raise errors.TentError(f"could not publish segment {segment!r} in {self.directory.url}: {exc}") from exc

    def describe_peer(self, name: str) -> dict[str, Any]:
        """The peer's description in the shape of the control port's ``describe`` answer."""
        try:
            entry = self.directory.lookup(name)
        except DirectoryError as exc:
            raise errors.PeerUnreachableError(f"looking up {name!r} in {self.directory.url} failed: {exc}") from exc
        if entry is None:
            raise errors.PeerUnreachableError(f"no engine named {name!r} in {self.directory.url}")
        eng = entry["engine"]
        return {
            "ok": True,
            "engine_id": name,
            "control": eng.get("control"),
            "host_id": eng["host_id"],
            "pid": eng["pid"],
            "transports": eng["transports"],
            "segments": entry["segments"],
        }

    def close(self) -> None:
        self.directory.close()


def _answers_ping(record: dict[str, Any], control_client: Callable[[str], Any] | None = None) -> bool:
    """Is the engine behind a directory record still alive? (its control port answers a ping;
    `control_client` makes the engine's authenticated clients)"""
    from .metadata import ControlClient

    endpoint = record.get("control")
    if not endpoint:
        return False
    client = (control_client or ControlClient)(str(endpoint))
    try:
        return bool(client.call({"op": "ping"}, 1.0).get("ok"))
    except errors.TentError:
        return False
    finally:
        client.close()


def open_directory(url: str, *, prefix: str = "tent/", lease_ttl_s: float = 10.0, timeout_s: float = 2.0) -> Directory:
    """A directory from its URL: ``etcd://host:port[,host:port...]`` (a bare ``host:port`` is etcd too)."""
    scheme, sep, _ = url.partition("://")
    if sep and scheme not in ("etcd", "http"):
        raise DirectoryError(f"unsupported metadata directory {url!r}: only etcd:// is supported")
    return EtcdDirectory(url, prefix=prefix, lease_ttl_s=lease_ttl_s, timeout_s=timeout_s)


def bind_engine(
    config: DirectoryConfig,
    name: str,
    control: str,
    describe: Callable[[], dict[str, Any]],
    control_client: Callable[[str], Any] | None = None,
) -> EngineDirectory:
    """Open the directory `config.url` and publish the engine `name` there (its record and every
    segment `describe` lists). On failure nothing stays behind (no lease, no keepalive thread)."""
    directory = open_directory(config.url, prefix=config.prefix, lease_ttl_s=config.lease_ttl_s, timeout_s=config.timeout_s)
    binding = EngineDirectory(directory, name, control, describe, control_client)
    try:
        binding.start()
    except BaseException:
        binding.close()  # revokes the lease and stops its keepalive thread
        raise
    return binding


__all__ = [
    "bind_engine",
    "Directory",
    "DirectoryError",
    "EngineDirectory",
    "EtcdDirectory",
    "NameTakenError",
    "open_directory",
    "parse_etcd_endpoints",
]
