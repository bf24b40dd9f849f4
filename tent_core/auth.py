"""Peer authentication with a cluster secret: one handshake, three carriers.

Every TENT and refhub endpoint that accepts connections (engine control ports, TCP data
listeners, the shm fd server, the refhub server and its stagers) authenticates the connecting
peer with the same challenge-response, keyed by a secret every member of the cluster shares
(``auth_token`` / ``TENT_AUTH_TOKEN``). The token itself never crosses the wire: each side
proves it knows a key derived from it, over nonces both sides chose. The wire format is fixed
size and specified in SECURITY.md so the C executors implement it without any library
(``tent/auth.h`` carries a compact SHA-256/HMAC).

Keys: ``K_root = HMAC-SHA256(token, "tent-auth-v1 root")`` and
``K_purpose = HMAC-SHA256(K_root, "tent-auth-v1 key " + purpose)``; the core's purposes are
``control``, ``tcp``, ``shm``, ``refhub``, ``refhub-stage``, a plugin uses its own name. A MAC made
for one listener is useless on another, and a process keeps only K_root, never the token.

Handshake (client C, server S, ``ctx`` = bytes both sides expect to identify S, may be empty)::

    C -> S  HELLO     "TENTAUTH" | u32 version=1 | u32 flags=0 | cnonce[32]                 48 bytes
    S -> C  CHALLENGE "TENTCHAL" | snonce[32] | smac[32]                                    72 bytes
    C -> S  RESPONSE  "TENTRESP" | cmac[32]                                                 40 bytes
    S -> C  RESULT    "TENTOK\\0\\0"  or  "TENTDENY" + reason (then S closes / forgets)

    smac    = HMAC(K, "tent-auth-v1 server\\0" | cnonce | snonce | ctx)
    cmac    = HMAC(K, "tent-auth-v1 client\\0" | cnonce | snonce | ctx)
    session = HMAC(K, "tent-auth-v1 session\\0" | cnonce | snonce | ctx)

The server proves itself first; the client checks ``smac`` (constant time) before answering,
so it never talks to an impostor. Distinct labels keep a MAC from one role useless in the
other (no reflection); fresh nonces on both sides defeat replay.

Carriers:

* byte streams (TCP, unix SOCK_STREAM/SOCK_SEQPACKET): :func:`client_handshake` /
  :func:`server_handshake`; after them the connection is trusted as a whole (a kernel-bound
  stream cannot be hijacked by another local process; an on-path network attacker is outside
  the trust model, see SECURITY.md).
* ZeroMQ ROUTER/DEALER: a ROUTER multiplexes peers by routing id, which a client may choose,
  so a trusted id is not enough. After the handshake every frame carries a tag frame:
  ``seq u64 BE | HMAC(session, dir | seq | payload)`` with ``dir`` b"c2s" or b"s2c", and
  strictly increasing ``seq`` per direction. :class:`ZmqServerAuth` / :class:`ZmqClientAuth`.

No token configured: authentication is off, which is allowed only while every listener is
bound to a loopback address (one warning per process); binding anything else without a token
is refused (:func:`resolve`).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import REQUIRE_AUTH_MODES
from .errors import TentError

log = logging.getLogger(__name__)

VERSION = 1
NONCE_BYTES = 32
MAC_BYTES = 32
MIN_TOKEN_BYTES = 16

HELLO_MAGIC = b"TENTAUTH"
CHALLENGE_MAGIC = b"TENTCHAL"
RESPONSE_MAGIC = b"TENTRESP"
OK_MAGIC = b"TENTOK\0\0"
DENY_MAGIC = b"TENTDENY"

HELLO_LEN = 8 + 4 + 4 + NONCE_BYTES  # 48
CHALLENGE_LEN = 8 + NONCE_BYTES + MAC_BYTES  # 72
RESPONSE_LEN = 8 + MAC_BYTES  # 40
RESULT_LEN = 8  # OK; a DENY may carry up to MAX_REASON more bytes
MAX_REASON = 120
TAG_LEN = 8 + MAC_BYTES  # 40

_LABEL_ROOT = b"tent-auth-v1 root"
_LABEL_KEY = b"tent-auth-v1 key "
_LABEL_SERVER = b"tent-auth-v1 server\0"
_LABEL_CLIENT = b"tent-auth-v1 client\0"
_LABEL_SESSION = b"tent-auth-v1 session\0"
C2S, S2C = b"c2s", b"s2c"

PURPOSES = frozenset({"control", "tcp", "shm", "refhub", "refhub-stage"})  # the core's; plugins add their names
_PURPOSE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.:")

REQUIRE_MODES = REQUIRE_AUTH_MODES


class AuthError(TentError, PermissionError):
    """A peer failed authentication, or authentication is required and not configured."""


class HandshakeTimeout(AuthError, TimeoutError):
    """The peer did not complete the handshake in time (it may be down)."""


class AuthRequiredError(AuthError):
    """A listener would bind a non-loopback address and no auth token is configured."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def root_key(token: bytes) -> bytes:
    """K_root = HMAC-SHA256(token, "tent-auth-v1 root")."""
    return _mac(token, _LABEL_ROOT)


