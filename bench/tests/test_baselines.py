"""Baselines for `tent bench`: tiny sweeps that move verified bytes with the engine's parallelism,
rows whose numbers are consistent with each other, and fio moving the engine's bytes."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing as mp

import numpy as np
import pytest
from tent_bench.baselines import (
    BASELINES,
    BaselineSweep,
    BaselineUnavailable,
    _Slots,
    _tune_socket,
    available_baselines,
    run_baseline,
)

BLOCKS = [64 << 10, 1 << 20]
BATCHES = [1, 4]
OPS = ["READ", "WRITE"]
KEYS = {"engine", "transport", "op", "block_size", "batch_size", "gbps", "avg_us", "p50_us", "p99_us", "iters",
        "parallel", "verified_bytes"}
TRANSPORT = {"socket": "tcp", "cma": "cma", "memcpy": "memcpy", "mooncake": "tcp"}
PARALLEL = {"socket": 3, "cma": 2, "memcpy": 2, "mooncake": None}


def _tiny() -> BaselineSweep:
    return BaselineSweep(block_sizes=BLOCKS, batch_sizes=BATCHES, ops=OPS, iters=3, warmup=1, time_budget_s=2.0,
                         threads=2, streams=3, seed=4242)  # fmt: skip


def _check_rows(name: str, rows: list[dict], sweep: BaselineSweep) -> None:
    assert len(rows) == len(BLOCKS) * len(BATCHES) * len(OPS)
    seen = set()
    for r in rows:
        assert set(r) - {"mooncake_env"} == KEYS, r
        assert r["engine"] == name
        assert r["transport"] == TRANSPORT[name]
        assert r["op"] in OPS
        assert r["block_size"] in BLOCKS and r["batch_size"] in BATCHES
        # the copy path was checked before timing: the target's pattern READ, a second one WRITTEN and read back
        assert r["verified_bytes"] == 3 * sweep.buffer_bytes(), r
        assert r["parallel"] == PARALLEL[name]
        assert 1 <= r["iters"] <= sweep.iters
        for k in ("gbps", "avg_us", "p50_us", "p99_us"):
            assert isinstance(r[k], float) and math.isfinite(r[k]), (k, r)
        # GB/s is the bytes over the timed batches' summed latencies: consistent with their mean
        assert r["gbps"] == pytest.approx(r["block_size"] * r["batch_size"] / (r["avg_us"] * 1e3), rel=1e-6)
        assert r["p99_us"] >= r["p50_us"] * (1 - 1e-9)
        seen.add((r["op"], r["block_size"], r["batch_size"]))
    assert len(seen) == len(rows)


def _no_leftover_children() -> None:
    assert [p for p in mp.active_children() if p.name.startswith("tent-baseline")] == []


def test_registry_and_availability():
    assert set(BASELINES) == {"socket", "cma", "memcpy", "mooncake", "fio"}
    av = available_baselines()
    assert set(av) == set(BASELINES)
    assert av["socket"] is None and av["memcpy"] is None
    assert all(v is None or (isinstance(v, str) and v) for v in av.values())


@pytest.mark.parametrize("name", ["socket", "cma", "memcpy", "mooncake"])
def test_baseline_tiny_sweep(name):
    reason = available_baselines()[name]
    if reason is not None:
        with pytest.raises(BaselineUnavailable):
            BASELINES[name](_tiny())
        pytest.skip(f"{name} baseline unavailable: {reason}")
    sweep = _tiny()
    rows = BASELINES[name](sweep)
    _check_rows(name, rows, sweep)
    _no_leftover_children()


def test_time_budget_limits_iterations():
    sweep = BaselineSweep(
        block_sizes=[64 << 10], batch_sizes=[1], ops=["WRITE"], iters=10**9, warmup=10**9, time_budget_s=0.05
    )
    rows = run_baseline("memcpy", sweep)
    assert len(rows) == 1
    # the budget, not iters/warmup, ended the point: few batches, each far shorter than the cap
    assert 1 <= rows[0]["iters"] < 10**6
    assert rows[0]["iters"] * rows[0]["avg_us"] / 1e6 <= 0.05 + rows[0]["p99_us"] / 1e6 + 0.5


def test_invalid_sweep_and_unknown_name():
    with pytest.raises(ValueError):
        run_baseline("memcpy", BaselineSweep(block_sizes=[4096], batch_sizes=[1], ops=["COPY"], iters=1, warmup=0))
    with pytest.raises(ValueError):
        run_baseline("nope", _tiny())


def test_slots_walk_and_fixed():
    walk = _Slots(4 * 4096, 4096, walk=True)
    assert walk.batch(3) == [0, 4096, 8192]
    assert walk.batch(3) == [12288, 0, 4096]
    fixed = _Slots(4 * 4096, 4096, walk=False)
    assert fixed.batch(2) == [0, 4096]
    assert fixed.batch(2) == [0, 4096]


def test_child_failure_is_reported_and_cleaned_up():
    from tent_bench.baselines import BaselineError

    sweep = BaselineSweep(block_sizes=[4096], batch_sizes=[1], ops=["READ"], iters=1, warmup=0, host="256.0.0.1")
    with pytest.raises(BaselineError, match="socket"):
        run_baseline("socket", sweep)
    _no_leftover_children()


def test_mooncake_unavailable_raises(monkeypatch):
    from tent_bench import baselines

    monkeypatch.setattr(baselines, "_mooncake_unavailable_reason", lambda refresh=False: "not installed (test)")
    with pytest.raises(BaselineUnavailable, match="not installed"):
        baselines.mooncake_baseline(_tiny())
    assert baselines.available_baselines()["mooncake"] == "not installed (test)"


def test_verification_fails_on_a_misplaced_or_stale_copy():
    from tent_bench.baselines import BaselineError, _pattern, _verify_path

    from tent_core.testing import pattern

    n, seed = 4 << 20, 77
    target = _pattern(n, seed).copy()
    buf = np.zeros(n, np.uint8)

    def good_read():
        buf[:] = target

    def good_write():
        target[:] = buf

    assert _verify_path("x", buf, seed, good_read, good_write) == 3 * n
    target[:] = pattern(n, seed)

    def shifted_read():  # every slice 2 MiB off
        buf[:] = np.roll(target, 2 << 20)

    with pytest.raises(BaselineError, match="READ moved wrong bytes"):
        _verify_path("x", buf, seed, shifted_read, good_write)

    def write_nothing():  # the target keeps the first pattern: a stale buffer
        pass

    with pytest.raises(BaselineError, match="WRITE then READ"):
        _verify_path("x", buf, seed, good_read, write_nothing)


def test_pieces_and_shares_cover_every_byte_once():
    from tent_bench.baselines import _pieces, _shares

    parts = _pieces([0, 8 << 20], 3 * (1 << 20) + 5, 1 << 20)
    assert parts[:4] == [(0, 1 << 20), (1 << 20, 1 << 20), (2 << 20, 1 << 20), (3 << 20, 5)]
    assert sum(n for _, n in parts) == 2 * (3 * (1 << 20) + 5)
    shares = _shares(parts, 3)
    assert len(shares) == 3 and sum(shares, []) == parts and max(map(len, shares)) - min(map(len, shares)) <= 1
    assert _shares(parts[:1], 4) == [parts[:1]]


def test_team_runs_shares_on_distinct_threads_and_reports_errors():
    import threading

    from tent_bench.baselines import _Team

    team = _Team(3)
    try:
        seen: list[int] = []
        barrier = threading.Barrier(3, timeout=30)  # only passes if the three shares run at the same time

        def share():
            barrier.wait()
            seen.append(threading.get_ident())

        team.run([share, share, share])
        assert len(set(seen)) == 3

        def boom():
            raise OSError("copy failed")

        with pytest.raises(OSError, match="copy failed"):
            team.run([share_ok := (lambda: None), boom])
        team.run([share_ok])  # still usable
    finally:
        team.close()


def _fio_opts(cmd: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in cmd[1:] if a.startswith("--") and "=" in a)


def test_fio_moves_the_engines_bytes():
    from tent_bench.baselines import fio_command, fio_settings

    for block, requests in ((1 << 20, 40), (64 << 20, 40), (4096, 7), (64 << 20, 1)):
        for setting in fio_settings(block):
            cmd = fio_command("fio", "/f", "READ", block, requests, setting)
            opt = _fio_opts(cmd)
            jobs, size, io_size = int(opt["numjobs"]), int(opt["size"]), int(opt["io_size"])
            assert jobs * size == block  # the range [0, block), split between the jobs
            assert int(opt["offset_increment"]) == size
            assert jobs * io_size == block * requests  # the same bytes as `requests` requests of `block`
            # fio's buffers (one I/O size per I/O in flight) add up to the block, like the engine's memory
            assert int(opt["bs"]) * jobs * int(opt["iodepth"]) == block and int(opt["bs"]) >= min(block, 1 << 20)
            assert "time_based" not in " ".join(cmd) and opt["direct"] == "0"
            assert opt["iomem_align"] == "4096"  # page-aligned buffers, like the engine's
            assert opt["ioengine"] == setting["ioengine"] and int(opt["iodepth"]) == setting["iodepth"]


def test_fio_rate_spans_every_jobs_ios():
    from tent_bench.baselines import BaselineError, fio_span

    # two jobs, the second starting 100 ms late: each ran 400 ms by its own clock, 500 ms in all
    # (fio's own figure would divide by 400 ms); log lines: end ms since the epoch, latency ns, ...
    job1 = [f"{1000 + 100 * k}, 100000000, 1, 1048576, 0, 0\n" for k in range(1, 5)]
    job2 = [f"{1100 + 100 * k}, 100000000, 1, 1048576, 0, 0\n" for k in range(1, 5)]
    span, skew = fio_span([job1, job2])
    assert span == pytest.approx(0.5) and skew == pytest.approx(0.1)
    assert fio_span([job1]) == (pytest.approx(0.4), 0.0)
    # sub-millisecond latencies: the first I/O started before its end's millisecond
    assert fio_span([["1000, 250000, 1, 4096, 0, 0\n", "1003, 250000, 1, 4096, 0, 0\n"]])[0] == pytest.approx(0.00325)
    with pytest.raises(BaselineError, match="no latency log"):
        fio_span([])
    with pytest.raises(BaselineError, match="empty"):
        fio_span([job1, []])


def test_fio_run_reports_its_rate_over_the_span_of_its_ios(tmp_path, monkeypatch):
    import os
    import shutil
    import tempfile

    from tent_bench.baselines import _fio_run

    if shutil.which("fio") is None:
        pytest.skip("fio not installed")
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where fio's logs go
    f = tmp_path / "data"
    f.write_bytes(np.random.default_rng(1).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes())
    for op, setting in (("WRITE", {"ioengine": "libaio", "numjobs": 2, "iodepth": 4}),
                        ("READ", {"ioengine": "psync", "numjobs": 2, "iodepth": 1})):  # fmt: skip
        row = _fio_run(shutil.which("fio"), str(f), op, 8 << 20, 32, setting)
        assert row["bytes"] == 32 * (8 << 20) and row["fio_job_start_skew_ms"] >= 0
        # the span covers every job's I/Os, so it is close to fio's longest runtime or above it: fio's
        # runtime also counts a job's set-up before its first I/O, which no I/O covers (a CI run:
        # 19.9 ms of I/Os in a 23 ms WRITE runtime), and the logs' stamps are whole milliseconds
        span_s = row["bytes"] / (row["gbps"] * 1e9)
        assert span_s >= 0.8 * row["runtime_ms"] / 1e3 - 2e-3
        assert row["gbps"] > 0 and row["fio_reported_gbps"] > 0
        # fio's whole process holds its job threads (and io_uring's workers, and its start-up)
        assert row["cpu_s_per_gb"] > 0 and row["fio_process_cpu_s_per_gb"] >= row["cpu_s_per_gb"] - 1e-3
    assert os.listdir(tmp_path / "tmp") == []  # fio's logs removed


def test_fio_settings_stay_within_the_executors_parallelism():
    from tent_bench.baselines import FIO_ENGINES, fio_settings

    # one 1 MiB request is one piece: one job, one I/O in flight, every engine tried
    one = fio_settings(1 << 20)
    assert sorted(s["ioengine"] for s in one) == sorted(FIO_ENGINES)
    assert all(s["numjobs"] == 1 and s["iodepth"] == 1 for s in one)
    # 64 pieces over 2 workers with up to 16 in flight each: jobs <= 2, depth <= 16, psync depth 1
    # (psync: one job reads the whole 64 MiB in one I/O, two jobs 32 MiB each)
    many = fio_settings(64 << 20, threads=2, depth=16)
    assert {(s["numjobs"], s["iodepth"]) for s in many if s["ioengine"] == "io_uring"} == {
        (j, d) for j in (1, 2) for d in (1, 4, 16)}  # fmt: skip
    assert {s["iodepth"] for s in many if s["ioengine"] == "psync"} == {1}
    # never more in flight than the request has pieces, never more jobs than workers
    for block, threads, depth in ((4 << 20, 2, 16), (2 << 20, 4, 16), (64 << 20, 1, 4)):
        for s in fio_settings(block, threads=threads, depth=depth):
            assert s["numjobs"] <= threads and s["iodepth"] <= depth
            assert s["numjobs"] * s["iodepth"] <= block >> 20


def test_file_point_requests():
    from tent_bench.baselines import file_point_requests

    assert file_point_requests(40, 0, 1 << 20) == 40  # no floor: exactly --iters
    assert file_point_requests(40, 4 << 30, 1 << 20) == 4096  # 4 GiB in 1 MiB requests
    assert file_point_requests(40, 4 << 30, 64 << 20) == 64
    assert file_point_requests(40, 1 << 30, 64 << 20) == 40  # --iters already moves more
    assert file_point_requests(1, 3 << 20, 2 << 20) == 2  # rounded up, never short of the floor
    assert file_point_requests(1, 8 << 20, 1 << 20, batch=2, threads=2) == 2  # per thread, per batch


def test_fio_tune_keeps_the_best_setting_per_point(monkeypatch, tmp_path):
    from tent_bench import baselines

    f = tmp_path / "data"
    f.write_bytes(b"\0" * (4 << 20))
    speed = {"psync": 3.0, "io_uring": 2.0, "libaio": 1.0}
    calls = []

    def fake(fio, path, op, block, requests, setting):
        calls.append((op, block, requests, setting["ioengine"]))
        g = speed[setting["ioengine"]] * (4.0 if op == "WRITE" and setting["ioengine"] == "libaio" else 1.0)
        return {"engine": "fio", "op": op, "block_size": block, "gbps": g, "fio_setting": dict(setting)}

    monkeypatch.setattr(baselines, "_fio_run", fake)
    monkeypatch.setattr(baselines.shutil, "which", lambda name: "/usr/bin/fio")
    sweep = baselines.BaselineSweep(block_sizes=[1 << 20], batch_sizes=[1], ops=["READ", "WRITE"], iters=3, warmup=0,
                                    file_path=str(f), min_bytes=8 << 20)  # fmt: skip
    best, rows = baselines.fio_tune(sweep)
    assert best == {f"READ {1 << 20}": {"ioengine": "psync", "numjobs": 1, "iodepth": 1},
                    f"WRITE {1 << 20}": {"ioengine": "libaio", "numjobs": 1, "iodepth": 1}}  # fmt: skip
    assert len(rows) == 6 and {c[2] for c in calls} == {8}  # every setting moves the floor's bytes
    calls.clear()
    baselines.fio_baseline(dataclasses.replace(sweep, fio_settings=best))
    assert [(c[0], c[3]) for c in calls] == [("READ", "psync"), ("WRITE", "libaio")]


def test_mooncake_tune_keeps_the_best_setting(monkeypatch):
    from tent_bench import baselines

    speed = {"": 2.0, "4": 3.5, "8": 3.0}

    def fake(sweep):
        lanes = (sweep.mooncake_env or {}).get("MC_TCP_LANES_PER_PEER", "")
        if lanes == "16":
            raise baselines.BaselineError("rejected")
        return [{"engine": "mooncake", "gbps": speed[lanes] * f, "mooncake_env": dict(sweep.mooncake_env or {})}
                for f in (1.0, 1.1)]

    monkeypatch.setattr(baselines, "mooncake_baseline", fake)
    knobs = [{}, {"MC_TCP_LANES_PER_PEER": "4"}, {"MC_TCP_LANES_PER_PEER": "8"}, {"MC_TCP_LANES_PER_PEER": "16"}]
    best, rows = baselines.mooncake_tune(_tiny(), knobs)
    assert best == {"MC_TCP_LANES_PER_PEER": "4"} and len(rows) == 6


def _run_socket_target(sweep: BaselineSweep, child, errors: list[BaseException]) -> None:
    import os

    import tent_bench.baselines as bl

    try:
        bl._socket_target(child, sweep, {"parent_pid": os.getppid()})  # as a child of this process's parent
    except BaseException as e:  # noqa: BLE001 - the test reads it
        errors.append(e)


def test_socket_target_listens_until_its_initiator_connected(monkeypatch):
    """The flake of `tent bench --baseline socket` under load (ECONNREFUSED): the target's listener
    gave up after a fixed accept deadline counted from its "ready", while the initiator (a spawned
    interpreter: imports, a prefaulted buffer) started only after that "ready". Here the initiator
    connects after that deadline (shrunk to 0.2 s) has passed, all its streams at once, more of
    them than the target's old backlog: every one is accepted and served."""
    import socket
    import struct
    import threading
    import time

    import tent_bench.baselines as bl

    monkeypatch.setattr(bl, "_STARTUP_TIMEOUT_S", 0.2)
    sweep = dataclasses.replace(_tiny(), block_sizes=[4096], batch_sizes=[1], streams=24)
    parent, child = mp.Pipe()
    errors: list[BaseException] = []
    target = threading.Thread(target=_run_socket_target, args=(sweep, child, errors), daemon=True)
    target.start()
    assert parent.poll(60), "the target sent no ready"
    kind, info = parent.recv()
    assert kind == "ready"
    time.sleep(1.0)  # the initiator is slow to start: past the old accept deadline
    got: list[object] = []
    hdr = struct.Struct("<c7xQQ40x")

    def stream() -> None:
        try:
            with socket.create_connection((sweep.host, info["port"]), timeout=60) as s:
                s.sendall(hdr.pack(b"R", 0, 16))  # served: the bytes come back
                data = b""
                while len(data) < 16:
                    chunk = s.recv(16 - len(data))
                    if not chunk:
                        break
                    data += chunk
                got.append(len(data))
                s.sendall(hdr.pack(b"Q", 0, 0))
        except OSError as e:
            got.append(e)

    conns = [threading.Thread(target=stream) for _ in range(sweep.streams)]
    for c in conns:
        c.start()
    for c in conns:
        c.join(90)
    target.join(60)
    assert got == [16] * sweep.streams, got
    assert not target.is_alive() and not errors, errors


