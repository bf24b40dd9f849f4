"""The small-request benchmark (tent_bench.small) and its C bare limits, run for real, briefly.
These check that the figures come from moved bytes and that the limits copy what they claim;
the figures themselves belong in docs/benchmarks.md, not in assertions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from tent_bench import _bare, small

from tent_core.errors import NoPathError

KiB = 1024


def test_bare_cma_and_memcpy_copy_the_bytes() -> None:
    src = small.fill(1 << 20, seed=3)
    dst = np.zeros(1 << 20, np.uint8)
    lat = np.frombuffer(_bare.cma(os.getpid(), 0, dst.ctypes.data, src.ctypes.data, 1 << 20, 3, 2, 64 * KiB), np.float64)
    assert len(lat) == 3 and (lat > 0).all()
    assert np.array_equal(dst, src)
    dst[:] = 0
    np.frombuffer(_bare.batch_cma(os.getpid(), 1, src.ctypes.data, dst.ctypes.data, 64 * KiB, 16, 2, 2), np.float64)
    assert np.array_equal(dst, src)  # WRITE: ours (src) -> theirs (dst)
    dst[:] = 0
    _bare.memcpy(dst.ctypes.data, src.ctypes.data, 1 << 20, 2)
    assert np.array_equal(dst, src)


def test_bare_tcp_round_trips() -> None:
    port = _bare.tcp_serve("127.0.0.1")
    for op in (0, 1):
        lat = np.frombuffer(_bare.tcp("127.0.0.1", port, op, 64 * KiB, 20), np.float64)
        assert len(lat) == 20 and (lat > 0).all()


def test_bare_tcp_calls_time_each_call_of_an_exchange() -> None:
    """The socket calls alone (one thread, both ends): five timings per exchange, the bytes checked in C."""
    for op in (0, 1):
        t = np.frombuffer(_bare.tcp_calls(op, 64 * KiB, 30), np.float64).reshape(-1, 5)
        assert t.shape == (30, 5) and (t >= 0).all() and (t[:, :4].sum(axis=1) > 0).all()
    with pytest.raises(ValueError):
        _bare.tcp_calls(0, 2 << 20, 1)  # more than both socket buffers hold at once
    with pytest.raises(ValueError):
        _bare.tcp_calls(1, 64 * KiB, 0)


def test_bare_tcp_moves_the_bytes_of_the_given_buffers() -> None:
    """With buffers given (the engine's, in the benchmark), the bare loop moves exactly their bytes."""
    remote = small.fill(1 << 20, seed=7)
    local = np.zeros(64 * KiB, np.uint8)
    port = _bare.tcp_serve("127.0.0.1", remote.ctypes.data, remote.nbytes)
    _bare.tcp("127.0.0.1", port, 0, 64 * KiB, 2, local.ctypes.data)  # READ
    assert np.array_equal(local, remote[: 64 * KiB])
    local[:] = small.fill(64 * KiB, seed=8)
    _bare.tcp("127.0.0.1", port, 1, 64 * KiB, 2, local.ctypes.data)  # WRITE
    assert np.array_equal(remote[: 64 * KiB], local)
    assert np.array_equal(remote[64 * KiB :], small.fill(1 << 20, seed=7)[64 * KiB :])


def test_bare_tcp_batch_moves_each_request_s_own_bytes() -> None:
    """The batch loop: request i moves [local + i * block) <-> [remote + i * block), its requests
    shared over the connections (also when they do not divide evenly)."""
    remote = small.fill(1 << 20, seed=11)
    local = np.zeros(1 << 20, np.uint8)
    port = _bare.tcp_serve("127.0.0.1", remote.ctypes.data, remote.nbytes)
    lat = np.frombuffer(_bare.tcp_batch("127.0.0.1", port, 0, 64 * KiB, 16, 3, 4, local.ctypes.data), np.float64)
    assert len(lat) == 3 and (lat > 0).all()
    assert np.array_equal(local, remote)  # READ
    local[:] = small.fill(1 << 20, seed=12)
    _bare.tcp_batch("127.0.0.1", port, 1, 4 * KiB, 7, 2, 3, local.ctypes.data)  # WRITE, 7 over 3 connections
    assert np.array_equal(remote[: 28 * KiB], local[: 28 * KiB])
    assert np.array_equal(remote[28 * KiB :], small.fill(1 << 20, seed=11)[28 * KiB :])
    with pytest.raises(ValueError):
        _bare.tcp_batch("127.0.0.1", port, 0, 64 * KiB, 16, 1, 4, 0)  # no local buffer


def _ccs(port: int) -> list[str]:
    """The congestion control of every established socket with `port` at either end (ss -ti)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} or dport = :{port} )"],
                         capture_output=True, text=True, timeout=10, check=True).stdout  # fmt: skip
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return [info.split()[0] for info in lines[1::2]]


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_bare_tcp_takes_the_congestion_control_it_is_given() -> None:
    """tcp_congestion: the listener (so the connections it accepts) and the client's connections
    take the first name the kernel accepts, as the engine's loopback connections do; the bytes
    still arrive."""
    assert _bare.tcp_congestion("nosuchcc,reno") == "reno"
    try:
        remote = np.random.default_rng(7).integers(0, 256, 4 * 64 * KiB, dtype=np.uint8)
        local = np.zeros_like(remote)
        port = _bare.tcp_serve("127.0.0.1", remote.ctypes.data, remote.nbytes)
        t = threading.Thread(target=_bare.tcp_batch, args=("127.0.0.1", port, 0, 64 * KiB, 4, 3000, 2, local.ctypes.data))
        t.start()
        seen: list[str] = []
        deadline = time.monotonic() + 20
        while t.is_alive() and time.monotonic() < deadline and len(seen) < 4:
            seen = _ccs(port)
        t.join(120)
        assert not t.is_alive()
        assert len(seen) >= 4 and set(seen) == {"reno"}, seen  # both ends of both connections
        assert np.array_equal(local, remote)
    finally:
        assert _bare.tcp_congestion("") == ""  # the host's again, for the other tests
    with pytest.raises(ValueError, match="tcp_congestion"):
        _bare.tcp_congestion("reno,,cubic")


def test_one_at_a_time_rows_next_to_the_bare_limit() -> None:
    rows = small.one_at_a_time("shm", [4 * KiB, 64 * KiB], ["READ", "WRITE"], 1, 1 << 20)
    rows += small.one_at_a_time("tcp", [64 * KiB], ["READ"], 1, 1 << 20)
    assert [(r["transport"], r["op"], r["block"]) for r in rows] == [
        ("shm", "READ", 4 * KiB), ("shm", "READ", 64 * KiB), ("shm", "WRITE", 4 * KiB), ("shm", "WRITE", 64 * KiB),
        ("tcp", "READ", 64 * KiB),
    ]  # fmt: skip
    for r in rows:
        assert r["tent_gbps"] > 0 and r["bare_gbps"] > 0 and r["ratio"] > 0
        assert r["run_gbps"] > 0 and r["run_ratio"] > 0  # Engine.run, the synchronous form
        assert r["tent_p50_us"] <= r["tent_p99_us"] <= r["tent_p999_us"]
    for r in rows[:4]:  # shm: the baseline, the same copy called from Python, in the same run
        assert r["python_gbps"] > 0 and r["python_ratio"] > 0 and r["run_python_ratio"] > 0
        assert r["python_form"] == small.PYTHON_FORMS[r["shm_mode"]]
    assert "python_gbps" not in rows[4]  # no Python baseline for tcp
    # tcp polls by default (adaptive busy poll): the bare limit both ways, polling like the engine and sleeping
    assert rows[4]["bare_sleep_gbps"] > 0 and rows[4]["sleep_ratio"] > 0
    assert all("bare_sleep_gbps" not in r for r in rows[:4])
    md = small.markdown(rows)
    assert f"| shm ({rows[0]['shm_mode']}) | READ | 4 KiB |" in md and "| tcp | READ | 64 KiB |" in md
    assert f"- bare Python, shm mode {rows[0]['shm_mode']}: " in md


def test_python_baselines_copy_the_bytes() -> None:
    """The Python-level baselines move exactly the bytes they claim, both shm modes, both ops."""
    from tent_core import Engine

    n = 64 * KiB
    for mode in ("memfd", "cma"):
        cfg = {"transports": {"shm": {"mode": mode}}}
        with small.target(n, cfg) as t, Engine(cfg, transports=["shm"]) as eng:
            local = eng.allocate(n, segment="small-local")
            small._verify(eng, local, t.segment, n, t.seed)  # connects, and leaves the target's pattern in place
            local.array[:] = 0
            got_mode, loop = small._python_one(eng, t, "READ", n, 2, local.addr)
            assert got_mode == mode and len(loop()) == 2
            assert np.array_equal(local.array, small.fill(n, t.seed))
            local.array[:] = small.fill(n, seed=9)
            _, loop = small._python_one(eng, t, "WRITE", n, 2, local.addr)
            loop()
            local.array[:] = 0
            eng.read(local, t.segment, n)
            assert np.array_equal(local.array, small.fill(n, seed=9))


def test_scenarios_through_the_command_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tent_bench.small", "--scenarios", "batches,two_engines,submit_cost", "--transports", "tcp",
         "--rounds", "1", "--budget", "1M", "--json"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)["rows"]
    kinds = {r["scenario"] for r in rows}
    assert kinds == {"batches", "two_engines", "submit_cost"}
    for b in (r for r in rows if r["scenario"] == "batches"):  # tcp batches next to the bare batch loop
        assert b["bare_gbps"] > 0 and b["ratio"] > 0 and b["bare_conns"] == 4
    te = {r["op"]: r for r in rows if r["scenario"] == "two_engines"}
    assert set(te) == {"READ", "WRITE"}  # both ops, each its own row and verdict
    for r in te.values():
        assert (r["batch"], r["block"], r["rounds"]) == (16, 64 * KiB, 1)
        # one round: the ratio is that round's one-process rate over its two-process rate
        assert r["ratio"] == pytest.approx(r["one_process_gbps"] / r["two_processes_gbps"], rel=1e-6)
        assert r["one_process_p50_us"] <= r["one_process_p99_us"]
    assert [v for v in small.targets(list(te.values()))] == [
        f"two engines in one process >= 0.8x two processes ({op}): {small._verdict(te[op]['ratio'] >= 0.8)} "
        f"({te[op]['ratio']:.2f}x)" for op in te]
    costs = {r["variant"]: r["cpu_us"] for r in rows if r["scenario"] == "submit_cost"}
    assert set(costs) == {"fast path", "fast path, no inline", "planner"} and all(v > 0 for v in costs.values())


def test_many_buffers_and_large_rows() -> None:
    """The 10k-buffer scenario (scaled down) reads real buffers of both segments, and registers
    new ones mid-run; the several-MiB scenario verifies bytes before it times."""
    mb = small.many_buffers("tcp", 1, count=40, few=4, many=64)
    assert len(mb) == 1
    r = mb[0]
    assert (r["few"], r["many"]) == (4, 64)
    assert r["few_us"] > 0 and r["many_us"] > 0 and r["scattered_us"] > 0 and r["ratio"] > 0
    assert r["first_read_few_ms"] > 0 and r["first_read_many_ms"] > 0
    lg = small.large([1 << 20, 2 << 20], ["WRITE"], 1, 4 << 20)
    assert [(x["op"], x["block"], x["bare_threads"], x["bare_piece"]) for x in lg] == [
        ("WRITE", 1 << 20, 2, 1 << 20), ("WRITE", 2 << 20, 2, 1 << 20)]  # fmt: skip
    md = small.markdown(mb + lg)
    assert "| tcp | 4 / 64 |" in md and "| WRITE | 2 MiB |" in md


def test_each_target_holds_its_own_pattern_and_a_wrong_one_fails_the_check() -> None:
    """A fresh seed per target process: bytes left from another target (another round) cannot verify."""
    from tent_core import Engine

    n = 64 * KiB
    with small.target(n) as a, small.target(n) as b, Engine(transports=["tcp"]) as eng:
        assert a.seed != b.seed
        local = eng.allocate(n, segment="small-local")
        small._verify(eng, local, a.segment, n, a.seed)
        small._verify(eng, local, b.segment, n, b.seed)
        with pytest.raises(RuntimeError, match="READ returned wrong bytes"):
            small._verify(eng, local, b.segment, n, a.seed)  # b's bytes checked against a's stream


def test_fill_never_repeats_within_a_buffer() -> None:
    """The check pattern has no period a shifted or stale slice could hide behind (up to 64 MiB)."""
    a = small.fill(64 << 20).view(np.uint64)
    assert np.unique(a).size == a.size  # every 8-byte word of 64 MiB differs from every other
    assert np.array_equal(small.fill(1000)[:100], small.fill(100))  # a prefix is the same bytes
    assert not np.array_equal(small.fill(1 << 20), small.fill(1 << 20, seed=1))


def test_tent_bench_quick_sweeps_small_sizes_next_to_the_bare_limit() -> None:
    tent = os.path.join(os.path.dirname(sys.executable), "tent")
    out = subprocess.run([tent, "bench", "--quick", "--json", "--transport", "shm", "--ops", "READ"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads(out.stdout)
    assert [(r["transport"], r["op"], r["block"]) for r in rows] == [("shm", "READ", b) for b in small.QUICK_SIZES]
    assert small.QUICK_SIZES[0] == 4 * KiB and small.QUICK_SIZES[-1] == 1024 * KiB
    for r in rows:
        assert r["rounds"] == 3 and r["bare_gbps"] > 0 and r["tent_p50_us"] <= r["tent_p99_us"] <= r["tent_p999_us"]
    one = subprocess.run([tent, "bench", "--quick", "--json", "--transport", "shm", "--ops", "WRITE", "--rounds", "1"],
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    assert {r["rounds"] for r in json.loads(one.stdout)} == {1}  # --rounds is taken, not ignored
    bad = subprocess.run([tent, "bench", "--quick", "--ops", "COPY"], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "READ and/or WRITE" in bad.stderr


def test_many_buffers_over_shm_runs_in_cma_mode_since_memfd_mode_refuses_plain_memory() -> None:
    """The target registers plain memory, which shm in memfd mode (the default) cannot map: the
    engine refuses the first request with the reason (no retrying until a deadline); the scenario
    therefore measures shm in CMA mode, which reaches any memory, and says so in its row."""
    memfd = {"transports": {"shm": {"mode": "memfd"}}}
    with pytest.raises(NoPathError) as refused:
        small.many_buffers("shm", 1, count=4, few=2, many=8, config=memfd)
    assert "memfd mode" in str(refused.value) and "engine.allocate()" in str(refused.value)
    rows = small.run(["many_buffers"], ["shm"], 1, 1 << 20, config=memfd)
    assert len(rows) == 1 and rows[0]["transport"] == "shm" and rows[0]["shm_mode"] == "cma"
    assert "not_measured" not in rows[0] and rows[0]["few_us"] > 0 and rows[0]["many_us"] > 0
    md = small.markdown(rows)
    assert "| shm (cma) | 10 / 10000 |" in md and "- shm (cma): a segment of 10000 buffers within 1.1x of 10" in md
    assert small.with_shm_mode(memfd, "cma") == {"transports": {"shm": {"mode": "cma"}}} and memfd["transports"]["shm"]["mode"] == "memfd"


def test_many_buffers_over_shm_with_cma_is_measured() -> None:
    mb = small.many_buffers("shm", 1, count=40, few=4, many=64, config={"transports": {"shm": {"mode": "auto"}}})
    assert len(mb) == 1 and "not_measured" not in mb[0]
    assert mb[0]["few_us"] > 0 and mb[0]["many_us"] > 0 and mb[0]["first_read_many_ms"] > 0


def test_targets_are_judged_from_the_rows() -> None:
    def one(tr: str, block: int, **kw: float) -> dict:
        return {"scenario": "one_at_a_time", "transport": tr, "op": "READ", "block": block, **kw}

    rows = [
        one("shm", 64 * KiB, ratio=0.7, python_ratio=0.84, run_python_ratio=0.89),
        one("shm", 256 * KiB, ratio=0.8, python_ratio=0.87, run_python_ratio=0.94),
        one("shm", 256 * KiB, ratio=0.8, python_ratio=0.85, run_python_ratio=0.88),
        one("tcp", 64 * KiB, tent_gbps=1.3, run_gbps=1.2, bare_gbps=1.57, ratio=0.8),
        {"scenario": "batches", "transport": "shm", "op": "READ", "batch": 16, "block": 64 * KiB, "tent_gbps": 22.4},
        {"scenario": "many_buffers", "transport": "shm", "shm_mode": "cma", "few": 10, "many": 10000, "ratio": 1.12},
        {"scenario": "qos_tail", "transport": "tcp", "ratio": 2.9},
        {"scenario": "many_buffers", "transport": "rdma", "not_measured": "no transport can reach it"},
        {"scenario": "batches", "transport": "tcp", "op": "READ", "batch": 16, "block": 64 * KiB, "tent_gbps": 3.9,
         "bare_gbps": 3.5, "bare_conns": 4},  # fmt: skip
    ]
    v = small.targets(rows)
    assert v[0] == ("shm READ 64 KiB one at a time >= 0.8x the bare copy from Python (issue 17's baseline): **met** "
                    "(submit().wait() 0.84x, run() 0.89x; against the bare C loop: submit().wait() 0.70x, run() 0.70x)")
    c_only = small.targets([one("shm", 64 * KiB, ratio=0.82, run_ratio=0.79)])  # no Python copy timed: the C loop judges
    assert c_only == ["shm READ 64 KiB one at a time >= 0.8x the bare copy in C: **not met** "
                      "(submit().wait() 0.82x, run() 0.79x)"], c_only
    assert "**met with run() only** (submit().wait() 0.87x, run() 0.94x;" in v[1]
    assert "**not met** (submit().wait() 0.85x, run() 0.88x;" in v[2]
    assert v[3] == "tcp READ 64 KiB one at a time >= 2.5 GB/s: **not met** (1.30 GB/s; the bare C loop moved 1.57 GB/s)"
    assert "batches of 16 x 64 KiB >= 12.0 GB/s: **met** (22.40 GB/s)" in v[4]
    assert v[5].startswith("shm (cma): a segment of 10000 buffers") and "**not met** (1.12x)" in v[5]
    assert "**met** (2.90x)" in v[6] and v[7].startswith("many_buffers rdma: not measured")
    assert v[8] == "tcp READ batches of 16 x 64 KiB >= 4.0 GB/s: **not met** (3.90 GB/s; the bare C batch loop moved 3.50 GB/s)"
    runs = [{"queued_median_us": x} for x in (1.0, 1.6, 2.4)]
    assert small.submit_target(runs) == "submit() queued median <= 2 us: **met** (1.60 us, median of 3 runs: 1.00, 1.60, 2.40)"


def test_multi_rail_mice_rows_run_this_tree_in_a_child() -> None:
    """One round of multi_rail_mice (scaled down): 64 KiB mice over two real loopback tcp rails in a
    child process, every one placed by the native fast path, both rails used, and its table."""
    rows = small.multi_rail_mice(1, count=200)
    assert [r["variant"] for r in rows] == ["this tree"]
    r = rows[0]
    assert r["native_share"] == 1.0, r  # every mouse of both loops had its rail chosen natively
    assert 0 < r["rail_share"] <= 0.5 and r["p50_us"] <= r["p99_us"] and r["cpu_us"] > 0, r
    assert "64 KiB mice on a route of two tcp rails" in small.markdown(rows)


def test_steady_rounds_calibrate_once_and_warm_up_untimed() -> None:
    calls: list[int] = []

    def make(c: int) -> Callable[[], list[float]]:
        def loop() -> list[float]:
            calls.append(c)
            return [0.0] * c

        return loop

    one, count = small._steady(make, 4096, 0.01, probe=40)
    assert calls == [40, 40] and count >= 40  # the probe twice (first untimed), never fewer than it
    calls.clear()
    r = one()
    assert calls == [max(10, count // 20), count]  # the warm-up, then the timed loop alone
    assert r["gbps"] > 0 and len(r["lat"]) == count


def test_tcp_rows_timed_by_seconds() -> None:
    rows = small.batches("tcp", 4, 64 * KiB, ["WRITE"], 2, 1 << 20, seconds=0.02)
    rows += small.one_at_a_time("tcp", [64 * KiB], ["READ"], 1, 1 << 20, seconds=0.02)
    for r in rows:
        assert r["seconds"] == 0.02 and r["count"] >= 20
        assert r["tent_gbps"] > 0 and r["bare_gbps"] > 0 and r["ratio"] > 0