def derive_key(root: bytes, purpose: str) -> bytes:
    """K_purpose = HMAC-SHA256(K_root, "tent-auth-v1 key " + purpose)."""
    if not purpose or len(purpose) > 64 or not set(purpose) <= _PURPOSE_CHARS:
        raise ValueError(f"bad auth purpose {purpose!r}: 1-64 of [a-z0-9-_.:] (a plugin uses its name)")
    return _mac(root, _LABEL_KEY, purpose.encode())


@dataclass(frozen=True)
class ClusterAuth:
    """The cluster secret, held as its root key (the token bytes are not kept)."""

    root: bytes = field(repr=False)
    fingerprint: str  # first 8 hex digits of SHA-256(token): safe to log, tells tokens apart
    _keys: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_token(cls, token: str | bytes) -> ClusterAuth:
        raw = token.encode() if isinstance(token, str) else bytes(token)
        raw = raw.strip()
        if len(raw) < MIN_TOKEN_BYTES:
            raise AuthError(
                f"auth token is {len(raw)} bytes; at least {MIN_TOKEN_BYTES} are required "
                "(generate one with `tent token`)"
            )
        return cls(root_key(raw), hashlib.sha256(raw).hexdigest()[:8])

    def key(self, purpose: str) -> bytes:
        """The key of one kind of listener: the core's PURPOSES, or a plugin's own name."""
        k = self._keys.get(purpose)
        if k is None:
            k = self._keys[purpose] = derive_key(self.root, purpose)
        return k


