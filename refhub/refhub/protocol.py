"""Wire protocol of the refhub reference server: msgpack maps, validated, never pickle.

A request is a msgpack map ``{"op": str, "rid": int, ...fields}``; a frame may also carry a msgpack
array of such maps (a client multiplexing many handles batches them; the replies to one frame come
back batched per destination too). Replies are maps ``{"rid": int, "ok": bool, ...}``; an error
reply has ``ok=False``, ``err`` (a short code) and ``msg``. Unsolicited server events are maps
``{"ev": str, "h": int, ...}``: ``release`` (``version``) tells an offload replica its copy is no
longer needed; ``serving`` (``version``) tells a handle still receiving ``version`` that a reader was
routed to its partial copy (pipeline replication), so its pull keeps its progress word close behind
its landed bytes (the client's REFHUB_WAIT_FULL "auto"). Clients ignore events they do not know.

Fields per op (name: accepted types, required?):
"""

from __future__ import annotations

from typing import Any

import msgpack

# Error codes.
E_BAD_MESSAGE = "bad_message"
E_UNKNOWN_HANDLE = "unknown_handle"
E_UNAVAILABLE = "unavailable"
E_STATE = "bad_state"
E_TXN = "txn_mismatch"
E_BARRIER = "barrier_timeout"
E_TIMEOUT = "timeout"
E_MODEL = "model_mismatch"
E_NOT_OWNER = "not_owner"
E_LIMIT = "limit"

# Bounds on every numeric and string field (a peer must not be able to make the server allocate
# per its numbers, nor wait forever). Versions share a 64-bit progress word with a 40-bit byte count.
MAX_SHARDS = 4096
MAX_VERSION = (1 << 24) - 1
MAX_BYTES = (1 << 40) - 1
MAX_KEEP_LATEST = 1024
MAX_WAIT_S = 24 * 3600.0
MAX_ID = (1 << 63) - 1
MAX_NAME = 256  # model, replica, datacenter names (UTF-8 characters)
MAX_HB_HANDLES = 65536
MAX_CHECKSUMS = 1 << 20
MAX_REF_BYTES = 4 << 20  # a reference (segment, layout) as packed: replies carry it to every reader
CID_BYTES = (8, 64)  # a client id (owner credential) is 8..64 bytes
KINDS = ("normal", "offload")

_INT = (int,)
_STR = (str,)
_BOOL = (bool,)
_NUM = (int, float)
_MAP = (dict,)
_VERSION = (int, str)
_LIST = (list, tuple)
_CID = (bytes, str)

# op -> {field: (types, required)}. Every op also accepts "cid" (the client's owner credential) and
# "rid". A field present with value nil is an error unless it is listed in NULLABLE.
SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "open": {
        "model": (_STR, True),
        "replica": (_STR, True),
        "shard": (_INT, True),
        "num_shards": (_INT, True),
        "datacenter": (_STR, False),
        "spot": (_BOOL, False),
        "retain": (_MAP, False),
        "kind": (_STR, False),
    },
    "hb": {"hs": (_LIST, True)},
    "publish": {"h": (_INT, True), "version": (_INT, True), "ref": (_MAP, False), "checksum": ((str, int, list, bytes), False)},
    "unpublish": {"h": (_INT, True)},
    "replicate": {"h": (_INT, True), "version": (_VERSION, True), "ref": (_MAP, False), "txn": (_INT, False)},
    "update": {"h": (_INT, True), "ref": (_MAP, False), "txn": (_INT, False)},
    "progress": {"h": (_INT, True), "done": (_INT, False), "failed": (_BOOL, False), "corrupt": (_BOOL, False)},
    "replicate_done": {"h": (_INT, True), "ok": (_BOOL, False)},
    "list": {"h": (_INT, False), "model": (_STR, False)},
    "wait": {"h": (_INT, True), "pred": (_MAP, True), "timeout": (_NUM, False)},
    "close": {"h": (_INT, True)},
    "stats": {},
}
NULLABLE = frozenset({("open", "retain"), ("open", "datacenter"), ("open", "kind"), ("open", "spot"),
                      ("publish", "ref"), ("publish", "checksum"), ("replicate", "ref"), ("update", "ref")})
_COMMON: dict[str, tuple[tuple[type, ...], bool]] = {"cid": (_CID, False)}

