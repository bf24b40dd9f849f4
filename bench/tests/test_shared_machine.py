"""Benchmarks on a machine shared by several users: the file benchmark keeps its file in a
directory private to the run and removes it; another user's leftover never breaks a run."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest
from tent_bench import runner


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


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (runs the benchmark as uid nobody)")


def test_bench_file_is_private_and_removed(tmp_path):
    with runner.bench_file(str(tmp_path), 3 << 20) as path:
        folder = os.path.dirname(path)
        assert os.path.dirname(folder) == str(tmp_path)
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        assert os.path.getsize(path) == 3 << 20
        data = open(path, "rb").read(1 << 20)
        assert len(set(data[:4096])) > 16  # a pattern, not zeros
    assert os.listdir(tmp_path) == []


def test_bench_file_in_a_folder_it_cannot_write_is_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(RuntimeError, match="--file-dir"), runner.bench_file(str(ro), 1 << 20):
        pass


# The same steps as `tent bench --transport gds`, in a fresh interpreter that imports everything
# as root (the interpreter's own files may be unreadable to nobody), then drops to nobody.
_AS_USER = """
import json, os, sys
from tent_bench import runner
from tent_core import Engine

shared, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
Engine(transports=["gds"]).close()  # loads the plugin and its executor while still root
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
spec = runner.BenchSpec(block_sizes=[1 << 20], ops=["READ", "WRITE"], iters=3, warmup=1, time_budget_s=0.2,
                        transports=["gds"], file_dir=shared)
print(json.dumps(runner.run_tent(spec)))
"""


@needs_root
def test_file_benchmark_as_a_user_with_another_users_leftover():
    """The reported crash: the gds rows as an ordinary user, with the file of an earlier root run
    (old fixed name, read-only to others) and a private folder of another run in the same /var/tmp."""
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user 'nobody'")
    import tent_core

    if not others_can_read(sys.prefix, os.path.dirname(os.path.dirname(tent_core.__file__))):
        pytest.skip("this checkout or its venv cannot be read by other users")
    shared = tempfile.mkdtemp(prefix="tent-shared-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    try:
        os.chmod(shared, 0o1777)  # like /var/tmp itself: everyone writes, only owners remove
        size = 1 << 20
        leftover = os.path.join(shared, f"tent-bench-{size}.bin")
        with open(leftover, "wb") as f:
            f.write(b"\0" * size)
        os.chmod(leftover, 0o644)
        other_run = tempfile.mkdtemp(prefix="tent-bench-", dir=shared)  # root's private folder
        r = subprocess.run([sys.executable, "-c", _AS_USER, shared, str(nobody.pw_uid), str(nobody.pw_gid)],
                           capture_output=True, text=True, timeout=240, cwd="/")  # fmt: skip
        assert r.returncode == 0, r.stderr
        rows = json.loads(r.stdout.strip().splitlines()[-1])
        assert {(x["transport"], x["op"]) for x in rows} == {("gds", "READ"), ("gds", "WRITE")}
        assert all(x["gbps"] > 0 for x in rows)
        assert sorted(os.listdir(shared)) == sorted([os.path.basename(leftover), os.path.basename(other_run)])
        with open(leftover, "rb") as f:
            assert f.read() == b"\0" * size  # another user's file: untouched
    finally:
        shutil.rmtree(shared, ignore_errors=True)