def new_token() -> str:
    """A fresh cluster token (256 random bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


# ------------------------------------------------------------------------- configuration
def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost"; wildcards and everything else are not."""
    h = host.strip().strip("[]")
    if h.startswith("tcp://"):
        h = h[6:]
    if h.startswith(("ipc://", "inproc://")):
        return True  # not reachable from the network
    if h.count(":") == 1:  # host:port
        h = h.rsplit(":", 1)[0]
    elif h.startswith("[") or h.count(":") > 1 and "]" in h:
        h = h.split("]")[0].lstrip("[")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def load_token(token: str = "", token_file: str = "", env: Mapping[str, str] | None = None,
               env_prefix: str = "TENT") -> str:
    """The token from (in this order) `token`, `token_file`, $<prefix>_AUTH_TOKEN, $<prefix>_AUTH_TOKEN_FILE."""
    env = os.environ if env is None else env
    if token:
        return token
    path = token_file or ""
    if not path:
        tok = env.get(f"{env_prefix}_AUTH_TOKEN", "")
        if tok:
            return tok
        path = env.get(f"{env_prefix}_AUTH_TOKEN_FILE", "")
    if path:
        try:
            st = os.stat(path)
            if st.st_mode & 0o077:
                log.warning("auth token file %s is readable by group/others (mode %o): chmod 600 it",
                            path, st.st_mode & 0o777)
            with open(path, encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError as exc:
            raise AuthError(f"cannot read auth token file {path}: {exc}") from exc
    return ""


_warned_open = False
_warn_lock = threading.Lock()


def resolve(token: str, binds: Iterable[str], *, require: str = "non_loopback", what: str = "engine") -> ClusterAuth | None:
    """Authentication for a process whose listeners bind `binds`.

    A token -> ClusterAuth. No token: refused (AuthRequiredError) if `require` is "always", or
    "non_loopback" and any bind address is not loopback; otherwise None (auth off) and one warning
    per process. `require="never"` is the explicit opt-out (warns loudly when binding non-loopback).
    """
    if require not in REQUIRE_MODES:
        raise ValueError(f"require_auth must be one of {REQUIRE_MODES}, got {require!r}")
    if token:
        return ClusterAuth.from_token(token)
    exposed = sorted({b for b in binds if not is_loopback(b)})
    if require == "always" or (require == "non_loopback" and exposed):
        where = f" ({what} binds {', '.join(exposed)})" if exposed else ""
        raise AuthRequiredError(
            f"no auth token configured{where}: set auth_token / TENT_AUTH_TOKEN (or _FILE) to the cluster "
            "secret (`tent token` makes one), bind loopback only, or set require_auth='never' to run "
            "unauthenticated on purpose"
        )
    global _warned_open
    with _warn_lock:
        first = not _warned_open
        _warned_open = True
    if exposed:
        log.warning("%s binds %s WITHOUT authentication (require_auth='never'): any host that reaches it "
                    "can read and write registered memory", what, ", ".join(exposed))
    elif first:
        log.warning("no auth token configured: peers are not authenticated (allowed because every listener "
                    "is on loopback; any local process can reach them). Set TENT_AUTH_TOKEN to enable it.")
    return None


def default_auth(binds: Iterable[str] = (), what: str = "engine", env: Mapping[str, str] | None = None) -> ClusterAuth | None:
    """Auth from the environment ($TENT_AUTH_TOKEN[_FILE], $TENT_REQUIRE_AUTH) for components not handed one."""
    env = os.environ if env is None else env
    return resolve(load_token(env=env), binds, require=env.get("TENT_REQUIRE_AUTH", "non_loopback"), what=what)


# ------------------------------------------------------------------------- the handshake
class ClientHandshake:
    """Client half, as pure message functions: hello() -> on_challenge() -> on_result()."""

    def __init__(self, key: bytes, context: bytes = b"") -> None:
        self._key = key
        self._ctx = context
        self._cnonce = os.urandom(NONCE_BYTES)
        self._snonce = b""
        self.session = b""

    def hello(self) -> bytes:
        return HELLO_MAGIC + struct.pack(">II", VERSION, 0) + self._cnonce

    def on_challenge(self, msg: bytes) -> bytes:
        if msg.startswith(DENY_MAGIC):
            raise AuthError(f"peer refused authentication: {_reason(msg)}")
        if len(msg) != CHALLENGE_LEN or not msg.startswith(CHALLENGE_MAGIC):
            raise AuthError("peer does not speak the TENT auth handshake (bad challenge)")
        snonce, smac = msg[8 : 8 + NONCE_BYTES], msg[8 + NONCE_BYTES :]
        if not hmac.compare_digest(smac, _mac(self._key, _LABEL_SERVER, self._cnonce, snonce, self._ctx)):
            raise AuthError("peer failed to prove the cluster secret (different auth token, or not the expected peer)")
        self._snonce = snonce
        self.session = _mac(self._key, _LABEL_SESSION, self._cnonce, snonce, self._ctx)
        return RESPONSE_MAGIC + _mac(self._key, _LABEL_CLIENT, self._cnonce, snonce, self._ctx)

    @staticmethod
    def on_result(msg: bytes) -> None:
        if msg[:RESULT_LEN] == OK_MAGIC and len(msg) == RESULT_LEN:
            return
        if msg.startswith(DENY_MAGIC):
            raise AuthError(f"peer refused authentication: {_reason(msg)}")
        raise AuthError("peer sent a bad handshake result")


class ServerHandshake:
    """Server half: on_hello() -> challenge; on_response() -> session key (raises AuthError)."""

    def __init__(self, key: bytes, context: bytes = b"") -> None:
        self._key = key
        self._ctx = context
        self._cnonce = b""
        self._snonce = b""

    def on_hello(self, msg: bytes) -> bytes:
        if len(msg) != HELLO_LEN or not msg.startswith(HELLO_MAGIC):
            raise AuthError("expected an auth HELLO (is the peer configured with an auth token?)")
        version, _flags = struct.unpack(">II", msg[8:16])
        if version != VERSION:
            raise AuthError(f"auth handshake version {version} not supported (this side speaks {VERSION})")
        self._cnonce = msg[16:]
        self._snonce = os.urandom(NONCE_BYTES)
        return CHALLENGE_MAGIC + self._snonce + _mac(self._key, _LABEL_SERVER, self._cnonce, self._snonce, self._ctx)

    def on_response(self, msg: bytes) -> bytes:
        if not self._snonce:
            raise AuthError("auth RESPONSE before HELLO")
        if len(msg) != RESPONSE_LEN or not msg.startswith(RESPONSE_MAGIC):
            raise AuthError("expected an auth RESPONSE")
        want = _mac(self._key, _LABEL_CLIENT, self._cnonce, self._snonce, self._ctx)
        if not hmac.compare_digest(msg[8:], want):
            raise AuthError("client failed to prove the cluster secret (wrong auth token)")
        return _mac(self._key, _LABEL_SESSION, self._cnonce, self._snonce, self._ctx)


def deny(reason: str) -> bytes:
    return DENY_MAGIC + reason.encode("utf-8", "replace")[:MAX_REASON]


def _reason(msg: bytes) -> str:
    return msg[len(DENY_MAGIC) : len(DENY_MAGIC) + MAX_REASON].decode("utf-8", "replace") or "no reason given"


# ------------------------------------------------------------------------- byte streams
def _recv_msg(sock: socket.socket, n: int, deadline: float, allow_deny: bool = True) -> bytes:
    """Exactly `n` bytes (a stream) or one message of `n` bytes (SEQPACKET); a DENY is returned whole."""
    seqpacket = sock.type == socket.SOCK_SEQPACKET
    buf = b""
    cap = n + (MAX_REASON if allow_deny else 0)
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HandshakeTimeout("authentication timed out")
        sock.settimeout(left)
        try:
            chunk = sock.recv(cap - len(buf) if seqpacket else n - len(buf))
        except TimeoutError:
            raise HandshakeTimeout("authentication timed out") from None
        if not chunk:
            if buf.startswith(DENY_MAGIC):
                return buf
            raise AuthError("peer closed the connection during authentication")
        buf += chunk
        if seqpacket or buf.startswith(DENY_MAGIC):
            # a DENY ends the exchange: take what has arrived, the peer closes after it
            return buf
    return buf


def client_handshake(sock: socket.socket, key: bytes, *, context: bytes = b"", timeout: float = 5.0) -> bytes:
    """Authenticate to the server at the other end of `sock`; returns the session key."""
    deadline = time.monotonic() + timeout
    old = sock.gettimeout()
    try:
        hs = ClientHandshake(key, context)
        sock.sendall(hs.hello())
        chal = _recv_msg(sock, CHALLENGE_LEN, deadline)
        sock.sendall(hs.on_challenge(chal))
        hs.on_result(_recv_msg(sock, RESULT_LEN, deadline))
        return hs.session
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


def server_handshake(sock: socket.socket, key: bytes, *, context: bytes = b"", timeout: float = 5.0) -> bytes:
    """Authenticate the client at the other end of `sock` (sends a DENY and raises on failure)."""
    deadline = time.monotonic() + timeout
    old = sock.gettimeout()
    hs = ServerHandshake(key, context)
    try:
        sock.sendall(hs.on_hello(_recv_msg(sock, HELLO_LEN, deadline, allow_deny=False)))
        session = hs.on_response(_recv_msg(sock, RESPONSE_LEN, deadline, allow_deny=False))
        sock.sendall(OK_MAGIC)
        return session
    except AuthError as exc:
        try:
            sock.sendall(deny(str(exc)))
        except OSError:
            pass
        raise
    finally:
        try:
            sock.settimeout(old)
        except OSError:
            pass


# ------------------------------------------------------------------------- ZeroMQ
HANDSHAKE_DENIAL = "handshake: "  # prefix of the reasons a server gives while refusing a handshake


class SessionLost(AuthError):
    """The server does not (or no longer) know this client's session: authenticate again."""


@dataclass
class _Session:
    key: bytes
    rx_seq: int = 0
    tx_seq: int = 0
    last_used: float = 0.0


def _tag(key: bytes, direction: bytes, seq: int, payload: bytes) -> bytes:
    s = struct.pack(">Q", seq)
    return s + hmac.new(key, direction + s + payload, hashlib.sha256).digest()


def _check_tag(key: bytes, direction: bytes, last_seq: int, payload: bytes, tag: bytes) -> int:
    """The tag's sequence number if it is valid and newer than `last_seq`, else raises AuthError."""
    if len(tag) != TAG_LEN:
        raise AuthError("bad message tag")
    seq = struct.unpack(">Q", tag[:8])[0]
    want = hmac.new(key, direction + tag[:8] + payload, hashlib.sha256).digest()
    if not hmac.compare_digest(tag[8:], want):
        raise AuthError("message tag does not verify")
    if seq <= last_seq:
        raise AuthError("replayed message")
    return seq


class ZmqServerAuth:
    """Sessions of the peers of one ROUTER socket (pure: no socket I/O, the caller sends replies).

    ``accept(ident, body)`` takes the frames after the routing id (and after an empty delimiter,
    if the protocol uses one) and returns ``(payload, None)`` for a request to serve, or
    ``(None, reply_body)`` for a handshake step or a refusal (send `reply_body` back untagged).
    ``wrap(ident, payload)`` returns the body of a reply. With ``key=None`` (auth off) requests
    are single frames and pass through.

    Bounded: at most `max_pending` handshakes in progress (oldest dropped, each expires after
    `handshake_timeout_s`) and `max_sessions` sessions (least recently used dropped; a dropped
    client is told to authenticate again on its next request).
    """

    def __init__(
        self,
        key: bytes | None,
        *,
        context: bytes = b"",
        max_sessions: int = 65536,
        max_pending: int = 1024,
        handshake_timeout_s: float = 10.0,
        idle_timeout_s: float = 6 * 3600.0,
    ) -> None:
        self.key = key
        self.context = context
        self.max_sessions = max_sessions
        self.max_pending = max_pending
        self.handshake_timeout_s = handshake_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._pending: OrderedDict[bytes, tuple[ServerHandshake, float]] = OrderedDict()
        self._sessions: OrderedDict[bytes, _Session] = OrderedDict()
        self.denied = 0
        self.last_denial = ""

    @property
    def enabled(self) -> bool:
        return self.key is not None

    def session_count(self) -> int:
        return len(self._sessions)

    def accept(self, ident: bytes, body: list[bytes], now: float | None = None) -> tuple[bytes | None, list[bytes] | None]:
        if self.key is None:
            if len(body) == 1 and not body[0].startswith(HELLO_MAGIC):
                return body[0], None
            if len(body) == 2 or (body and body[0].startswith(HELLO_MAGIC)):
                return None, self._deny(HANDSHAKE_DENIAL + "this endpoint has authentication off (no auth token "
                                        "configured) but the client expects it")
            return None, self._deny("malformed message (unexpected frame count)")
        now = time.monotonic() if now is None else now
        if len(body) == 1:
            msg = body[0]
            if msg.startswith(HELLO_MAGIC):
                return None, self._hello(ident, msg, now)
            if msg.startswith(RESPONSE_MAGIC):
                return None, self._response(ident, msg, now)
            return None, self._deny("authentication required (configure the cluster auth token)")
        if len(body) == 2:
            sess = self._sessions.get(ident)
            if sess is None:
                return None, self._deny("unknown session: authenticate again")
            try:
                sess.rx_seq = _check_tag(sess.key, C2S, sess.rx_seq, body[0], body[1])
            except AuthError as exc:
                return None, self._deny(str(exc))
            sess.last_used = now
            self._sessions.move_to_end(ident)
            return body[0], None
        return None, self._deny("malformed message (unexpected frame count)")

    def wrap(self, ident: bytes, payload: bytes) -> list[bytes]:
        if self.key is None:
            return [payload]
        sess = self._sessions.get(ident)
        if sess is None:  # dropped meanwhile: the client re-authenticates on its next request
            return [deny("unknown session: authenticate again")]
        sess.tx_seq += 1
        return [payload, _tag(sess.key, S2C, sess.tx_seq, payload)]

    def forget(self, ident: bytes) -> None:
        self._sessions.pop(ident, None)
        self._pending.pop(ident, None)

    def expire(self, now: float | None = None) -> None:
        """Drop expired handshakes and idle sessions (call now and then)."""
        now = time.monotonic() if now is None else now
        while self._pending:
            ident, (_, t0) = next(iter(self._pending.items()))
            if now - t0 < self.handshake_timeout_s:
                break
            del self._pending[ident]
        while self._sessions:
            ident, sess = next(iter(self._sessions.items()))
            if now - sess.last_used < self.idle_timeout_s:
                break
            del self._sessions[ident]

    def _hello(self, ident: bytes, msg: bytes, now: float) -> list[bytes]:
        assert self.key is not None
        hs = ServerHandshake(self.key, self.context)
        try:
            chal = hs.on_hello(msg)
        except AuthError as exc:
            return self._deny(HANDSHAKE_DENIAL + str(exc))
        self._pending.pop(ident, None)
        self._pending[ident] = (hs, now)
        self.expire(now)
        while len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)
        return [chal]

    def _response(self, ident: bytes, msg: bytes, now: float) -> list[bytes]:
        entry = self._pending.pop(ident, None)
        if entry is None or now - entry[1] > self.handshake_timeout_s:
            return self._deny(HANDSHAKE_DENIAL + "auth RESPONSE without a pending HELLO (or too late)")
        try:
            session = entry[0].on_response(msg)
        except AuthError as exc:
            return self._deny(HANDSHAKE_DENIAL + str(exc))
        self._sessions.pop(ident, None)
        self._sessions[ident] = _Session(session, last_used=now)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
        return [OK_MAGIC]

    def _deny(self, reason: str) -> list[bytes]:
        self.denied += 1
        self.last_denial = reason
        return [deny(reason)]