# Copy mode: requests a reader sends straight to a holder's stager (not to the reference server).
# stage: copy bytes [off, off+len) of tensor `item` of version `v` into a free staging slot; the
# reply is {"rid", "ok": True, "slot": int, "roff": segment offset of the slot}. release: the slot
# may be reused (no reply).
STAGE_SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "stage": {"v": (_INT, True), "item": (_STR, True), "off": (_INT, True), "len": (_INT, True)},
    "release": {"slot": (_INT, True)},
}

TXN_OPS = frozenset({"replicate", "update", "list", "wait"})

PREDICATES = {
    "version_at_least": _INT,  # some version >= v is available
    "version_available": _INT,  # version v is available
    "replicas_at_least": _LIST,  # [v, n]: version v has >= n complete replicas
    "version_gone": _INT,  # version v is no longer available anywhere
}


class ProtocolError(ValueError):
    """A malformed message."""


def validate_stage(msg: Any) -> str:
    """Check one stager request (copy mode); return its op. Raises ProtocolError."""
    op = _check_fields(msg, STAGE_SCHEMA)
    if op == "stage":
        if not (0 <= msg["off"] <= MAX_BYTES and 0 < msg["len"] <= MAX_BYTES and 0 <= msg["v"] <= MAX_VERSION):
            raise ProtocolError("stage: need 0 <= off, 0 < len (both < 2**40) and a valid version")
        _check_str(op, "item", msg["item"], 4096)
    elif not 0 <= msg["slot"] <= MAX_ID:
        raise ProtocolError("release: slot out of range")
    return op


def _check_fields(msg: Any, schema: dict) -> str:
    if not isinstance(msg, dict):
        raise ProtocolError(f"a request must be a map, got {type(msg).__name__}")
    op = msg.get("op")
    if not isinstance(op, str):
        raise ProtocolError("missing or non-string 'op'")
    fields = schema.get(op)
    if fields is None:
        raise ProtocolError(f"unknown op {op[:40]!r}")
    rid = msg.get("rid", 0)
    if not isinstance(rid, int) or isinstance(rid, bool) or not 0 <= rid <= MAX_ID:
        raise ProtocolError("'rid' must be an int in [0, 2**63)")
    for name, (types, required) in (fields | _COMMON).items():
        if name not in msg:
            if required:
                raise ProtocolError(f"op {op!r}: missing field {name!r}")
            continue
        val = msg[name]
        if val is None:
            if required or (op, name) not in NULLABLE:
                raise ProtocolError(f"op {op!r}: field {name!r} must not be nil")
            continue
        if not isinstance(val, types) or (isinstance(val, bool) and bool not in types):
            raise ProtocolError(f"op {op!r}: field {name!r} must be {'/'.join(t.__name__ for t in types)}")
        if isinstance(val, int) and not isinstance(val, bool) and not -MAX_ID <= val <= MAX_ID:
            raise ProtocolError(f"op {op!r}: field {name!r} is out of range")
    return op


def _check_str(op: str, name: str, val: Any, limit: int = MAX_NAME) -> None:
    if isinstance(val, str) and (not val or len(val) > limit):
        raise ProtocolError(f"op {op!r}: {name!r} must be 1..{limit} characters")


# a device tensor's checksum is computed where it lives, tagged with its algorithm (refhub.device)
WSUM64 = "wsum64"
DEVICE_CHECKSUM_ALGOS = (WSUM64,)


def _is_checksum(c: Any) -> bool:
    if type(c) is int:
        return True
    return isinstance(c, list) and len(c) == 2 and c[0] in DEVICE_CHECKSUM_ALGOS and type(c[1]) is int


def _check_version(op: str, v: Any) -> None:
    if not 0 <= v <= MAX_VERSION:
        raise ProtocolError(f"op {op!r}: version must be in [0, {MAX_VERSION}]")


def _check_handle(op: str, h: Any) -> None:
    if not 0 <= h <= MAX_ID:
        raise ProtocolError(f"op {op!r}: bad handle id")


