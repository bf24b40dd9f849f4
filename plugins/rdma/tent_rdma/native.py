"""ctypes bindings for the RDMA executor library (``tent_rdma._executor``).

Besides the standard ``tent_executor_ops`` the library exports ``rdma_*`` control functions
(see csrc/rdma_executor.c for their contracts). Loading the library never loads libibverbs:
that happens at the first call that needs it (probe or create).
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tent_core.executor import Executor, PluginLibrary

PACKAGE_DIR = Path(__file__).parent

vp, i32, u32, i64, u64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64
cp = ctypes.c_char_p
P = ctypes.POINTER


class RdmaLibrary(PluginLibrary):
    PREFIX = "rdma_"
    PROTOTYPES: ClassVar[dict[str, tuple[Any, list[Any]]]] = {
        "library_status": (i32, [cp, ctypes.c_size_t]),
        "has_dmabuf": (i32, []),
        "probe": (i32, [cp, ctypes.c_size_t]),
        "map_wc_status": (i32, [i32, i32]),
        "plan_chunks": (u64, [u64, u64, u64, P(u64)]),
        "device_info": (i32, [vp, i32, P(u64), P(ctypes.c_uint8)]),
        "register": (i32, [vp, u64, u64, u32, P(u32)]),
        "register_dmabuf": (i32, [vp, i32, u64, u64, u64, u32, P(u32)]),
        "unregister": (i32, [vp, u64, u64]),
        "add_peer": (i64, [vp, i32, P(i32), P(i32), i32]),
        "peer_shape": (i32, [vp, i64, P(i32)]),
        "qp_info": (i32, [vp, i64, i32, i32, P(u32), P(u32), P(i32)]),
        "connect_qp": (i32, [vp, i64, i32, i32, u32, u32, P(ctypes.c_uint8), u32, i32, i32]),
        "collect_broken": (i32, [vp, P(i64), P(i32), P(i32), i32]),
        "release_claim": (i32, [vp, i64, i32, i32]),
        "release_deferred": (i32, [vp, i64, i32, i32]),
        "reset_qp": (i32, [vp, i64, i32, i32, P(u32), P(u32)]),
        "set_regions": (i32, [vp, i64, i32, P(u64), P(u64), P(u32), P(u32)]),
        "remove_peer": (None, [vp, i64]),
        "abort_rail": (i32, [vp, i64, i32]),
        "rail_counters": (i32, [vp, i64, i32, P(u64), i32]),
        "port_active": (i32, [vp, i32]),
        "accept_qp": (i64, [vp, i32, u32, u32, P(ctypes.c_uint8), u32, i32, P(u32), P(u32)]),
        "release_qp": (i32, [vp, i64]),
        "passive_count": (i32, [vp]),
    }


_lib: RdmaLibrary | None = None
_lib_lock = threading.Lock()


def get_lib() -> RdmaLibrary:
    """The compiled library (FileNotFoundError when the plugin was not built)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = RdmaLibrary(PACKAGE_DIR)
        return _lib


def library_status() -> str | None:
    """None when libibverbs loads; otherwise why not."""
    lib = get_lib()
    err = ctypes.create_string_buffer(512)
    return None if lib.library_status(err, len(err)) == 0 else err.value.decode(errors="replace")


@dataclass(frozen=True)
class VerbsPort:
    """One (device, port) as libibverbs reports it (rdma_probe)."""

    device: str
    port: int
    state: int  # 4 = ACTIVE
    active_mtu: int  # IB enum 1..5
    link_layer: int  # 1 IB, 2 Ethernet
    max_msg_sz: int
    gid_tbl_len: int
    lid: int
    max_qp_wr: int
    max_sge: int
    max_qp_rd_atom: int
    max_qp_init_rd_atom: int
    max_mr_size: int

    @property
    def active(self) -> bool:
        return self.state == 4


def parse_probe(text: str) -> list[VerbsPort]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 13:
            continue
        out.append(VerbsPort(f[0], *(int(x) for x in f[1:13])))
    return out


def probe_ports() -> list[VerbsPort]:
    """Every (device, port) libibverbs sees; RuntimeError with the reason when it cannot look."""
    lib = get_lib()
    buf = ctypes.create_string_buffer(16384)
    n = lib.probe(buf, len(buf))
    if n < 0:
        raise RuntimeError(buf.value.decode(errors="replace"))
    return parse_probe(buf.value.decode(errors="replace"))


def map_wc_status(wc_status: int, permitted: bool) -> int:
    return int(get_lib().map_wc_status(wc_status, 1 if permitted else 0))


def plan_chunks(length: int, chunk: int, max_msg: int) -> tuple[int, int]:
    per = u64()
    n = get_lib().plan_chunks(length, chunk, max_msg, ctypes.byref(per))
    return int(n), int(per.value)


def _u8_16(data: bytes) -> Any:
    if len(data) != 16:
        raise ValueError("a GID is 16 bytes")
    return (ctypes.c_uint8 * 16).from_buffer_copy(data)


def _ptr(arr: np.ndarray, ctype: Any) -> Any:
    return arr.ctypes.data_as(P(ctype))


