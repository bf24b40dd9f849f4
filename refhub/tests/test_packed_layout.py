"""A layout (reference) and a version's checksums are encoded once and spliced into messages
(protocol.PackedMap / PackedList): the wire bytes must be exactly what packing the plain maps gives,
the server must keep the encoding it validated and re-send those bytes, and the bounds still hold."""

from __future__ import annotations

import msgpack
import pytest
from refhub.protocol import MAX_REF_BYTES, PackedList, PackedMap, ProtocolError
from refhub.state import ServerState

from refhub import protocol


def _ref(seg: str, n: int = 40) -> dict:
    return {"seg": seg, "progress": 4096,
            "items": [["__pack__", 8192, 4_500_000]] + [[f"w{i:04d}", (1 << 30) + i * 4_000_000, 4_000_000] for i in range(n)],
            "total": 1 << 30, "pack": [[f"t{i:04d}", i * 18000, 17000] for i in range(n)]}


def _plain(obj: object) -> object:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


@pytest.mark.parametrize("nkeys", [1, 15, 16, 70000])
def test_spliced_encoding_is_the_plain_encoding(nkeys: int) -> None:
    ref = PackedMap(_ref("a/b"))
    cks = PackedList([0, 1, (1 << 64) - 1, ["wsum64", 7]])
    msg = {f"k{i}": i for i in range(nkeys - 1)}
    msg["src"] = {"h": 1, "ref": ref, "partial": False, "blob": b"\x00\xff"}
    top = {"rid": 3, "ok": True, "checksum": cks, "src": {"ref": ref}, "nested": {"x": {"ref": ref}}, **msg}
    for obj in (msg, top, ref, cks, {"ref": ref}):
        want = msgpack.packb(_plain(obj), use_bin_type=True)
        assert protocol.pack(obj) == want
        assert protocol.pack(obj, msgpack.packb) == want
        assert msgpack.unpackb(protocol.pack(obj), strict_map_key=False) == _plain(obj)


def test_the_server_keeps_the_validated_encoding_and_sends_it_back() -> None:
    s = ServerState()
    th = s.handle("T", {"op": "open", "rid": 1, "model": "m", "replica": "t", "shard": 0, "num_shards": 1}, 0)[0][1]["h"]
    rh = s.handle("R", {"op": "open", "rid": 1, "model": "m", "replica": "r", "shard": 0, "num_shards": 1}, 0)[0][1]["h"]
    pub_ref, cks = _ref("t/seg"), [11, 22, 33]
    # as decoded from the wire: plain dicts and lists
    wire = msgpack.unpackb(msgpack.packb({"op": "publish", "rid": 2, "h": th, "version": 1, "ref": pub_ref,
                                          "checksum": cks}), strict_map_key=False)
    assert s.handle("T", wire, 0)[0][1]["ok"]
    stored = s.handles[th].ref
    assert type(stored) is PackedMap and stored == pub_ref
    assert stored.packed == msgpack.packb(pub_ref, use_bin_type=True)
    assert s.ref_bytes_total == len(stored.packed)
    rd_ref = _ref("r/seg")
    out = s.handle("R", {"op": "replicate", "rid": 2, "h": rh, "version": 1, "ref": rd_ref}, 0)
    (client, rep), = out
    assert client == "R" and rep["ok"] and rep["src"]["ref"] is stored and rep["checksum"] == cks
    assert type(rep["checksum"]) is PackedList
    # the reply's bytes are those of the same reply made of plain maps and lists
    assert protocol.pack(rep) == msgpack.packb(_plain(rep), use_bin_type=True)
    assert msgpack.unpackb(protocol.pack(rep), strict_map_key=False)["src"]["ref"] == pub_ref
    assert type(s.handles[rh].ref) is PackedMap and s.handles[rh].ref == rd_ref
    assert s.ref_bytes_total == len(stored.packed) + len(msgpack.packb(rd_ref))
    assert s.handle("R", {"op": "replicate_done", "rid": 3, "h": rh, "ok": True}, 0)[0][1]["ok"]
    s.check_invariants()


def test_bounds_and_malformed_refs_still_refused() -> None:
    big = {"seg": "x", "items": [["n" * 200, i, i] for i in range(MAX_REF_BYTES // 200 + 1)]}
    for ref in (big, PackedMap(big)):
        with pytest.raises(ProtocolError, match="larger than"):
            protocol.validate({"op": "update", "rid": 0, "h": 0, "ref": ref})
    s = ServerState()
    out = s.handle("R", {"op": "replicate", "rid": 5, "h": 1, "version": 1, "ref": "not a map"}, 0)
    assert out[0][1]["err"] == protocol.E_BAD_MESSAGE and out[0][1]["rid"] == 5