def validate(msg: Any, out: dict | None = None) -> str:
    """Check one request map; return its op. Raises ProtocolError with a readable reason.

    After this, every field a handler reads has its type and is within its bounds: handlers do not
    fail on input (and so never leave a half-done transaction behind). With `out`, a 'ref' comes
    back as out["ref"], a PackedMap holding the encoding this check made (the size bound needs it;
    the server then stores and re-sends that encoding instead of packing the layout again)."""
    op = _check_fields(msg, SCHEMA)
    cid = msg.get("cid")
    if cid is not None and not CID_BYTES[0] <= len(cid) <= CID_BYTES[1]:
        raise ProtocolError(f"'cid' must be {CID_BYTES[0]}..{CID_BYTES[1]} bytes")
    if "h" in msg and msg["h"] is not None:
        _check_handle(op, msg["h"])
    if op == "open":
        for name in ("model", "replica", "datacenter", "kind"):
            _check_str(op, name, msg.get(name))
        if not 1 <= msg["num_shards"] <= MAX_SHARDS:
            raise ProtocolError(f"open: num_shards must be in [1, {MAX_SHARDS}]")
        if not 0 <= msg["shard"] < msg["num_shards"]:
            raise ProtocolError("open: need 0 <= shard < num_shards")
        if msg.get("kind") is not None and msg["kind"] not in KINDS:
            raise ProtocolError(f"open: kind must be one of {KINDS}")
        retain = msg.get("retain")
        if retain is not None:
            if set(retain) - {"keep_latest"}:
                raise ProtocolError("open: retain takes only keep_latest")
            k = retain.get("keep_latest", 0)
            if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= MAX_KEEP_LATEST:
                raise ProtocolError(f"open: retain.keep_latest must be an int in [0, {MAX_KEEP_LATEST}]")
    elif op == "hb":
        hs = msg["hs"]
        if len(hs) > MAX_HB_HANDLES or not all(type(h) is int and 0 <= h <= MAX_ID for h in hs):
            raise ProtocolError(f"hb: 'hs' must be a list of at most {MAX_HB_HANDLES} handle ids")
    elif op == "publish":
        _check_version(op, msg["version"])
        cks = msg.get("checksum")
        if isinstance(cks, list) and (len(cks) > MAX_CHECKSUMS or not all(_is_checksum(c) for c in cks)):
            raise ProtocolError("publish: 'checksum' must be a list of ints or [algorithm, int] pairs")
    elif op == "replicate":
        parse_version(msg["version"])
    elif op == "progress":
        if "done" in msg and not 0 <= msg["done"] <= MAX_BYTES:
            raise ProtocolError("progress: 'done' must be in [0, 2**40)")
    elif op == "list":
        _check_str(op, "model", msg.get("model"))
    elif op == "wait":
        t = msg.get("timeout", 30.0)
        if not (isinstance(t, (int, float)) and t == t and 0 <= t <= MAX_WAIT_S):  # t == t: not NaN
            raise ProtocolError(f"wait: timeout must be a finite number of seconds in [0, {MAX_WAIT_S:g}]")
        pred = msg["pred"]
        if len(pred) != 1:
            raise ProtocolError("wait: 'pred' must have exactly one key")
        ((name, arg),) = pred.items()
        want = PREDICATES.get(name) if isinstance(name, str) else None
        if want is None:
            raise ProtocolError(f"wait: unknown predicate {str(name)[:40]!r}")
        if not isinstance(arg, want) or isinstance(arg, bool):
            raise ProtocolError(f"wait: predicate {name!r} has a bad argument")
        if name == "replicas_at_least":
            if len(arg) != 2 or not all(type(x) is int for x in arg) or not (0 <= arg[0] <= MAX_VERSION and 0 <= arg[1] <= MAX_ID):
                raise ProtocolError("wait: replicas_at_least takes [version, count]")
        elif not 0 <= arg <= MAX_VERSION:
            raise ProtocolError(f"wait: predicate {name!r} needs a version in [0, {MAX_VERSION}]")
    if "txn" in msg and not 0 <= msg["txn"] <= MAX_ID:
        raise ProtocolError("'txn' out of range")
    ref = msg.get("ref")
    if ref is not None:
        if type(ref) is PackedMap:
            packed = ref.packed
        else:
            try:
                packed = pack(ref)
            except (OverflowError, TypeError, ValueError) as exc:  # a message built in-process can hold what msgpack cannot carry
                raise ProtocolError(f"op {op!r}: 'ref' cannot be packed ({exc})") from None
        if len(packed) > MAX_REF_BYTES:
            raise ProtocolError(f"op {op!r}: 'ref' is larger than {MAX_REF_BYTES} bytes packed")
        if out is not None:
            out["ref"] = ref if type(ref) is PackedMap else PackedMap(ref, packed)
    return op


