"""Wire protocol of the refhub reference server: msgpack maps, validated, never pickle.

A request is a msgpack map ``{"op": str, "rid": int, ...fields}``; a frame may also carry a msgpack
array of such maps (a client multiplexing many handles batches them; the replies to one frame come
back batched per destination too). Replies are maps ``{"rid": int, "ok": bool, ...}``; an error
reply has ``ok=False``, ``err`` (a short code) and ``msg``. Unsolicited server events are maps
``{"ev": str, "h": int, ...}`` (e.g. ``release`` of an offload replica).

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

_INT = (int,)
_STR = (str,)
_BOOL = (bool,)
_NUM = (int, float)
_MAP = (dict,)
_VERSION = (int, str)
_LIST = (list, tuple)

# op -> {field: (types, required)}
SCHEMA: dict[str, dict[str, tuple[tuple[type, ...], bool]]] = {
    "open": {
        "model": (_STR, True),
        "replica": (_STR, True),
        "shard": (_INT, True),
        "num_shards": (_INT, True),
        "datacenter": (_STR, False),
        "spot": (_BOOL, False),
        "retain": (_MAP + (type(None),), False),
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
    if op == "stage" and (msg["off"] < 0 or msg["len"] <= 0):
        raise ProtocolError("stage: need off >= 0 and len > 0")
    return op


def _check_fields(msg: Any, schema: dict) -> str:
    if not isinstance(msg, dict):
        raise ProtocolError(f"a request must be a map, got {type(msg).__name__}")
    op = msg.get("op")
    if not isinstance(op, str):
        raise ProtocolError("missing or non-string 'op'")
    fields = schema.get(op)
    if fields is None:
        raise ProtocolError(f"unknown op {op!r}")
    rid = msg.get("rid", 0)
    if not isinstance(rid, int) or isinstance(rid, bool):
        raise ProtocolError("'rid' must be an int")
    for name, (types, required) in fields.items():
        val = msg.get(name)
        if val is None:
            if required:
                raise ProtocolError(f"op {op!r}: missing field {name!r}")
            continue
        if not isinstance(val, types) or (isinstance(val, bool) and bool not in types):
            raise ProtocolError(f"op {op!r}: field {name!r} must be {'/'.join(t.__name__ for t in types)}")
    return op


def validate(msg: Any) -> str:
    """Check one request map; return its op. Raises ProtocolError with a readable reason."""
    op = _check_fields(msg, SCHEMA)
    if op == "open":
        if msg["shard"] < 0 or msg["num_shards"] < 1 or msg["shard"] >= msg["num_shards"]:
            raise ProtocolError("open: need 0 <= shard < num_shards")
        retain = msg.get("retain")
        if retain is not None:
            k = retain.get("keep_latest", 0)
            if not isinstance(k, int) or isinstance(k, bool) or k < 0:
                raise ProtocolError("open: retain.keep_latest must be a non-negative int")
    elif op == "hb":
        if not all(isinstance(h, int) for h in msg["hs"]):
            raise ProtocolError("hb: 'hs' must be a list of ints")
    elif op == "replicate":
        parse_version(msg["version"])
    elif op == "wait":
        pred = msg["pred"]
        if len(pred) != 1:
            raise ProtocolError("wait: 'pred' must have exactly one key")
        ((name, arg),) = pred.items()
        want = PREDICATES.get(name)
        if want is None:
            raise ProtocolError(f"wait: unknown predicate {name!r}")
        if not isinstance(arg, want) or isinstance(arg, bool):
            raise ProtocolError(f"wait: predicate {name!r} has a bad argument")
        if name == "replicas_at_least" and (len(arg) != 2 or not all(isinstance(x, int) for x in arg)):
            raise ProtocolError("wait: replicas_at_least takes [version, count]")
    return op


def parse_version(spec: int | str) -> tuple[str, int]:
    """Return ("abs", v) or ("rel", k) for "latest"/"latest-k". Raises ProtocolError."""
    if isinstance(spec, bool):
        raise ProtocolError("version must be an int or 'latest[-k]'")
    if isinstance(spec, int):
        if spec < 0:
            raise ProtocolError("version must be >= 0")
        return ("abs", spec)
    if spec == "latest":
        return ("rel", 0)
    if spec.startswith("latest-"):
        tail = spec[7:]
        if tail.isdigit():
            return ("rel", int(tail))
    raise ProtocolError(f"bad version {spec!r}: an int, 'latest' or 'latest-k'")


_packer = msgpack.Packer(use_bin_type=True)


def pack(obj: Any) -> bytes:
    return _packer.pack(obj)


def unpack(data: bytes) -> Any:
    """Decode a frame. Raises ProtocolError for anything that is not msgpack."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"not msgpack: {exc.__class__.__name__}") from None


def error(rid: int, code: str, msg: str) -> dict[str, Any]:
    return {"rid": rid, "ok": False, "err": code, "msg": msg}
