"""The target side of the conformance kit: a separate process owning the remote buffers.

``python -m tent_core.conformance.target NAME --kind host|file [--config JSON]`` starts transport
NAME, creates the buffers of :data:`BUFFERS` (memfd-backed memory, or files in a private temporary
directory), exports them like the engine does and sends a hello frame on stdout. Then it answers
commands from stdin until ``exit`` or end of input. Frames are a 4-byte little-endian length and
a msgpack map, both ways; logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import struct
import sys
import tempfile
import time
from typing import IO, Any

import msgpack
import numpy as np

from ..errors import ProtocolError
from ..memory import MemfdBuffer
from ..metadata import ControlServer, host_identity
from ..plugin_manager import discover, instantiate
from ..transport import Transport, TransportContext
from ..types import BufferInfo, MemoryKind, Permission

log = logging.getLogger(__name__)

KiB, MiB = 1024, 1024 * 1024
# name -> (size, permission). "rw": reads and writes; "ro": registered READ-only; "rel": released
# by the release_buffer check; "back": a large source for backlogs (close, abort_rail); "plain":
# host memory the process allocated itself (as engine.register() of a numpy array), not memfd-backed
# like the others (as engine.allocate()): some transports cannot reach it (buffer_reach check);
# "wo": registered WRITE-only (a waiting READ's word there is refused: wait_read_word_access).
BUFFERS: dict[str, tuple[int, Permission]] = {
    "rw": (4 * MiB, Permission.READ_WRITE),
    "ro": (256 * KiB, Permission.READ),
    "rel": (256 * KiB, Permission.READ_WRITE),
    "back": (16 * MiB, Permission.READ_WRITE),
    "plain": (256 * KiB, Permission.READ_WRITE),
    "wo": (64 * KiB, Permission.WRITE),
}
PLAIN = frozenset({"plain"})
SEGMENT = "conformance"
FILE_BASE = 1 << 56  # synthetic, non-overlapping addresses for files, far above user space
FILE_STRIDE = 1 << 40
MAX_FRAME = 64 * MiB


class ControlPlane:
    """A loopback control port for one side of the kit, as an engine has: answers ``ping`` and
    routes ``transport`` messages to the transport under test (transports that handshake over the
    control plane, such as RDMA's QP exchange, need it). Its endpoint is the side's engine id."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.transport: Transport | None = None
        self.server = ControlServer("127.0.0.1", 0, self._handle)
        self.engine_id = f"127.0.0.1:{self.server.port}"

    def _handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg["op"]
        if op == "ping":
            return {"ok": True}
        if op == "transport" and msg.get("transport") == self.name and self.transport is not None:
            return self.transport.handle_control(msg.get("body"))
        raise ProtocolError(f"unknown op {op!r}")

    def close(self) -> None:
        self.server.close()


def pattern(n: int, seed: int) -> np.ndarray:
    """Bytes that never repeat at any useful scale (seeded PCG64 output)."""
    return np.frombuffer(np.random.default_rng(seed).bytes(n), np.uint8)


def buffer_seed(name: str) -> int:
    return 1000 + sorted(BUFFERS).index(name)


def send_frame(out: IO[bytes], msg: dict[str, Any]) -> None:
    body = msgpack.packb(msg, use_bin_type=True)
    out.write(struct.pack("<I", len(body)) + body)
    out.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    parts: list[bytes] = []
    while n > 0:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError("no frame from the other side before the deadline")
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the pipe")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


def recv_frame(fd: int, timeout: float | None = None) -> dict[str, Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    (n,) = struct.unpack("<I", _read_exact(fd, 4, deadline))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes refused (limit {MAX_FRAME})")
    msg = msgpack.unpackb(_read_exact(fd, n, deadline), raw=False)
    if not isinstance(msg, dict):
        raise ValueError("malformed frame: not a map")
    return msg


class _Buffer:
    """One target buffer: memory (memfd) or a file, with the BufferInfo the transport saw."""

    def __init__(self, name: str, index: int, kind: MemoryKind, size: int, perm: Permission, tmpdir: str) -> None:
        self.name = name
        self.kind = kind
        self.size = size
        self.mem: MemfdBuffer | None = None
        self.plain: np.ndarray | None = None
        self.path: str | None = None
        if kind is MemoryKind.HOST and name in PLAIN:
            self.plain = np.empty(size, np.uint8)
            addr, memfd = self.plain.ctypes.data, -1
        elif kind is MemoryKind.HOST:
            self.mem = MemfdBuffer(size, name=f"tent-conformance-{name}")
            addr, memfd = self.mem.addr, self.mem.fd
        else:
            self.path = os.path.join(tmpdir, f"{name}.bin")
            with open(self.path, "wb") as f:
                f.truncate(size)
            addr, memfd = FILE_BASE + (index + 1) * FILE_STRIDE, -1
        self.info = BufferInfo(SEGMENT, index * 64 * MiB, addr, size, kind, perm=perm, memfd=memfd, path=self.path)
        self.fill(buffer_seed(name))

    def fill(self, seed: int) -> None:
        data = pattern(self.size, seed)
        if self.plain is not None:
            self.plain[:] = data
        elif self.mem is not None:
            self.mem.array[:] = data
        else:
            assert self.path is not None
            with open(self.path, "r+b") as f:
                f.write(data.tobytes())

    def read(self, off: int, n: int) -> bytes:
        if off < 0 or n < 0 or off + n > self.size:
            raise ValueError(f"{self.name}: [{off}, {off + n}) is outside [0, {self.size})")
        if self.plain is not None:
            return self.plain[off : off + n].tobytes()
        if self.mem is not None:
            return self.mem.array[off : off + n].tobytes()
        assert self.path is not None
        with open(self.path, "rb") as f:
            return os.pread(f.fileno(), n, off)

    def _host(self) -> np.ndarray:
        arr = self.plain if self.plain is not None else self.mem.array if self.mem is not None else None
        if arr is None:
            raise ValueError(f"{self.name}: a file holds no word a waiting READ can wait on")
        return arr

    def write_word(self, off: int, value: int, data_off: int = 0, data: bytes = b"") -> None:
        """`data` at `data_off`, then the u64 word at `off` (aligned): as a source's bytes land
        before its progress word says so."""
        arr = self._host()
        if off < 0 or off % 8 or off + 8 > self.size or not 0 <= value < 1 << 64:
            raise ValueError(f"{self.name}: no aligned word at {off} (or value {value} out of range)")
        if data_off < 0 or data_off + len(data) > self.size:
            raise ValueError(f"{self.name}: [{data_off}, {data_off + len(data)}) is outside [0, {self.size})")
        arr[data_off : data_off + len(data)] = np.frombuffer(data, np.uint8)
        arr[off : off + 8].view(np.uint64)[0] = value  # one aligned 8-byte store: readers see old or new

    def close(self) -> None:
        if self.mem is not None:
            self.mem.close()


def serve(name: str, kind: MemoryKind, config: dict[str, Any], out: IO[bytes], inp: int) -> int:
    ps = discover()
    entry = ps.registry.entries.get(name)
    if entry is None:
        send_frame(out, {"ok": False, "error": f"transport {name!r} is not installed"})
        return 2
    transport, avail = instantiate(entry)
    if transport is None or not avail.available:
        send_frame(out, {"ok": False, "error": f"transport {name!r} unavailable: {avail.reason}"})
        return 2
    tmpdir = tempfile.mkdtemp(prefix="tent-conformance-")
    bufs: dict[str, _Buffer] = {}
    exported: list[_Buffer] = []
    started: Transport | None = None
    control = ControlPlane(name)
    try:
        cfg = transport.resolve_config(config)
        control.transport = transport
        transport.start(TransportContext(engine_id=control.engine_id, host_id=host_identity(), config=cfg,
                                         bind_host="127.0.0.1"))  # fmt: skip
        started = transport
        listing = []
        for i, (bname, (size, perm)) in enumerate(sorted(BUFFERS.items())):
            b = bufs[bname] = _Buffer(bname, i, kind, size, perm, tmpdir)
            desc = transport.export_buffer(b.info)
            exported.append(b)
            listing.append({"name": bname, "segment": SEGMENT, "offset": b.info.offset, "addr": b.info.addr,
                            "length": size, "perm": int(perm), "kind": kind.value,
                            "desc": {name: desc} if desc is not None else {}})  # fmt: skip
        send_frame(out, {"ok": True, "pid": os.getpid(), "host_id": host_identity(), "engine_id": control.engine_id,
                         "descriptor": transport.local_descriptor(), "buffers": listing})  # fmt: skip
        while True:
            try:
                cmd = recv_frame(inp)
            except EOFError:
                return 0
            op = cmd.get("op")
            try:
                if op == "read":
                    send_frame(out, {"ok": True, "data": bufs[cmd["buf"]].read(int(cmd["off"]), int(cmd["len"]))})
                elif op == "fill":
                    bufs[cmd["buf"]].fill(int(cmd["seed"]))
                    send_frame(out, {"ok": True})
                elif op == "write_word":  # the bytes a waiting READ waits for land, then their word says so
                    b, n = bufs[cmd["buf"]], int(cmd.get("len", 0))
                    if not 0 <= n <= b.size:
                        raise ValueError(f"write_word: {n} bytes into a buffer of {b.size}")
                    data = pattern(n, int(cmd["seed"])).tobytes() if n else b""
                    b.write_word(int(cmd["off"]), int(cmd["value"]), int(cmd.get("data_off", 0)), data)
                    transport.word_written()  # parked READs look again now
                    send_frame(out, {"ok": True})
                elif op == "release":
                    b = bufs[cmd["buf"]]
                    if b in exported:
                        transport.release_buffer(b.info)
                        exported.remove(b)
                    send_frame(out, {"ok": True})
                elif op == "exit":
                    send_frame(out, {"ok": True})
                    return 0
                else:
                    send_frame(out, {"ok": False, "error": f"unknown op {op!r}"})
            except (KeyError, ValueError, TypeError, OSError) as exc:
                send_frame(out, {"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    except Exception as exc:
        log.exception("conformance target failed")
        send_frame(out, {"ok": False, "error": f"target failed: {type(exc).__name__}: {exc}"})
        return 1
    finally:
        for b in exported:
            try:
                transport.release_buffer(b.info)
            except Exception:
                log.exception("release_buffer(%s) failed", b.name)
        if started is not None:
            started.close()
        control.close()
        for b in bufs.values():
            b.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_core.conformance.target")
    ap.add_argument("name")
    ap.add_argument("--kind", choices=[MemoryKind.HOST.value, MemoryKind.FILE.value], default=MemoryKind.HOST.value)
    ap.add_argument("--config", default="{}", help="the transport's config section, as JSON")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="target %(levelname)s %(name)s: %(message)s")
    # nothing but frames on the pipe: anything else that writes to fd 1 (C code too) goes to stderr
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    return serve(args.name, MemoryKind(args.kind), json.loads(args.config), out, sys.stdin.fileno())


if __name__ == "__main__":
    sys.exit(main())