class RdmaExecutor:
    """An executor instance plus typed access to its private control functions."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._lib = get_lib()
        self.executor: Executor = self._lib.library.create(config)
        self._lock = threading.Lock()

    def _h(self) -> int:
        h = self.executor.handle
        if not h:
            raise RuntimeError("rdma executor is closed")
        return h

    @staticmethod
    def _check(rc: int, what: str) -> int:
        if rc < 0:
            raise OSError(-rc, f"{what}: {os.strerror(-rc)}")
        return rc

    def device_info(self, dev: int) -> dict[str, Any]:
        out = (u64 * 8)()
        gid = (ctypes.c_uint8 * 16)()
        self._check(self._lib.device_info(self._h(), dev, out, gid), "rdma_device_info")
        keys = ("port_active", "mtu", "link_layer", "lid", "max_msg", "max_qp_wr", "rd_atom", "gid_index")
        info: dict[str, Any] = {k: int(out[i]) for i, k in enumerate(keys)}
        info["gid"] = bytes(gid)
        return info

    def register(self, addr: int, length: int, perm: int, ndev: int) -> list[int]:
        keys = (u32 * ndev)()
        self._check(self._lib.register(self._h(), addr, length, perm, keys), "ibv_reg_mr")
        return [int(k) for k in keys]

    def register_dmabuf(self, fd: int, offset: int, length: int, iova: int, perm: int, ndev: int) -> list[int]:
        keys = (u32 * ndev)()
        self._check(self._lib.register_dmabuf(self._h(), fd, offset, length, iova, perm, keys), "ibv_reg_dmabuf_mr")
        return [int(k) for k in keys]

    def unregister(self, addr: int, length: int) -> bool:
        h = self.executor.handle
        return bool(h) and self._lib.unregister(h, addr, length) == 0

    def add_peer(self, local_dev: list[int], remote_col: list[int], ncols: int) -> int:
        n = len(local_dev)
        ld = (i32 * n)(*local_dev)
        rc_ = (i32 * n)(*remote_col)
        return self._check(int(self._lib.add_peer(self._h(), n, ld, rc_, ncols)), "rdma_add_peer")

    def peer_shape(self, peer: int) -> tuple[int, int]:
        out = (i32 * 2)()
        self._check(self._lib.peer_shape(self._h(), peer, out), "rdma_peer_shape")
        return int(out[0]), int(out[1])

    def qp_info(self, peer: int, rail: int, k: int) -> tuple[int, int, int]:
        qpn, psn, state = u32(), u32(), i32()
        self._check(self._lib.qp_info(self._h(), peer, rail, k, qpn, psn, state), "rdma_qp_info")
        return int(qpn.value), int(psn.value), int(state.value)

    def connect_qp(self, peer: int, rail: int, k: int, qpn: int, psn: int, gid: bytes, lid: int, mtu: int, rd_atom: int) -> None:
        self._check(
            self._lib.connect_qp(self._h(), peer, rail, k, qpn, psn, _u8_16(gid), lid, mtu, rd_atom), "rdma_connect_qp"
        )

    def collect_broken(self, limit: int = 256) -> list[tuple[int, int, int]]:
        h = self.executor.handle
        if not h:
            return []
        peers = (i64 * limit)()
        rails = (i32 * limit)()
        ks = (i32 * limit)()
        n = self._lib.collect_broken(h, peers, rails, ks, limit)
        return [(int(peers[i]), int(rails[i]), int(ks[i])) for i in range(n)]

    def release_claim(self, peer: int, rail: int, k: int) -> None:
        h = self.executor.handle
        if h:
            self._lib.release_claim(h, peer, rail, k)

    def release_deferred(self, peer: int, rail: int, k: int) -> int:
        h = self.executor.handle
        return max(0, int(self._lib.release_deferred(h, peer, rail, k))) if h else 0

    def reset_qp(self, peer: int, rail: int, k: int) -> tuple[int, int]:
        qpn, psn = u32(), u32()
        self._check(self._lib.reset_qp(self._h(), peer, rail, k, qpn, psn), "rdma_reset_qp")
        return int(qpn.value), int(psn.value)

    def set_regions(self, peer: int, addrs: np.ndarray, lens: np.ndarray, perms: np.ndarray, rkeys: np.ndarray) -> None:
        n = len(addrs)
        self._check(
            self._lib.set_regions(
                self._h(), peer, n, _ptr(addrs, u64), _ptr(lens, u64), _ptr(perms, u32), _ptr(rkeys, u32)
            ),
            "rdma_set_regions",
        )

    def remove_peer(self, peer: int) -> None:
        h = self.executor.handle
        if h:
            self._lib.remove_peer(h, peer)

    def abort_rail(self, peer: int, rail: int) -> int:
        h = self.executor.handle
        return int(self._lib.abort_rail(h, peer, rail)) if h else 0

    def rail_counters(self, peer: int, rail: int) -> dict[str, int]:
        out = (u64 * 6)()
        self._check(self._lib.rail_counters(self._h(), peer, rail, out, 6), "rdma_rail_counters")
        keys = ("bytes", "slices", "errors", "wc_errors", "ready_qps", "reconnects")
        return {k: int(out[i]) for i, k in enumerate(keys)}

    def port_active(self, dev: int) -> bool:
        h = self.executor.handle
        return bool(h) and self._lib.port_active(h, dev) == 1

    def accept_qp(self, dev: int, qpn: int, psn: int, gid: bytes, lid: int, mtu: int) -> tuple[int, int, int]:
        my_qpn, my_psn = u32(), u32()
        h = self._check(
            int(self._lib.accept_qp(self._h(), dev, qpn, psn, _u8_16(gid), lid, mtu, my_qpn, my_psn)), "rdma_accept_qp"
        )
        return h, int(my_qpn.value), int(my_psn.value)

    def release_qp(self, handle: int) -> bool:
        h = self.executor.handle
        return bool(h) and self._lib.release_qp(h, handle) == 0

    def passive_count(self) -> int:
        h = self.executor.handle
        return int(self._lib.passive_count(h)) if h else 0

    def close(self) -> None:
        with self._lock:
            self.executor.close()
