"""refhub's benchmark drivers, small: the per-client server benchmark and the data-plane benchmark's
round bookkeeping (junk between runs, byte checks, interleaved rounds). The figures themselves are
benchmark output (docs/benchmarks.md), not test assertions."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

pytest.importorskip("tent_core.engine")

from refhub.client import checksum  # noqa: E402
from tent_bench.refhub.rounds import junk_fill, ratio_summary, summary  # noqa: E402


def test_junk_fill_differs_per_round_and_per_array() -> None:
    data = np.random.default_rng(3).integers(0, 255, 1 << 20, dtype=np.uint8)
    a, b = np.ones(1 << 20, np.uint8), np.ones(1 << 20, np.uint8)
    junk_fill([a, b], seed=1)
    first = (checksum(a), checksum(b))
    assert first[0] != first[1]  # two arrays of one round get different junk
    assert checksum(a) != checksum(data) and checksum(a) != checksum(np.ones(1 << 20, np.uint8))
    junk_fill([a, b], seed=2)
    assert (checksum(a), checksum(b)) != first  # the next round's junk is not the previous round's


def test_summary_median_and_spread() -> None:
    s = summary([1.0, 2.0, 4.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 4.0, "spread": 1.5, "rounds": 3}
    r = ratio_summary([1.0, 3.0], [2.0, 2.0])
    assert r["median"] == 1.0 and r["min"] == 0.5 and r["max"] == 1.5
    with pytest.raises(ValueError):
        ratio_summary([1.0], [1.0, 2.0])


def test_server_bench_one_socket_per_client_with_heartbeats() -> None:
    from tent_bench.refhub.server import run

    res = run(clients=64, procs=2, shards=4, duration=3.0, warm=1.0, per_client=True, hb_interval=0.25)
    assert res["client_sockets"] == 64 and not res["batched_frames"], res
    assert res["error_replies"] == 0 and res["server_failed_replicas"] == 0, res
    # every client went through whole publish .. unpublish cycles, on its own socket
    assert res["clients_cycled"] == 64, res
    # each client heartbeat on its own socket and got answers (the handle was known)
    assert res["hb_replies"] >= 64, res


def test_dataplane_checks_every_run_against_junk() -> None:
    from tent_bench.refhub.data import dataplane

    res = dataplane(size_mb=24, repeat=2, tensors=20)
    assert res["verified_every_byte"] is True
    # 3 rounds (one warm-up) x 5 timed runs, each after a fresh junk fill and followed by a byte check
    assert res["junk_filled_before_every_run"] == 15, res
    assert res["ratio_rounds"]["rounds"] == 2 and len(res["samples"]["refhub"]) == 2, res
    assert res["control_ratio_rounds"]["rounds"] == 2 and len(res["samples"]["raw_again"]) == 2, res
    # the baseline is one raw form, the one with the better median, round by round
    form = max(("windowed", "one_batch"), key=lambda f: statistics.median(res["samples"][f"raw_{f}"]))
    assert res["raw_form"] == form.replace("_", "-"), res
    want = statistics.median(a / b for a, b in zip(res["samples"]["refhub"], res["samples"][f"raw_{form}"], strict=True))
    assert abs(res["ratio"] - want) < 0.01, res
    assert 0 < res["cpu_bound_ratio_limit"] <= 1 and 0 < res["cpu_bound_ratio_limit_hash_from_memory"] <= 1, res
    assert all(v > 0 for v in res["cpu_s_per_GiB"].values()) and len(res["cpu_s_per_GiB"]) == 5, res
    # a lone reader of a complete copy: nobody waits on its progress word, so no batch goes in order
    # (REFHUB_WAIT_FULL "auto" needs the server's serving event)
    assert res["in_order_batches"] == "0" or res["in_order_batches"].startswith("0 of"), res
    # the engine's choice between two local processes is the same-host transport, and the result says so
    try:
        import tent_shm  # noqa: F401
    except ImportError:
        return
    assert res["transport_used"] == "shm 100%" and res["failed_slices"] == 0, res
    # the same-host path copies a piece on the submitting thread: every verified run hashed inside the copy
    assert res["fused_copy_hash"] is True, res
