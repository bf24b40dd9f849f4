"""`tent bench`, contributed to the `tent` command line by tent-bench, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KEYS = {"engine", "transport", "op", "block_size", "batch_size", "gbps", "avg_us", "p99_us"}


def tent(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tent_core.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_bench_json_rows_for_every_transport_and_a_baseline():
    out = tent("bench", "--block-sizes", "64K,1M", "--batch-sizes", "1,2", "--iters", "3", "--baseline", "socket",
               "--json", "--transport", "tcp,shm")  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    ours = [r for r in rows if r["engine"] == "tent"]
    assert {r["transport"] for r in ours} == {"tcp", "shm"}
    assert {(r["op"], r["block_size"], r["batch_size"]) for r in ours if r["transport"] == "tcp"} == {
        (op, b, n) for op in ("READ", "WRITE") for b in (65536, 1 << 20) for n in (1, 2)
    }
    for r in rows:
        assert KEYS <= set(r) and r["gbps"] > 0 and r["p99_us"] >= r["avg_us"] * 0.5
    assert any(r["engine"] == "socket" for r in rows)
    assert all("x_socket" in r for r in ours)


def test_bench_table_and_submit_cost():
    out = tent("bench", "--block-sizes", "64K", "--iters", "3", "--transport", "tcp", "--ops", "WRITE", "--submit-cost")
    assert out.returncode == 0, out.stderr
    assert "tent bench" in out.stdout and "submit() cost" in out.stdout


@pytest.mark.parametrize(
    "args,msg",
    [
        (["bench", "--block-sizes", "lots"], "not a size"),
        (["bench", "--ops", "ERASE"], "--ops"),
        (["bench", "--baseline", "nccl"], "unknown baseline"),
        (["bench", "--transport", "carrier-pigeon", "--block-sizes", "64K", "--iters", "1"], "not available"),
        (["bench", "--degrade", "3:0.5"], "only apply with --fabric"),
        (["bench", "--batch-sizes", "0"], "batch sizes"),
    ],
)
def test_bad_arguments_fail_clearly(args, msg):
    out = tent(*args, timeout=120)
    assert out.returncode != 0
    assert msg in out.stderr + out.stdout


def test_file_transport_bench_against_fio(tmp_path):
    import shutil

    if shutil.which("fio") is None:
        pytest.skip("fio not installed")
    out = tent("bench", "--transport", "gds", "--baseline", "fio", "--block-sizes", "1M", "--iters", "3",
               "--file-dir", str(tmp_path), "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    ours = [r for r in rows if r["engine"] == "tent"]
    assert {r["op"] for r in ours} == {"READ", "WRITE"} and all(r["transport"] == "gds" for r in ours)
    assert all(r["gbps"] > 0 and "x_fio" in r for r in ours)


def test_synthesized_path_bench(tmp_path):
    out = tent("bench", "--path", "file:tcp", "--block-sizes", "4M", "--iters", "3", "--file-dir", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    stages = {r["stage"]: r for r in rows}
    assert set(stages) == {"file->memory", "memory->remote", "file->remote (staged)"}
    assert stages["file->remote (staged)"]["x_slower_stage"] > 0
    bad = tent("bench", "--path", "disk:tcp", "--block-sizes", "4M", "--iters", "1", "--file-dir", str(tmp_path))
    assert bad.returncode != 0 and "file:TRANSPORT" in bad.stderr + bad.stdout