def parse_version(spec: int | str) -> tuple[str, int]:
    """Return ("abs", v) or ("rel", k) for "latest"/"latest-k". Raises ProtocolError."""
    if isinstance(spec, bool):
        raise ProtocolError("version must be an int or 'latest[-k]'")
    if isinstance(spec, int):
        if not 0 <= spec <= MAX_VERSION:
            raise ProtocolError(f"version must be in [0, {MAX_VERSION}]")
        return ("abs", spec)
    if spec == "latest":
        return ("rel", 0)
    if spec.startswith("latest-"):
        tail = spec[7:]
        if tail.isascii() and tail.isdigit() and len(tail) <= 8 and int(tail) <= MAX_VERSION:
            return ("rel", int(tail))
    raise ProtocolError(f"bad version {spec[:40]!r}: an int, 'latest' or 'latest-k'")


_packer = msgpack.Packer(use_bin_type=True)


class PackedMap(dict):
    """A map that carries its own msgpack encoding, made once: a layout (reference) the server keeps
    per handle and sends to every reader, or a client's own layout it sends with every pull. `pack`
    splices the bytes in where it meets one (the wire bytes are what packing the map gives), so a
    500-tensor layout is not re-encoded per request. Never mutated after it is made: the bytes
    would go stale."""

    __slots__ = ("packed",)

    def __init__(self, obj: dict, packed: bytes | None = None) -> None:
        super().__init__(obj)
        self.packed = _packer.pack(obj) if packed is None else packed


class PackedList(list):
    """A list with its msgpack encoding made once (a version's per-tensor checksums); as PackedMap."""

    __slots__ = ("packed",)

    def __init__(self, obj: list, packed: bytes | None = None) -> None:
        super().__init__(obj)
        self.packed = _packer.pack(obj) if packed is None else packed


_PACKED = (PackedMap, PackedList)


def _map_head(n: int) -> bytes:
    return bytes([0x80 | n]) if n < 16 else (b"\xde" + n.to_bytes(2, "big") if n < 65536 else b"\xdf" + n.to_bytes(4, "big"))


def _has_packed(obj: dict, depth: int) -> bool:
    for v in obj.values():
        t = type(v)
        if t in _PACKED or (t is dict and depth > 1 and _has_packed(v, depth - 1)):
            return True
    return False


def _spliced(obj: dict, packb: Any, depth: int) -> bytes:
    """obj's encoding with its PackedMap/PackedList values (at most `depth` maps down) spliced in."""
    parts = [_map_head(len(obj))]
    for k, v in obj.items():
        parts.append(packb(k))
        t = type(v)
        if t in _PACKED:
            parts.append(v.packed)
        elif t is dict and depth > 1 and _has_packed(v, depth - 1):
            parts.append(_spliced(v, packb, depth - 1))
        else:
            parts.append(packb(v))
    return b"".join(parts)


def pack(obj: Any, packb: Any = None) -> bytes:
    """msgpack of obj (bin type for bytes), reusing the encoding of PackedMap/PackedList values found
    in obj or in a map inside it (a reply's source reference), and of obj itself if it is one.
    `packb`: the packer to use from threads other than the server's (the shared Packer is the
    server loop's)."""
    t = type(obj)
    if t in _PACKED:
        return obj.packed
    pb = packb or _packer.pack
    if t is dict and _has_packed(obj, 2):
        return _spliced(obj, pb, 2)
    return pb(obj)


def ref_bytes(ref: Any) -> int:
    """Size of a reference as packed (its own encoding when it carries one)."""
    return len(ref.packed) if type(ref) is PackedMap else len(_packer.pack(ref))


def unpack(data: bytes) -> Any:
    """Decode a frame. Raises ProtocolError for anything that is not msgpack."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"not msgpack: {exc.__class__.__name__}") from None


def error(rid: int, code: str, msg: str) -> dict[str, Any]:
    return {"rid": rid, "ok": False, "err": code, "msg": msg}
