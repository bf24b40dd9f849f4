"""The C handshake (tent/auth.h, tent/sha256.h) against the Python one (tent_core.auth), both ways."""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tent_core
from tent_core import auth
from tent_core.auth import AuthError, ClusterAuth

HERE = Path(__file__).parent
INCLUDE = Path(tent_core.__file__).parent / "include"
KEY = ClusterAuth.from_token("c-side-token-0123456789abcdef").key("tcp")
OTHER = ClusterAuth.from_token("another-c-token-0123456789abc").key("tcp")


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path_factory.mktemp("authc") / "auth_check"
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-I", str(INCLUDE), str(HERE / "csrc" / "auth_check.c"),
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    return str(exe)


def _run(checker: str, *args: str) -> str:
    return subprocess.run([checker, *args], check=True, capture_output=True, text=True, timeout=30).stdout.strip()


@pytest.mark.parametrize("n", [0, 1, 55, 56, 57, 63, 64, 65, 119, 128, 1000, 60_000])
def test_sha256_matches_hashlib(checker: str, n: int) -> None:
    data = os.urandom(n)
    assert _run(checker, "sha256", data.hex()) == hashlib.sha256(data).hexdigest()


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=300))
def test_hmac_matches_python(checker: str, key: bytes, msg: bytes) -> None:
    assert _run(checker, "hmac", key.hex(), msg.hex()) == hmac.new(key, msg, hashlib.sha256).hexdigest()


def _c_side(checker: str, role: str, sock: socket.socket, key: bytes, ctx: bytes = b"", timeout_ms: int = 5000) -> subprocess.Popen[str]:
    fd = sock.fileno()
    return subprocess.Popen([checker, role, str(fd), key.hex(), ctx.hex(), str(timeout_ms)], pass_fds=[fd],
                            stdout=subprocess.PIPE, text=True)


@pytest.mark.parametrize("kind", [socket.SOCK_STREAM, socket.SOCK_SEQPACKET])
def test_c_client_python_server(checker: str, kind: int) -> None:
    a, b = socket.socketpair(socket.AF_UNIX, kind)
    p = _c_side(checker, "client", a, KEY, b"engine-x")
    a.close()
    auth.server_handshake(b, KEY, context=b"engine-x", timeout=10)
    assert p.communicate(timeout=10)[0].strip() == "ok"
    b.close()


def test_python_client_c_server_over_tcp(checker: str) -> None:
    lst = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lst.getsockname())
    s, _ = lst.accept()
    p = _c_side(checker, "server", s, KEY, b"ctx")
    s.close()
    auth.client_handshake(c, KEY, context=b"ctx", timeout=10)
    assert p.communicate(timeout=10)[0].strip() == "ok"
    c.close()
    lst.close()


def test_c_refuses_wrong_keys_and_contexts_with_reasons(checker: str) -> None:
    # the C server and a Python client with the wrong key: the client refuses the server's proof
    a, b = socket.socketpair()
    p = _c_side(checker, "server", a, KEY)
    a.close()
    with pytest.raises(AuthError, match="failed to prove"):
        auth.client_handshake(b, OTHER, timeout=10)
    b.close()
    out = p.communicate(timeout=10)[0]
    assert not out.startswith("ok")
    # a C client with the wrong key against a Python server: the C client refuses the proof
    a, b = socket.socketpair()
    p = _c_side(checker, "client", a, OTHER)
    a.close()
    with pytest.raises(AuthError):
        auth.server_handshake(b, KEY, timeout=10)
    out = p.communicate(timeout=10)[0]
    assert out.startswith("-3 ") and "failed to prove" in out, out
    b.close()
    # a client that skips the check and answers garbage: the C server denies it with a reason
    a, b = socket.socketpair()
    p = _c_side(checker, "server", a, KEY)
    a.close()
    hs = auth.ClientHandshake(OTHER)
    b.sendall(hs.hello())
    assert len(b.recv(auth.CHALLENGE_LEN, socket.MSG_WAITALL)) == auth.CHALLENGE_LEN
    b.sendall(auth.RESPONSE_MAGIC + os.urandom(32))
    assert b.recv(200).startswith(auth.DENY_MAGIC + b"client failed to prove")
    assert p.communicate(timeout=10)[0].startswith("-3 ")
    b.close()
    # C client vs C server, different contexts: refused
    a, b = socket.socketpair()
    ps = _c_side(checker, "server", a, KEY, b"engine-a")
    pc = _c_side(checker, "client", b, KEY, b"engine-b")
    a.close()
    b.close()
    assert pc.communicate(timeout=10)[0].startswith("-3 ")
    assert not ps.communicate(timeout=10)[0].startswith("ok")


def test_c_server_gives_up_on_silent_or_foreign_clients(checker: str) -> None:
    a, b = socket.socketpair()
    p = _c_side(checker, "server", a, KEY, timeout_ms=300)
    a.close()
    out = p.communicate(timeout=10)[0]  # the client says nothing: bounded wait
    assert out.startswith("-2 ") and "in time" in out, out
    b.close()
    a, b = socket.socketpair()
    p = _c_side(checker, "server", a, KEY)
    a.close()
    b.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"x" * 40)
    assert p.communicate(timeout=10)[0].startswith("-4 ")
    assert b.recv(200).startswith(auth.DENY_MAGIC)
    b.close()


def test_c_client_reports_the_python_servers_denial(checker: str) -> None:
    a, b = socket.socketpair()
    p = _c_side(checker, "client", a, KEY)
    a.close()

    def deny() -> None:
        b.recv(auth.HELLO_LEN, socket.MSG_WAITALL)
        b.sendall(auth.deny("uid 65534 may not map this engine's memory"))
        b.close()

    t = threading.Thread(target=deny)
    t.start()
    out = p.communicate(timeout=10)[0]
    t.join(5)
    assert out.startswith("-3 ") and "uid 65534" in out, out
