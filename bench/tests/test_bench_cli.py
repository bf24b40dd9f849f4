"""`tent bench`, contributed to the `tent` command line by tent-bench, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

KEYS = {"engine", "transport", "op", "block_size", "batch_size", "gbps", "avg_us", "p50_us", "p99_us", "verified_bytes"}


def tent(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tent_core.cli", *args], capture_output=True, text=True, timeout=timeout)


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def test_bench_json_rows_for_every_transport_and_a_baseline_in_rounds():
    out = tent("bench", "--block-sizes", "64K,1M", "--batch-sizes", "1,2", "--iters", "3", "--baseline", "socket",
               "--json", "--transport", "tcp,shm", "--rounds", "2")  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    ours = [r for r in rows if r["engine"] == "tent"]
    assert {r["transport"] for r in ours} == {"tcp", "shm"}
    points = {(op, b, n) for op in ("READ", "WRITE") for b in (65536, 1 << 20) for n in (1, 2)}
    assert {(r["op"], r["block_size"], r["batch_size"]) for r in ours if r["transport"] == "tcp"} == points
    sock = {(r["op"], r["block_size"], r["batch_size"]): r for r in rows if r["engine"] == "socket"}
    assert set(sock) == points and all(r["parallel"] == 4 for r in sock.values())  # the tcp transport's 4 connections
    size = 2 * (1 << 20)  # the largest batch: the target's buffer
    for r in ours:
        assert KEYS <= set(r)
        assert r["verified_bytes"] == 3 * size  # target pattern READ, a fresh one WRITTEN and read back
        assert r["rounds"] == 2 and len(r["gbps_rounds"]) == 2
        assert r["gbps_min"] <= r["gbps"] <= r["gbps_max"] and r["gbps"] == pytest.approx(_median(r["gbps_rounds"]), abs=1e-3)
        # the ratio is the median of per-round ratios, each against the socket run of the same round
        b = sock[(r["op"], r["block_size"], r["batch_size"])]
        per_round = [t / s for t, s in zip(r["gbps_rounds"], b["gbps_rounds"], strict=True)]
        assert r["x_socket"] == pytest.approx(_median(per_round), rel=1e-3, abs=1e-3)
        assert r["x_socket_min"] == pytest.approx(min(per_round), rel=1e-3, abs=1e-3)
        # bytes per second agree with the mean latency of one batch
        assert r["p99_us"] >= r["p50_us"] * (1 - 1e-9)


def test_bench_table_and_submit_cost():
    import re

    out = tent("bench", "--block-sizes", "64K", "--iters", "3", "--transport", "tcp", "--ops", "WRITE", "--submit-cost",
               "--rounds", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "tent bench" in out.stdout
    m = re.search(r"submit\(\) cost, one 64 KiB request: median ([0-9.]+) us, p99 ([0-9.]+) us, back to back ([0-9.]+) us",
                  out.stdout)  # fmt: skip
    assert m, out.stdout
    median, p99, queued = map(float, m.groups())
    assert median <= p99 and 0 < queued < 10_000


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
    # --min-bytes 6M: at least 6 requests of 1 MiB, --iters (3) of 4 MiB
    out = tent("bench", "--transport", "gds", "--baseline", "fio", "--block-sizes", "1M,4M", "--iters", "3",
               "--min-bytes", "6M", "--file-dir", str(tmp_path), "--json", "--rounds", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    ours = [r for r in rows if r.get("engine") == "tent"]
    fio = {(r["op"], r["block_size"]): r for r in rows if r.get("engine") == "fio"}
    tuning = next(r for r in rows if r.get("kind") == "fio_tuning")
    assert {r["op"] for r in ours} == {"READ", "WRITE"} and all(r["transport"] == "gds" for r in ours)
    for r in ours:
        f = fio[(r["op"], r["block_size"])]
        want = 6 if r["block_size"] == 1 << 20 else 3
        # the same bytes: fio moved exactly as many requests of block over the engine's range
        assert r["iters"] == want and f["bytes"] == want * r["block_size"] and f["ios"] == f["bytes"] // f["fio_bs"]
        setting = f["fio_setting"]  # fio's buffers add up to the block, like the engine's memory
        assert f["fio_bs"] * setting["numjobs"] * setting["iodepth"] == r["block_size"]
        assert r["verified_bytes"] > 0 and r["cpu_s_per_gb"] > 0
        assert r["x_fio"] == pytest.approx(r["gbps"] / f["gbps"], rel=2e-3)
        # the rounds ran the setting the sweep found fastest at this point, among every setting it tried
        point = [t for t in tuning["rows"] if (t["op"], t["block_size"]) == (r["op"], r["block_size"])]
        best = max(point, key=lambda t: t["gbps"])["fio_setting"]
        assert f["fio_setting"] == best == tuning["chosen"][f"{r['op']} {r['block_size']}"]
        assert {t["fio_setting"]["ioengine"] for t in point} == {"psync", "io_uring", "libaio"}


def test_synthesized_path_bench(tmp_path):
    out = tent("bench", "--path", "file:tcp", "--block-sizes", "4M", "--iters", "3", "--file-dir", str(tmp_path), "--json",
               "--rounds", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    stages = {r["stage"]: r for r in rows}
    # the engine sends a page-cache file to tcp from a mapping of it (tent_core.mapped); the row names it
    assert set(stages) == {"file->memory", "memory->remote", "file->remote (mapped)"}
    path = stages.pop("file->remote (mapped)")
    stages["file->remote (staged)"] = path
    assert path["path"] == "mapped" and "mmap" in path["route"] and "tcp" in path["route"], path
    slower = min(stages["file->memory"]["gbps"], stages["memory->remote"]["gbps"])
    assert stages["file->remote (staged)"]["x_slower_stage"] == pytest.approx(stages["file->remote (staged)"]["gbps"] / slower,
                                                                              rel=2e-3)  # fmt: skip
    assert all(r["cpu_s_per_GiB"] > 0 for r in rows), rows
    # the staged pipeline's CPU-bound limit is no bound on a path without the staging copy: not given
    assert "cpu_bound_limit" not in path, path
    # with mapped paths off the same command runs the staged pipeline, says so, and gives the
    # CPU-bound limit of staged / slower stage computed from the stages' own rows
    from tent_bench.cpu import cores, staged_cpu_bound_limit

    off = tent("bench", "--path", "file:tcp", "--block-sizes", "4M", "--iters", "2", "--file-dir", str(tmp_path), "--json",
               "--rounds", "1", "--config", '{"mapped_paths": false}')  # fmt: skip
    assert off.returncode == 0, off.stderr
    rows = json.loads(off.stdout)
    staged = [r for r in rows if r["stage"].startswith("file->remote")]
    assert [(r["stage"], r["path"]) for r in staged] == [("file->remote (staged)", "initiator-staged")], staged
    s1, s2 = ({r["stage"]: r for r in rows}[k] for k in ("file->memory", "memory->remote"))
    gib = (1 << 30) / 1e9
    assert staged[0]["cpu_bound_limit"] == pytest.approx(staged_cpu_bound_limit(
        gib / s1["gbps"], gib / s2["gbps"], s1["cpu_s_per_GiB"], s2["cpu_s_per_GiB"], cores()), abs=2e-3)  # fmt: skip
    bad = tent("bench", "--path", "disk:tcp", "--block-sizes", "4M", "--iters", "1", "--file-dir", str(tmp_path))
    assert bad.returncode != 0 and "file:TRANSPORT" in bad.stderr + bad.stdout


def test_baselines_take_the_parallelism_the_plugins_publish():
    """cma/memcpy threads, socket streams and fio's bounds come from the transports' own defaults
    (`config_keys`), or from the config both sides run with: never a copy of them that could drift."""
    from tent_bench import cli
    from tent_gds.plugin import GdsTransport
    from tent_shm.plugin import ShmTransport
    from tent_tcp.transport import TcpTransport

    shm, tcp, gds = ShmTransport.config_keys, TcpTransport.config_keys, GdsTransport.config_keys
    assert cli._parallelism(None) == (shm["threads"], tcp["conns_per_rail"])
    assert cli._parallelism({"transports": {"shm": {"threads": 3}, "tcp": {"conns_per_rail": 6}}}) == (3, 6)
    assert cli._file_parallelism(None) == {"threads": gds["threads"], "depth": gds["queue_depth"],
                                           "piece_bytes": gds["chunk"]}  # fmt: skip
    assert cli._file_parallelism({"transports": {"gds": {"queue_depth": 4}}})["depth"] == 4