def test_socket_target_gives_up_when_its_parent_does():
    """Without a deadline of its own, the target's accept loop ends when the parent stops waiting
    (closes the pipe): it does not linger with its listener open."""
    import threading

    sweep = dataclasses.replace(_tiny(), block_sizes=[4096], batch_sizes=[1])
    parent, child = mp.Pipe()
    errors: list[BaseException] = []
    target = threading.Thread(target=_run_socket_target, args=(sweep, child, errors), daemon=True)
    target.start()
    assert parent.poll(60) and parent.recv()[0] == "ready"
    parent.close()
    target.join(60)
    assert not target.is_alive()
    assert len(errors) == 1 and "parent" in str(errors[0]), errors


def test_a_target_error_nobody_read_is_found():
    """The parent reads the initiator's pipe; a target that failed first left its error in its own,
    where _run_procs now looks when the initiator fails (the cause, not the initiator's symptom)."""
    from tent_bench.baselines import _target_error

    parent, child = mp.Pipe()
    assert _target_error(parent) is None and _target_error(None) is None
    child.send(("error", "socket_target: TimeoutError: timed out"))
    assert _target_error(parent) == "socket_target: TimeoutError: timed out"
    child.close()
    assert _target_error(parent) is None  # the pipe closed: nothing more to say


def test_socket_streams_on_loopback_take_the_engines_congestion_control():
    """The socket baseline's loopback streams run the congestion control the tcp transport gives its
    own loopback connections (not a pacing host default the engine avoids there)."""
    import socket

    tcp = pytest.importorskip("tent_tcp.transport")
    names = [n for n in str(tcp.TcpTransport.config_keys["loopback_congestion"]).split(",") if n]
    if not names:
        pytest.skip("the tcp transport keeps the host's congestion control on loopback")
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    with ls, socket.create_connection(ls.getsockname(), timeout=10) as c:
        a, _ = ls.accept()
        with a:
            accepted = set()
            for s in (c, a):
                _tune_socket(s)
                got = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).rstrip(b"\0").decode()
                accepted.add(got)
            probe = socket.socket()
            with probe:
                first = next((n for n in names if _accepts(probe, n)), None)
            assert first is not None and accepted == {first}, (accepted, names)


def _accepts(s, name: str) -> bool:
    import socket

    try:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())
        return True
    except OSError:
        return False
