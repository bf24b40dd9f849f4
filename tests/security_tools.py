"""What the attack suite's attackers use: raw protocol clients and a process of another uid.

The attackers speak the wire protocols directly (no tent_core client classes that would refuse to
misbehave). `as_user` forks the test process and drops to another uid in the child: the child keeps
the already-loaded interpreter and modules (a fresh interpreter could not even start as `nobody`
here), runs one function and reports a JSON-able result through a pipe.
"""

from __future__ import annotations

import array  # noqa: F401  (socket.recv_fds needs it; imported before any fork)
import ctypes
import errno
import json
import mmap
import os
import select
import socket
import time
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from tent_core import auth

NOBODY = 65534
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def outcome(fn: Callable[[], Any]) -> str:
    """"ok", or the errno name (or exception type) the attempt failed with."""
    try:
        r = fn()
        if isinstance(r, int) and r > 2 and not isinstance(r, bool):
            try:
                os.close(r)  # an fd we opened: do not leak it
            except OSError:
                pass
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, type(exc).__name__)
    except Exception as exc:
        return type(exc).__name__


def mprotect_upgrade(fd: int, length: int = 4096) -> str:
    """Map `fd` read-only and shared, then ask for PROT_WRITE: what a reader would try next."""
    addr = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if addr in (None, MAP_FAILED):
        return "mmap:" + errno.errorcode.get(ctypes.get_errno(), "?")
    try:
        if _libc.mprotect(addr, length, mmap.PROT_READ | mmap.PROT_WRITE) != 0:
            return errno.errorcode.get(ctypes.get_errno(), "?")
        ctypes.memset(addr, 0x58, 1)  # it worked: prove it by writing
        return "ok"
    finally:
        _libc.munmap(addr, length)


# ------------------------------------------------------------------------- shm fd server
def shm_attach(sock_name: str, key: bytes, timeout: float = 5.0) -> tuple[socket.socket, dict[str, Any]]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(timeout)
    s.connect("\0" + sock_name)
    try:
        auth.client_handshake(s, key, timeout=timeout)
        s.send(json.dumps({"op": "hello", "pid": os.getpid()}).encode())
        return s, json.loads(s.recv(65536))
    except BaseException:
        s.close()
        raise


def shm_get(s: socket.socket, addr: int) -> tuple[dict[str, Any], int]:
    s.send(json.dumps({"op": "get", "id": 1, "addr": addr}).encode())
    data, fds, _flags, _addr = socket.recv_fds(s, 65536, 4)
    return json.loads(data), (fds[0] if fds else -1)


def attack_memfd(sock_name: str, key_hex: str, addr: int) -> dict[str, Any]:
    """Get the memfd of buffer `addr` and try every way to write through it."""
    try:
        s, hello = shm_attach(sock_name, bytes.fromhex(key_hex))
    except Exception as exc:
        return {"attach": f"{type(exc).__name__}: {exc}"}
    res: dict[str, Any] = {"attach": "ok", "served_by": hello.get("engine_id")}
    reply, fd = shm_get(s, addr)
    res["got_fd"] = fd >= 0
    res["writable"] = reply.get("writable")
    if fd >= 0:
        res["write"] = outcome(lambda: os.pwrite(fd, b"X", 0))
        res["mmap_rw"] = outcome(lambda: mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
        res["mprotect_rw"] = mprotect_upgrade(fd)
        res["ftruncate"] = outcome(lambda: os.ftruncate(fd, 0))
        res["reopen_rw"] = outcome(lambda: os.open(f"/proc/self/fd/{fd}", os.O_RDWR))
        try:
            fd2 = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)
        except OSError:
            pass
        else:  # the reopen worked (same uid): the seals must still stop every write
            res["reopened_write"] = outcome(lambda: os.pwrite(fd2, b"X", 0))
            res["reopened_mmap_rw"] = outcome(
                lambda: mmap.mmap(fd2, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            )
            res["reopened_ftruncate"] = outcome(lambda: os.ftruncate(fd2, 0))
            os.close(fd2)
        os.close(fd)
    s.close()
    return res


def as_user(uid: int, fn: Callable[..., dict[str, Any]], *args: Any, timeout: float = 30.0) -> dict[str, Any]:
    """Run fn(*args) in a forked child running as `uid` (needs root); its result, or {"error": ...}."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no logging, no threads of its own, exit without cleanup handlers
        out: dict[str, Any]
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = fn(*args)
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(r)
        for _ in range(100):
            done, _status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    return json.loads(data) if data else {"error": "the child reported nothing"}


# ------------------------------------------------------------------------- ZeroMQ
def raw_request(endpoint: str, frames: list[bytes], timeout: float = 5.0) -> list[bytes] | None:
    """One DEALER request with arbitrary frames; the reply frames, or None if none came."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(endpoint)
        s.send_multipart(frames)
        if not s.poll(int(timeout * 1000)):
            return None
        return s.recv_multipart()
    finally:
        s.close(0)


def packb(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)
