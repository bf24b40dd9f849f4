"""scripts/bench-all.sh (tent_bench.bench_all): generated blocks, step discovery, rendering, and a
quick run of a tiny subset in which one step fails and the others still land in the document."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tent_bench import bench_all as ba

ROOT = Path(__file__).resolve().parents[2]

DOC = """# Title

Intro, kept as is.

<!-- bench-all:begin machine -->
old machine
<!-- bench-all:end machine -->

Prose between blocks.

<!-- bench-all:begin tcp -->
| old | table |
<!-- bench-all:end tcp -->

Tail text.
"""


def test_replace_blocks_changes_only_the_named_bodies():
    new = ba.replace_blocks(DOC, {"tcp": "| new | table |"})
    assert "| new | table |" in new and "| old | table |" not in new
    assert "old machine" in new  # a block not named is left alone
    outside = [ln for ln in DOC.splitlines() if "old" not in ln]
    assert [ln for ln in new.splitlines() if "new" not in ln and "old" not in ln] == outside
    assert ba.replace_blocks(new, {"tcp": "| new | table |"}) == new  # idempotent
    assert ba.blocks_in(new) == ["machine", "tcp"]


def test_blocks_without_a_place_go_to_the_extra_block():
    new = ba.replace_blocks(DOC, {"tcp": "T", "refhub-burst": "B1", "resilience": "R1"})
    assert ba.blocks_in(new) == ["machine", "tcp", "extra"]
    assert new.index("### refhub-burst") < new.index("B1") < new.index("### resilience") < new.index("R1")
    again = ba.replace_blocks(new, {"refhub-burst": "B2"})  # the extra block is rewritten, not appended to
    assert "B2" in again and "B1" not in again and again.count("## Other benchmarks (generated)") == 1


def test_bad_documents_and_names_are_refused():
    with pytest.raises(ValueError):
        ba.replace_blocks(DOC + DOC, {"tcp": "x"})  # two blocks named tcp
    with pytest.raises(ValueError):
        ba.replace_blocks(DOC, {"no spaces": "x"})


def test_render_local_shows_medians_spread_and_ratios_from_the_rows():
    rows = [
        {"engine": "tent", "transport": "tcp", "op": "WRITE", "block_size": 4 << 20, "batch_size": 1, "gbps": 6.0,
         "gbps_min": 5.0, "gbps_max": 7.0, "rounds": 3, "x_socket": 1.2, "x_socket_min": 1.1, "x_socket_max": 1.3,
         "p50_us": 600.0, "p99_us": 900.0, "verified_bytes": 3 << 23},
        {"engine": "socket", "transport": "tcp", "op": "WRITE", "block_size": 4 << 20, "batch_size": 1, "gbps": 5.0,
         "gbps_min": 4.5, "gbps_max": 5.5, "rounds": 3, "parallel": 4},
    ]  # fmt: skip
    text = ba.render_local(json.dumps(rows))
    assert "| tcp | WRITE | 4 MiB | 6 (5-7) | 5 (4.5-5.5) | **1.2 (1.1-1.3)** |" in text
    assert "`socket` ran with 4 threads/streams" in text
    assert "**met**" in ba._ratio_target(json.dumps(rows), "socket", 0.8)
    assert "**not met** at WRITE 4 MiB 1.20x" in ba._ratio_target(json.dumps(rows), "socket", 1.5)
    assert "no mooncake rows" in ba._ratio_target(json.dumps(rows), "mooncake", 2.0)


def test_render_local_names_fios_sweep_and_our_cpu():
    ms = 1 << 20
    rows = [
        {"engine": "tent", "transport": "gds", "op": "WRITE", "block_size": ms, "batch_size": 1, "gbps": 9.0, "rounds": 5,
         "x_fio": 0.9, "cpu_s_per_gb": 0.125},
        {"engine": "fio", "transport": "psync", "op": "WRITE", "block_size": ms, "batch_size": 1, "gbps": 10.0, "rounds": 5,
         "cpu_s_per_gb": 0.1, "fio_process_cpu_s_per_gb": 0.3, "fio_reported_gbps": 10.5, "fio_job_start_skew_ms": 1.0,
         "fio_job_start_skew_ms_max": 4.0},
        {"kind": "fio_tuning", "chosen": {f"WRITE {ms}": {"ioengine": "psync", "numjobs": 1, "iodepth": 1}}, "rows": [
            {"op": "WRITE", "block_size": ms, "gbps": 10.5, "fio_setting": {"ioengine": "psync", "numjobs": 1, "iodepth": 1}},
            {"op": "WRITE", "block_size": ms, "gbps": 7.25, "fio_setting": {"ioengine": "io_uring", "numjobs": 1, "iodepth": 1}}]},
    ]  # fmt: skip
    text = ba.render_local(json.dumps(rows))
    assert "| gds | WRITE | 1 MiB | 9 | 10 | **0.9** |" in text
    assert "WRITE 1 MiB: psync j1 d1 10.5, io_uring j1 d1 7.25" in text
    assert "CPU seconds per GB" in text and "WRITE 1 MiB tent 0.125 / fio 0.1 (0.3 whole)" in text
    assert "its jobs' start skew (max over the rounds) and its own figure / the span's: WRITE 1 MiB 4 ms, 1.05" in text


def test_tail_target_is_computed_from_the_numbers():
    d = {"p99_over_p50": 4.99, "slowest_run_over_median": 0.68}
    verdict = ba.target_tail(json.dumps(d))
    assert "P99 <= 3x P50: **not met** (4.99x)" in verdict and "**met** (slowest 0.68x)" in verdict


def test_generic_rendering_of_markdown_json_and_text():
    assert ba.render_generic("noise\n| a | b |\n|---|---|\n| 1 | 2 |\nmore") == "| a | b |\n|---|---|\n| 1 | 2 |"
    t = ba.render_generic('{"x": 1.5, "name": "n", "nested": {"y": 1}}\n{"x": 2, "name": "m"}')
    assert t.splitlines()[0] == "| x | name |" and "| 2 | m |" in t
    assert ba.render_generic("plain\ntext").startswith("```")


def test_unknown_bench_scripts_are_discovered(tmp_path):
    (tmp_path / "scripts").mkdir()
    for name in ("bench-all.sh", "bench-local.sh", "bench-auth.sh", "bench-newthing.sh"):
        (tmp_path / "scripts" / name).write_text("#!/bin/sh\n[ \"$(id -u)\" = 0 ] || exit 2\n")
    found = ba.discover_scripts(tmp_path, ba.default_steps())
    assert [s.name for s in found] == ["newthing"] and found[0].needs_root
    step = ba.Step("x", ["scripts/bench-missing.sh"], needs=("scripts/bench-missing.sh",))
    assert "not found" in (ba.skip_reason(step, tmp_path, True, False, None) or "")


def test_quick_run_of_a_subset_one_step_failing(tmp_path):
    doc, out = tmp_path / "benchmarks.md", tmp_path / "out"
    doc.write_text((ROOT / "docs" / "benchmarks.md").read_text())
    before = doc.read_text()
    p = subprocess.run(
        [sys.executable, "-m", "tent_bench.bench_all", "--quick", "--only", "broken,hangs,shm-cma,needs-a-testbed",
         "--step", "broken=sh -c 'echo half a table >&2; exit 3'", "--step", "needs-a-testbed=/nonexistent/tool",
         "--step", "hangs=sh -c 'echo started; sleep 600'", "--step-timeout", "40",
         "--doc", str(doc), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert p.returncode == 1, p.stderr  # a failed step is reported in the exit code ...
    text = doc.read_text()
    # ... and did not stop the others: the shm table is there, with the engine and the baseline
    shm = text.split("<!-- bench-all:begin shm-cma -->")[1].split("<!-- bench-all:end shm-cma -->")[0]
    assert "| shm | READ | 4 MiB |" in shm and "| shm | WRITE | 4 MiB |" in shm
    assert "`cma` ran with 2 threads/streams" in shm and "Target >= 0.9x cma" in shm
    assert "failed** (exit code 3" in text and "half a table" in text
    assert "timeout** (timed out after 40 s" in text and "started" in text  # interrupted, its output kept
    assert "/nonexistent/tool not found" in text or "could not start" in text
    machine = text.split("<!-- bench-all:begin machine -->")[1].split("<!-- bench-all:end machine -->")[0]
    assert f"{os.cpu_count()} cores" in machine and "Load average" in machine and "Quick mode" in machine
    # prose outside the blocks is untouched
    strip = lambda s: "\n".join(ln for ln in s.split("<!-- bench-all:begin")[0].splitlines())  # noqa: E731
    assert strip(text) == strip(before)
    rows = json.loads((out / "shm-cma.out").read_text())
    ours = [r for r in rows if r.get("engine") == "tent"]
    assert ours and all(r["verified_bytes"] > 0 for r in ours)


def test_burst_rendering_shows_every_n_and_judges_the_target():
    import json

    from tent_bench.bench_all import render_burst

    def row(n: int, pipe: float) -> dict:
        return {"n": n, "pipeline_per_receiver_s": pipe, "no_pipeline_per_receiver_s": 1.1 * n, "ray_per_receiver_s": None}

    data = {"bench": "burst", "rounds": 3, "ideal_one_transfer_s": 1.0, "rows": [row(1, 1.0), row(4, 1.05), row(6, 1.2)]}
    out = render_burst(json.dumps(data))
    assert "| 4 | 1.05 | **1.050** | 4.4 |" in out and "| 6 | 1.2 | **1.200** | 6.6 |" in out, out
    assert "Ray" not in out  # a system that did not run gets no column
    assert "**not met** (N=4 1.05x, N=6 1.20x)" in out
    data["rows"][2] = row(6, 1.08)
    assert "**met** (N=4 1.05x, N=6 1.08x)" in render_burst(json.dumps(data))


def test_a_skipped_step_keeps_the_figures_of_an_earlier_series():
    step = ba.Step("rdma", ["scripts/rdma-vm.sh"], opt_in=True)
    reason = ba.skip_reason(step, ROOT, True, False, None)
    assert reason and reason.startswith("opt-in")
    res = ba.Result(step, "skipped", reason=reason)
    assert ba.block_for(res, ["machine", "rdma"], False) is None  # the rdma table is not replaced
    assert ba.KEPT_NOTE in res.reason  # and the machine block says whose figures those are
    other = ba.Result(ba.Step("new-step", ["x"]), "skipped", reason="needs root")
    assert ba.block_for(other, ["machine"], False) is None and other.reason == "needs root"
    ran = ba.Result(ba.Step("tcp", ["x"]), "failed", reason="exit code 3", stderr="boom")
    body = ba.block_for(ran, ["tcp"], False)
    assert body is not None and "failed** (exit code 3" in body and "boom" in body


def test_dataplane_target_is_computed_from_the_numbers():
    v = ba.target_dataplane(json.dumps({"ratio": 0.461, "cpu_bound_ratio_limit": 0.694}))
    assert v == ("Target >= 0.9x the raw engine (median of the per-round ratios): **not met** (0.46x; "
                 "the CPU-bound limit computed for this run: 0.69x)")  # fmt: skip
    assert "**met** (0.92x)" in ba.target_dataplane(json.dumps({"ratio": 0.92}))
    assert "no ratio" in ba.target_dataplane("not json")
    # the control (raw run again, scored like the replicate) goes beside the verdict
    v = ba.target_dataplane(json.dumps({"ratio": 0.93, "control_ratio_rounds": {"median": 0.974}}))
    assert v.endswith("**met** (0.93x; the control, raw again, scored 0.97x)"), v


def test_the_targets_block_collects_every_verdict_of_the_other_blocks():
    doc = DOC.replace("Intro, kept as is.", "<!-- bench-all:begin targets -->\nold\n<!-- bench-all:end targets -->")
    doc = ba.replace_blocks(doc, {"tcp": "| t |\n\nTarget >= 0.8x socket: **met** (1.1x)  \n- shm x: **not met** (0.5x)"})
    summary = ba.targets_summary(doc)
    assert summary.startswith("1 of 2 verdicts met.")
    assert "| `tcp` | Target >= 0.8x socket: **met** (1.1x) |" in summary and "| `tcp` | shm x: **not met** (0.5x) |" in summary
    assert "old machine" not in summary and ba.targets_summary(DOC).startswith("_No target verdicts")


def test_failover_rendering_shows_every_way_a_failed():
    def case(secs: float, ok: bool = True) -> dict:
        return {"B_seconds": secs, "B_seconds_rounds": {"median": secs, "min": secs - 0.1, "max": secs + 0.1},
                "B_sources": [["A", True], ["publisher", False]], "B_data_ok": ok}  # fmt: skip

    data = {"bench": "failover", "rounds": 3, "no_failure": case(1.16), "failures": {"stop": case(2.79, ok=False)},
            "extra_s": {"stop": 1.63}}  # fmt: skip
    out = ba.render_failover(json.dumps(data))
    assert "| no failure | 1.16 s (1.06-1.26) |  | A, then publisher | correct |" in out, out
    assert "| SIGSTOP (silent) | 2.79 s (2.69-2.89) | +1.63 s | A, then publisher | **WRONG** |" in out


def test_server_sweep_rendering_has_one_row_per_configuration():
    def row(clients: int, shards: int, batched: bool) -> dict:
        return {"clients": clients, "client_sockets": 8 if batched else clients, "shards_per_replica": shards,
                "batched_frames": batched, "ops_per_s": {"median": 100.0, "min": 90.0, "max": 110.0},
                "mean_latency_ms": {"median": 5.0, "min": 4.0, "max": 6.0}, "server_cpu_util": 0.5,
                "server_failed_replicas": 0, "error_replies": 0}  # fmt: skip

    out = ba.render_server(json.dumps({"bench": "server-sweep", "rounds": 3, "cpus": 2,
                                       "rows": [row(8192, 8, False), row(4096, 1, True)]}))  # fmt: skip
    assert "| 8192 | 8192 | 8 | one request | 100 (90-110) | 5 (4-6) | 0.5 | 0 | 0 |" in out, out
    assert "| 4096 | 8 | 1 | batched |" in out and "3 rounds per configuration" in out


def test_a_partial_series_keeps_the_full_series_header_and_marks_what_it_re_ran(tmp_path):
    full = ba.render_machine(
        {"date": "2026-01-01 00:00 UTC", "commit": "aaaa", "cpu": "CPU-A", "cores": 2, "memory": "24 GiB", "kernel": "k",
         "python": "3.11", "load_start": (1.0, 1.0, 1.0), "load_end": (2.0, 2.0, 2.0)},
        [ba.Result(ba.Step("tcp", ["x"]), "ok", 60), ba.Result(ba.Step("shm-cma", ["x"]), "ok", 13)], False, 600)
    facts = {"date": "2026-02-02 10:00 UTC", "commit": "bbbb", "cpu": "CPU-B", "cores": 2, "memory": "24 GiB",
             "kernel": "k", "python": "3.11", "load_start": (0.5, 0.5, 0.5), "load_end": (0.7, 0.7, 0.7)}
    ran = [ba.Result(ba.Step("tcp", ["x"]), "ok", 99), ba.Result(ba.Step("brand-new", ["x"]), "failed", 5, reason="exit code 2"),
           ba.Result(ba.Step("rdma", ["x"]), "skipped", reason="opt-in")]  # fmt: skip
    out = ba.render_partial_machine(full, facts, ran)
    assert "**Generated** 2026-01-01 00:00 UTC" in out and "commit aaaa" in out and "CPU-A" in out  # the series stays
    assert f"{ba.PARTIAL} 2026-02-02 10:00 UTC (commit bbbb): tcp, brand-new on CPU-B" in out
    assert "| tcp | ok | 99 | re-run alone 2026-02-02 10:00 UTC (commit bbbb) |" in out
    assert "| shm-cma | ok | 13 |  |" in out  # a step not re-run keeps its row
    assert "| brand-new | failed | 5 | re-run alone 2026-02-02 10:00 UTC (commit bbbb); exit code 2 |" in out
    assert "rdma" not in out  # a skipped step changes nothing
    assert out.count("| tcp |") == 1
    assert ba.render_partial_machine(full, facts, ran[2:]) == full
    # end to end: an --only run of a generic step leaves the series header in place
    doc = tmp_path / "benchmarks.md"
    doc.write_text(ba.replace_blocks(DOC, {"machine": full}))
    p = subprocess.run([sys.executable, "-m", "tent_bench.bench_all", "--only", "echo", "--step", "echo=echo hello",
                        "--doc", str(doc), "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    machine = ba.block_body(doc.read_text(), "machine")
    assert machine is not None and "**Generated** 2026-01-01 00:00 UTC" in machine and "| echo | ok |" in machine
    assert ba.PARTIAL in machine and "| tcp | ok | 60 |" in machine


def _staging_json(limit: float | None) -> str:
    e: dict = {"staged": {"median_GBps": 3.5, "min": 3.2, "max": 3.7}, "wire": {"median_GBps": 7.2, "min": 6.1, "max": 8.1},
               "copy": {"median_GBps": 14.8, "min": 14.5, "max": 15.1}, "slower_stage": "wire",
               "ratio_staged_vs_slower_stage": {"median": 0.457, "min": 0.43, "max": 0.6}}
    if limit is not None:
        e["ratio_cpu_bound_limit"] = {"median": limit, "min": limit - 0.01, "max": limit + 0.01}
    return json.dumps({"ops": {"WRITE": e}})


def test_staging_target_names_the_cpu_bound_limit_only_where_the_cpu_limits():
    bound = ba.target_staging(_staging_json(0.62))
    assert "**not met** (WRITE 0.46x; the CPU-bound limit computed for this run: WRITE 0.62x)" in bound
    assert "CPU-bound limit of staged" in ba.render_staging(_staging_json(0.62))
    assert "0.62 (0.61-0.63)" in ba.render_staging(_staging_json(0.62))
    assert "CPU-bound" not in ba.target_staging(_staging_json(1.0))  # a shaped wire: the CPU is not the limit
    old = _staging_json(None)  # a report of a build before the limit existed renders as before
    assert "CPU-bound" not in ba.target_staging(old) + ba.render_staging(old)


def test_staging_table_splits_the_shortfall_from_the_limit_where_reported():
    data = json.loads(_staging_json(0.62))
    e = data["ops"]["WRITE"]
    e["limit_shortfall"] = {"cpu": {"median": 0.93, "min": 0.9, "max": 0.95},
                            "cores_busy": {"median": 0.81, "min": 0.78, "max": 0.84}}
    e["cores_busy"] = {"staged": 1.62, "wire": 1.76, "copy": 1.9}
    table = ba.render_staging(json.dumps({**data, "cores": 2}))
    assert "stages' CPU / staged CPU" in table and "| 0.93 (0.9-0.95) | 0.81 (0.88) |" in table
    assert "cores busy" not in ba.render_staging(_staging_json(0.62))  # older reports: no such columns


def _path_rows(limit: float | None, cpu: bool = True) -> str:
    def row(stage: str, transport: str, gbps: float, cpu_s: float, **extra: float) -> dict:
        r = {"engine": "tent", "stage": stage, "transport": transport, "op": "WRITE", "block_size": 64 << 20,
             "batch_size": 1, "gbps": gbps, "gbps_min": gbps - 0.1, "gbps_max": gbps + 0.1, "rounds": 3, **extra}
        if cpu:
            r.update(cpu_s_per_GiB=cpu_s, cpu_s_per_GiB_min=cpu_s - 0.01, cpu_s_per_GiB_max=cpu_s + 0.01)
        return r

    staged = {"x_slower_stage": 0.609, "x_slower_stage_min": 0.6, "x_slower_stage_max": 0.65}
    if limit is not None:
        staged.update(cpu_bound_limit=limit, cpu_bound_limit_min=limit - 0.01, cpu_bound_limit_max=limit + 0.01)
    return json.dumps([row("file->memory", "gds", 12.8, 0.09), row("memory->remote", "tcp", 6.33, 0.33),
                       row("file->remote (staged)", "file:tcp", 4.07, 0.55, **staged)])


def test_path_target_names_the_cpu_bound_limit_only_where_the_cpu_limits():
    bound = ba.target_path(_path_rows(0.71))
    assert bound == ("Target staged >= 0.8x its slower stage: **not met** (0.61x; "
                     "the CPU-bound limit computed for this run: 0.71x).")  # fmt: skip
    table = ba.render_path(_path_rows(0.71))
    assert "CPU s/GiB (both processes)" in table and "CPU-bound limit of x slower stage" in table
    assert "| 0.55 (0.54-0.56) | 0.71 (0.7-0.72) | 3 |" in table
    assert "CPU-bound" not in ba.target_path(_path_rows(1.0))  # a shaped wire: the CPU is not the limit
    old = _path_rows(None, cpu=False)  # a report of a build before the accounting renders as before
    assert "CPU" not in ba.target_path(old) + ba.render_path(old)
    assert ba.target_path(old) == "Target staged >= 0.8x its slower stage: **not met** (0.61x)."


def test_path_target_names_the_path_the_engine_took():
    rows = json.loads(_path_rows(1.0))
    rows[2].update(stage="file->remote (mapped)", path="mapped", route="local file --mmap (read-only)--> mapping --tcp--> remote host")
    text = json.dumps(rows)
    assert ba.target_path(text) == "Target file->remote (mapped path) >= 0.8x its slower stage: **not met** (0.61x)."
    assert "| file->remote (mapped) | file:tcp |" in ba.render_path(text)


def test_burst_rendering_shows_each_systems_spread_over_the_rounds():
    def row(n: int, pipe: float) -> dict:
        return {"n": n, "pipeline_per_receiver_s": pipe, "pipeline_per_receiver_range_s": [pipe - 0.01, pipe + 0.02],
                "ray_per_receiver_s": 1.5 * n, "ray_per_receiver_range_s": [1.4 * n, 1.6 * n]}

    data = {"bench": "burst", "rounds": 3, "ideal_one_transfer_s": 1.0, "rows": [row(1, 1.0), row(4, 1.05)]}
    out = ba.render_burst(json.dumps(data))
    assert "| 4 | 1.05 (1.04-1.07) | **1.050** | 6 (5.6-6.4) |" in out, out
    assert "min-max in parentheses" in out
    data["rounds"] = 1  # one round has no spread to show
    assert "| 4 | 1.05 | **1.050** | 6 |" in ba.render_burst(json.dumps(data))


def test_dataplane_rendering_gives_the_per_round_ratio_with_its_spread():
    data = {"bench": "dataplane", "ratio": 0.997, "ratio_rounds": {"median": 0.997, "min": 0.95, "max": 1.04, "rounds": 5},
            "refhub_GBps": {"median": 15.1, "min": 14.2, "max": 15.9}, "raw_GBps": {"median": 15.2, "min": 14.0, "max": 16.1}}
    out = ba.render_dataplane(json.dumps(data))
    assert "| refhub replicate (verified) | 15.1 (14.2-15.9) | **0.997 (0.95-1.04)** |" in out, out
    assert "| raw engine READs | 15.2 (14-16.1) | 1 |" in out and "of 5 interleaved rounds" in out
    assert "| dataplane | 0.997 |" in out  # the run's facts stay in the first table
    for name in ("refhub-dataplane-shm", "refhub-dataplane-tcp"):
        assert next(s for s in ba.default_steps() if s.name == name).render is ba.render_dataplane
    # with the raw form the baseline is and the control series, each in its own row
    data |= {"raw_form": "one-batch", "control_ratio_rounds": {"median": 0.98, "min": 0.9, "max": 1.1, "rounds": 5},
             "control_GBps": {"median": 14.9, "min": 14.1, "max": 16.0}}
    out = ba.render_dataplane(json.dumps(data))
    assert "| control: raw one-batch READs again | 14.9 (14.1-16) | 0.98 (0.9-1.1) |" in out, out
    assert "| raw engine READs (one-batch, the better form) | 15.2 (14-16.1) | 1 |" in out, out
    data |= {"ratio_vs_better_raw_per_round": 0.91, "control_ratio_vs_better_raw_per_round": 0.94}
    out = ba.render_dataplane(json.dumps(data))
    assert "in every round (the stricter statistic used before 2026-12-02): replicate 0.91x, control 0.94x." in out
    assert "ratio_vs_better" not in out.split("Per round")[0], out  # not crowding the facts' columns


def test_every_block_names_its_series_and_a_skipped_step_is_listed(tmp_path):
    """A generated block says which series wrote it; a step left out with --skip is listed in the
    machine block as skipped, its block keeping an earlier series' figures (and that series' stamp)."""
    doc, out = tmp_path / "benchmarks.md", tmp_path / "out"
    doc.write_text(DOC.replace("<!-- bench-all:begin tcp -->\n| old | table |",
                               "<!-- bench-all:begin gone -->\nold figures\n\n_1 s; generated by `scripts/bench-all.sh` in "
                               "the series of 2020-01-01 00:00 UTC (commit abc)._\n<!-- bench-all:end gone -->\n\n"
                               "<!-- bench-all:begin fine -->\n<!-- bench-all:end fine -->\n\n"
                               "<!-- bench-all:begin tcp -->\n| old | table |"))  # fmt: skip
    p = subprocess.run([sys.executable, "-m", "tent_bench.bench_all", "--quick", "--only", "fine,gone", "--skip", "gone",
                        "--step", "fine=sh -c 'echo \"| a | b |\"; echo \"|---|---|\"; echo \"| 1 | 2 |\"'",
                        "--step", "gone=sh -c 'exit 9'", "--doc", str(doc), "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stderr
    text = doc.read_text()
    fine = text.split("<!-- bench-all:begin fine -->")[1].split("<!-- bench-all:end fine -->")[0]
    assert "| 1 | 2 |" in fine and re.search(r"generated by `scripts/bench-all.sh` in the series of \d{4}-\d\d-\d\d "
                                             r"\d\d:\d\d UTC \(commit [0-9a-f]*\)\._", fine), fine  # fmt: skip
    assert "old figures" in text and "the series of 2020-01-01 00:00 UTC (commit abc)" in text  # kept, with its stamp
    machine = text.split("<!-- bench-all:begin machine -->")[1].split("<!-- bench-all:end machine -->")[0]
    assert f"| gone | skipped | 0 | skipped by --skip; {ba.KEPT_NOTE} |" in machine, machine


def test_resilience_rendering_shows_medians_and_spread_of_both_tables():
    """`scripts/bench-resilience.sh --json`: the fault table and the QoS table, median (min-max)."""
    res = {"meta": {"rounds": 3}, "rows": [
        {"scenario": "all-down-1s", "title": "all 4 rails down for 1 s", "rounds": 3, "deadline_s": 10.0, "app_errors": 0.0,
         "app_errors_min": 0.0, "app_errors_max": 0.0, "bytes_verified_total": 3 * 2048 << 20, "all_verified": True,
         "slice_errors": 21.0, "slice_errors_min": 5.0, "slice_errors_max": 116.0, "steady_gbit": 3.48,
         "steady_gbit_min": 3.4, "steady_gbit_max": 3.5, "max_gap_ms": 1460.0, "max_gap_ms_min": 1100.0,
         "max_gap_ms_max": 1476.0, "fault_gbit": 0.1, "fault_gbit_min": 0.0, "fault_gbit_max": 0.13}]}  # fmt: skip
    qos = [{"kind": "mixed_round", "label": "spray qos=off"},
           {"kind": "mixed", "label": "spray qos=off", "rounds": 3, "mice_count": 9, "mice_count_min": 5, "mice_count_max": 12,
            "mice_p50_us": 438e3, "mice_p50_us_min": 400e3, "mice_p50_us_max": 500e3},
           {"kind": "mixed", "label": "spray qos=on", "rounds": 3, "mice_count": 398, "mice_count_min": 398,
            "mice_count_max": 398, "mice_p99_us_vs_off": 0.41, "mice_p99_us_vs_off_min": 0.2,
            "mice_p99_us_vs_off_max": 0.6}]  # fmt: skip
    out = ba.render_resilience(json.dumps({"resilience": res, "qos": qos}))
    assert "| all 4 rails down for 1 s | 0 | 6,144 MiB in 3 rounds, all | 21 (5-116) | 3.48 (3.4-3.5) |" in out
    assert "1,460 (1,100-1,476) ms" in out
    assert "| spray qos=off | 9 (5-12) | 438 (400-500) |" in out and "| spray qos=on | 398 |" in out
    assert "0.41 (0.2-0.6)" in out
    fault_tab, qos_tab = out.index("| scenario |"), out.index("| QoS |")
    assert fault_tab < out.index("QoS (the table") < qos_tab  # two tables, text between them
    assert ba.render_resilience("not json at all") == ba.render_generic("not json at all")


def test_compat_rendering_shows_spread_ratios_and_the_chosen_mooncake_knobs():
    rows = [{"op": "READ", "block": 65536, "batch": 32, "rounds": 5, "facade_gbps": 3.19, "facade_spread": [3.0, 3.3],
             "native_gbps": 3.29, "native_spread": [3.1, 3.4], "mooncake_gbps": 2.1, "mooncake_spread": [1.9, 2.2],
             "facade_x_native": 0.971, "facade_x_native_spread": [0.95, 0.99], "facade_x_mooncake": 1.52,
             "facade_x_mooncake_spread": [1.4, 1.7]},
            {"kind": "mooncake_tuning", "chosen": {"MC_TCP_LANES_PER_PEER": "4"}, "settings": [
                {"mooncake_env": {}, "score_gbps": 1.1},
                {"mooncake_env": {"MC_TCP_LANES_PER_PEER": "4"}, "score_gbps": 1.9},
                {"mooncake_env": {"MC_TCP_LANES_PER_PEER": "8"}, "error": "worker did not answer"}]}]  # fmt: skip
    out = ba.render_compat(json.dumps(rows))
    assert "| READ | 64 KiB | 32 | 3.19 (3-3.3) | 3.29 (3.1-3.4) | **0.971 (0.95-0.99)** | 2.1 (1.9-2.2) | **1.52 (1.4-1.7)** |" in out
    assert "best setting of its knob sweep" in out and "`MC_TCP_LANES_PER_PEER=4`" in out
    assert "defaults: 1.1; MC_TCP_LANES_PER_PEER=4: 1.9; MC_TCP_LANES_PER_PEER=8: failed (worker did not answer)" in out
    assert "Median (min-max) of 5 rounds" in out
    assert ba.render_compat(json.dumps(rows[:1])).count("knob") == 0  # no sweep (--no-tune): nothing claimed
