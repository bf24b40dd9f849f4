"""The host-wide rail load table (/dev/shm) on a machine shared by several users: private to its
user, removed by its last process, and a leftover of another user never breaks a run."""

from __future__ import annotations

import os
import pwd
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tent_core.qos import SharedRailLoad

SHM = "/dev/shm"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runs a step as uid nobody)")
needs_shm = pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm")


def _nobody() -> tuple[int, int]:
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody' on this host")
    return pw.pw_uid, pw.pw_gid


def others_can_read(*paths: str) -> bool:
    """Every folder down to each path can be entered by any user: a process that dropped to nobody
    still finds the installed packages' metadata and files there (not so for a checkout in /root)."""
    for path in paths:
        p = os.path.abspath(path)
        while True:
            if not os.stat(p).st_mode & 0o001:
                return False
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
    return True


def run_as(uid: int, gid: int, fn: Callable[..., Any], *args: Any, timeout: float = 60.0) -> int:
    """Run fn(*args) in a forked child under uid/gid; its exit code (0: fn returned)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fn(*args)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError(f"child did not finish within {timeout}s")


def _path(uid: int, name: str, directory: str = SHM) -> str:
    return os.path.join(directory, f"tent-load-u{uid}-{name}")


def test_table_is_private_and_removed_by_its_last_process(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    a = SharedRailLoad(name, directory=str(tmp_path))
    b = SharedRailLoad(name, directory=str(tmp_path))
    path = _path(os.geteuid(), name, str(tmp_path))
    assert a.path == b.path == path
    assert os.stat(path).st_mode & 0o777 == 0o600
    a.set("nic0", 5)
    assert b.others("nic0") == 5
    a.close()
    assert os.path.exists(path)  # b still uses it
    b.close()
    assert not os.path.exists(path)
    c = SharedRailLoad(name, directory=str(tmp_path))  # a fresh one after that
    c.set("nic0", 1)
    c.close()
    assert not os.path.exists(path)


def test_table_never_follows_a_planted_link(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, _path(os.geteuid(), name, str(tmp_path)))
    with SharedRailLoad(name, directory=str(tmp_path)) as t, SharedRailLoad(name, directory=str(tmp_path)) as u:
        assert t.path == u.path == _path(os.geteuid(), name, str(tmp_path)) + ".1"  # the next name, for both
        t.set("nic0", 4)
        assert u.others("nic0") == 4
    assert victim.read_bytes() == b"precious"


def test_a_table_that_is_not_private_is_skipped(tmp_path):
    name = f"t{uuid.uuid4().hex[:8]}"
    path = _path(os.geteuid(), name, str(tmp_path))
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o666)  # others could write it: they could steer this user's scheduler
    os.close(fd)
    with SharedRailLoad(name, directory=str(tmp_path)) as t:
        assert t.path == path + ".1"
    assert os.path.getsize(path) == 0  # left alone
    for k in range(1, 8):  # every name taken: a clear error (the engine logs it, runs on)
        os.symlink("/nonexistent", f"{path}.{k}")
    with pytest.raises(ValueError, match="no usable rail load table"):
        SharedRailLoad(name, directory=str(tmp_path))


def _own_table_as_user(name: str) -> None:
    with SharedRailLoad(name, directory=SHM) as t:
        t.set("nic0", 7)
        assert t.own("nic0") == 7 and t.others("nic0") == 0  # root's table is not this one
        assert t.path == _path(os.geteuid(), name)
    assert not os.path.exists(_path(os.geteuid(), name))


@needs_root
@needs_shm
def test_another_users_table_does_not_break_a_run():
    """root's table is open (and another file lies around, of root, under nobody's name); nobody
    gets its own table next to the first, and the next name after the second."""
    uid, gid = _nobody()
    name = f"t{uuid.uuid4().hex[:8]}"
    root_table = SharedRailLoad(name, directory=SHM)
    planted = _path(uid, f"{name}-planted")
    try:
        root_table.set("nic0", 3)
        assert run_as(uid, gid, _own_table_as_user, name) == 0
        assert os.path.exists(root_table.path) and root_table.own("nic0") == 3
        with open(planted, "wb"):  # root's file, under the name nobody's process would use
            pass
        assert run_as(uid, gid, _skipped_as_user, f"{name}-planted") == 0
        assert os.path.getsize(planted) == 0 and not os.path.exists(planted + ".1")  # removed at close
    finally:
        root_table.close()
        if os.path.exists(planted):
            os.unlink(planted)
    assert not os.path.exists(root_table.path)


def _skipped_as_user(name: str) -> None:
    with SharedRailLoad(name, directory=SHM) as t:  # root's file under this user's name: skipped
        assert t.path == _path(os.geteuid(), name) + ".1"
        t.set("nic0", 1)


@needs_root
@needs_shm
def test_engine_of_a_user_runs_next_to_roots_table():
    """The engine's own path to the table (recovery's process-wide instance) in a new interpreter
    that drops to uid nobody, with root's table of the same name open: two-rail transfers work,
    nothing is logged about the table, and nobody's table is gone when its process exits."""
    import subprocess
    import sys

    import tent_core

    uid, gid = _nobody()
    if not others_can_read(sys.prefix, os.path.dirname(os.path.dirname(tent_core.__file__))):
        pytest.skip("this checkout or its venv cannot be read by other users")
    name = f"t{uuid.uuid4().hex[:8]}"
    root_table = SharedRailLoad(name, directory=SHM)  # what a root run of the same config holds
    try:
        r = subprocess.run([sys.executable, "-c", _AS_USER, name, str(uid), str(gid)], cwd="/", capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert "shared rail load table" not in r.stderr, r.stderr
        assert "table in use as uid" in r.stdout
        assert os.path.exists(root_table.path)
    finally:
        root_table.close()
    assert not os.path.exists(_path(uid, name))
    assert not os.path.exists(root_table.path)


# Everything this needs is imported (and the plugins loaded) as root first: the interpreter's own
# files may be unreadable to nobody (a per-user Python install); then the process drops to nobody
# and starts its engines afresh. The table is the process-wide one the engine opens itself.
_AS_USER = """
import os, sys, time
import numpy as np
from tent_core import Engine, Request, READ
from tent_core import recovery

name, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cfg = {"transports": {"tcp": {"rails": ["127.0.0.1", "127.0.0.2"]}}, "qos": {"shared_load_name": name}}

def transfer():
    a, b = Engine(cfg, transports=["tcp"]), Engine(cfg, transports=["tcp"])
    src = a.allocate(8 << 20, segment="w")
    src.array[:] = np.arange(1 << 20, dtype=np.uint64).view(np.uint8)
    dst = b.allocate(8 << 20)
    for _ in range(5):
        b.submit([Request(READ, dst, 0, a.segment_name("w"), 0, 8 << 20)], deadline=30).wait()
    assert (dst.array == src.array).all()
    time.sleep(0.5)  # health ticks: the engine opens the table and publishes its load
    b.close()
    a.close()

transfer()  # as root: imports and plugin libraries loaded
if recovery._SHARED_LOADS.get(name):
    recovery._SHARED_LOADS[name].close()
recovery._SHARED_LOADS.pop(name, None)
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
transfer()
mine = f"/dev/shm/tent-load-u{uid}-{name}"
table = recovery._SHARED_LOADS.get(name)
assert table and table.path == mine, table
assert os.stat(mine).st_uid == uid and os.stat(mine).st_mode & 0o777 == 0o600
print("table in use as uid", uid)
"""


_TICK_VS_EXIT = r"""
import logging, sys, threading
import numpy as np
from tent_core import Engine, recovery

errors = []

class Failed(logging.Handler):
    def emit(self, record):
        errors.append(record.getMessage() + (str(record.exc_info[1]) if record.exc_info else ""))

logging.getLogger("tent_core").addHandler(Failed(logging.ERROR))  # "health tick failed"
a, b = Engine(transports=["tcp"]), Engine(transports=["tcp"])
b.register(np.ones(1 << 16, np.uint8), segment="s")
loc = a.allocate(1 << 16)
a.read(loc, b.segment_name("s"), 1 << 16)  # a route: every tick of `a` writes its rails' load to the table
entered, release, later = threading.Event(), threading.Event(), threading.Semaphore(0)
tick = a._health_tick

def parked_tick(now):
    if not entered.is_set():
        entered.set()
        release.wait(30)  # the table closes (at exit) while this tick is about to use it
    tick(now)
    later.release()

a._health_tick = parked_tick
assert entered.wait(60)
closer = threading.Thread(target=recovery.close_shared_load)  # what atexit runs
closer.start()
closer.join(0.5)
release.set()
closer.join(60)
assert not closer.is_alive()
for _ in range(20):  # later ticks run without the table
    assert later.acquire(timeout=60)
print("errors:", errors, flush=True)
sys.exit(1 if errors else 0)
"""


def test_no_health_tick_uses_the_load_table_after_it_closed():
    """The table closes at exit while engines that were never closed still tick: a tick that started
    before finishes first, later ticks find no table (no AttributeError on a closed table)."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _TICK_VS_EXIT], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
