"""Target side of the shm tests: runs in a separate (spawned) process.

It starts its own ShmTransport (so the memfd server runs here), allocates anonymous and
memfd-backed buffers with known contents, and answers commands over a pipe.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

HOST_ID = "test-host"


def pattern(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class _Memfd:
    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("tent-shm-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.array = np.frombuffer(self.map, dtype=np.uint8)


def target_main(conn: Any, specs: list[dict[str, Any]], config: dict[str, Any]) -> None:
    from tent_shm.plugin import ShmTransport

    from tent_core.transport import TransportContext
    from tent_core.types import BufferInfo, MemoryKind, Permission

    tr = ShmTransport()
    tr.start(TransportContext(engine_id="target", host_id=HOST_ID, config=config, bind_host="127.0.0.1"))
    keep: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    infos: dict[str, BufferInfo] = {}
    bufs = []
    for i, spec in enumerate(specs):
        name, size, memfd = spec["name"], spec["size"], spec.get("memfd", False)
        if memfd:
            mf = _Memfd(size)
            keep[name] = mf
            arr, fd = mf.array, mf.fd
        else:
            arr, fd = np.empty(size, np.uint8), -1
            keep[name] = arr
        arr[:] = pattern(size, 1000 + i)
        arrays[name] = arr
        perm = Permission(spec.get("perm", int(Permission.READ_WRITE)))
        info = BufferInfo("default", 0, arr.ctypes.data, size, MemoryKind.HOST, perm=perm, memfd=fd)
        infos[name] = info
        desc = tr.export_buffer(info)
        bufs.append({"name": name, "addr": info.addr, "length": size, "perm": int(perm), "shm": desc})
    conn.send({"pid": os.getpid(), "desc": tr.local_descriptor(), "bufs": bufs})
    while True:
        try:
            cmd = conn.recv()
        except EOFError:
            break
        op = cmd[0]
        if op == "get":
            _, name, off, n = cmd
            conn.send(arrays[name][off : off + n].tobytes())
        elif op == "release":
            tr.release_buffer(infos[cmd[1]])
            conn.send(True)
        elif op == "fill":  # back to the pattern it started with
            name = cmd[1]
            arrays[name][:] = pattern(arrays[name].nbytes, 1000 + list(arrays).index(name))
            conn.send(True)
        elif op == "exit":
            conn.send(True)
            break
    tr.close()