class ZmqClientAuth:
    """The client side of :class:`ZmqServerAuth` for one DEALER socket (one session at a time)."""

    def __init__(self, key: bytes | None, context: bytes = b"") -> None:
        self.key = key
        self.context = context
        self._session: _Session | None = None

    @property
    def enabled(self) -> bool:
        return self.key is not None

    @property
    def ready(self) -> bool:
        return self.key is None or self._session is not None

    def reset(self) -> None:
        self._session = None

    def wrap(self, payload: bytes) -> list[bytes]:
        if self.key is None:
            return [payload]
        if self._session is None:
            raise SessionLost("not authenticated yet")
        self._session.tx_seq += 1
        return [payload, _tag(self._session.key, C2S, self._session.tx_seq, payload)]

    def unwrap(self, body: list[bytes]) -> bytes:
        """The payload of a reply. Raises SessionLost on a DENY, AuthError on a bad or missing tag."""
        if len(body) == 1 and body[0].startswith(DENY_MAGIC):
            self._session = None
            raise SessionLost(f"server refused the request: {_reason(body[0])}")
        if self.key is None:
            if len(body) != 1:
                raise AuthError("unexpected tagged reply (the server has authentication on; configure the auth token)")
            return body[0]
        if self._session is None or len(body) != 2:
            raise AuthError("unauthenticated reply")
        self._session.rx_seq = _check_tag(self._session.key, S2C, self._session.rx_seq, body[0], body[1])
        return body[0]

    def handshake(self, sock: Any, timeout: float, prefix: list[bytes] | None = None) -> None:
        """Run the handshake on DEALER `sock` (blocking, at most `timeout` s). Frames that are not
        part of it (late replies of an older session) are discarded."""
        import zmq

        self._session = None
        if self.key is None:
            return
        prefix = prefix or []
        deadline = time.monotonic() + timeout
        hs = ClientHandshake(self.key, self.context)

        def step(out: bytes, expect: tuple[bytes, ...]) -> bytes:
            sock.send_multipart([*prefix, out])
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(max(1, int(left * 1000))):
                    raise HandshakeTimeout(f"authentication timed out after {timeout:g}s")
                frames = sock.recv_multipart(zmq.NOBLOCK)
                body = frames[len(prefix):]
                # a DENY of an older session's request may still be queued: only a handshake DENY counts
                if len(body) == 1 and body[0].startswith(expect + (DENY_MAGIC + HANDSHAKE_DENIAL.encode(),)):
                    return body[0]

        chal = step(hs.hello(), (CHALLENGE_MAGIC,))
        result = step(hs.on_challenge(chal), (OK_MAGIC,))
        hs.on_result(result)
        self._session = _Session(hs.session)


def from_config(cfg: Any, binds: Iterable[str], what: str = "engine") -> ClusterAuth | None:
    """Auth for an engine built from `EngineConfig` (token, token file, require_auth)."""
    return resolve(load_token(cfg.auth_token, cfg.auth_token_file), binds, require=cfg.require_auth, what=what)
