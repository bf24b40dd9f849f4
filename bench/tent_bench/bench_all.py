"""`scripts/bench-all.sh`: regenerate the tables of docs/benchmarks.md in one series of runs.

Every table of docs/benchmarks.md sits between generated markers,

    <!-- bench-all:begin NAME -->
    ...
    <!-- bench-all:end NAME -->

and is produced by one step: a re-runnable command (shown above its table) whose output is
rendered into markdown here. Steps run one after the other; a step that fails, times out or
cannot run on this machine (no root for network namespaces, a script another part of the
project has not added yet) is reported in its block and the others still run. Scripts named
`scripts/bench-*.sh` that no step knows are discovered and run too (their output rendered
generically). The machine facts (CPU, cores, memory, load at start and end, date, commit) go
into the `machine` block. Raw outputs are kept in the output directory.

`--quick` runs every step in a short form (smoke test; minutes) and writes to a copy of the
document unless `--doc` says otherwise, so smoke numbers never land in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- bench-all:begin {} -->"
END = "<!-- bench-all:end {} -->"
_BLOCK = re.compile(r"<!-- bench-all:begin (?P<name>[A-Za-z0-9_.-]+) -->\n(?P<body>.*?)<!-- bench-all:end (?P=name) -->",
                    re.S)  # fmt: skip
EXTRA = "extra"  # the block at the end that holds the tables of steps the document has no block for
TARGETS = "targets"  # the summary of every verdict in the document's other blocks

Row = dict[str, Any]


# ------------------------------------------------------------------ the document


def blocks_in(doc: str) -> list[str]:
    """Names of the generated blocks of `doc`, in order."""
    return [m.group("name") for m in _BLOCK.finditer(doc)]


def targets_summary(doc: str) -> str:
    """One table of every target verdict (a line saying **met** or **not met**) found in the
    document's generated blocks, in document order: what a reader checks first, always in step
    with the tables since it is read from them (whichever series wrote each)."""
    rows: list[list[str]] = []
    for m in _BLOCK.finditer(doc):
        name = m.group("name")
        if name in ("machine", TARGETS, EXTRA):
            continue
        for ln in m.group("body").splitlines():
            if "**met" in ln or "**not met" in ln:
                rows.append([f"`{name}`", ln.strip().removeprefix("- ").strip()])
    if not rows:
        return "_No target verdicts in the generated blocks yet._"
    met = sum("**not met" not in r[1] for r in rows)
    return f"{met} of {len(rows)} verdicts met.\n\n" + table(["block", "verdict"], rows)


def replace_blocks(doc: str, blocks: dict[str, str]) -> str:
    """`doc` with the body of every generated block named in `blocks` replaced; bodies for which the
    document has no block go, in order, into the `extra` block (appended under its own heading
    when the document has none). Text outside the blocks is left exactly as it was."""
    for name in blocks:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"bad block name {name!r}")
    present = set(blocks_in(doc))
    if len(present) != len(blocks_in(doc)):
        raise ValueError("the document has two generated blocks with the same name")
    missing = [n for n in blocks if n not in present and n != EXTRA]
    if missing:
        extra = "\n".join(f"### {n}\n\n{blocks[n].strip()}\n" for n in missing)
        if EXTRA in blocks:
            extra = blocks[EXTRA].strip() + "\n\n" + extra
        blocks = {**blocks, EXTRA: extra}
    if EXTRA in blocks and EXTRA not in present:
        doc = doc.rstrip("\n") + "\n\n## Other benchmarks (generated)\n\n" + BEGIN.format(EXTRA) + "\n" + END.format(EXTRA) + "\n"

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in blocks:
            return m.group(0)
        body = blocks[name].strip("\n")
        return f"{BEGIN.format(name)}\n{body}\n{END.format(name)}"

    return _BLOCK.sub(sub, doc)


# ------------------------------------------------------------------ formatting helpers


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}".replace(",", " ") if abs(x) >= 10000 else str(x)
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) >= 100:
            return f"{x:.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def with_spread(r: Row, key: str, scale: float = 1.0, digits: int = 3) -> str:
    """`median (min-max)` of a summarized metric; just the value when there is no spread."""
    v = r.get(key)
    if v is None:
        return "-"
    lo, hi = r.get(f"{key}_min"), r.get(f"{key}_max")
    if lo is None or hi is None or r.get("rounds", 1) <= 1:
        return fmt(v * scale, digits)
    return f"{fmt(v * scale, digits)} ({fmt(lo * scale, digits)}-{fmt(hi * scale, digits)})"


def human(n: int) -> str:
    for unit, m in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {unit}"
    return f"{n} B"


def table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(out)


def parse_json_output(text: str) -> Any:
    """JSON on stdout: one document, or one object per line; None when it is not JSON."""
    s = text.strip()
    if not s:
        return None
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        pass
    start = min((i for i in (s.find("["), s.find("{")) if i >= 0), default=-1)
    if start > 0:
        try:
            return json.loads(s[start:])
        except json.JSONDecodeError:
            pass
    lines = []
    for ln in s.splitlines():
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                lines.append(json.loads(ln))
            except json.JSONDecodeError:
                return None
    return lines or None


# ------------------------------------------------------------------ renderers


def render_generic(text: str) -> str:
    """Markdown tables in the output verbatim; else JSON as a table of its scalar fields; else the tail."""
    md = [ln for ln in text.splitlines() if ln.lstrip().startswith("|")]
    if len(md) >= 2:
        return "\n".join(md)
    data = parse_json_output(text)
    if isinstance(data, dict):
        data = [data]
    if isinstance(data, list) and data and all(isinstance(r, dict) for r in data):
        scalar: list[str] = []
        for r in data:
            for k, v in r.items():
                if k not in scalar and (v is None or isinstance(v, (int, float, str, bool))):
                    scalar.append(k)
        # at most 16 columns; ratios always among them
        key_first = [k for k in scalar if "ratio" in k.lower() or k.startswith("x_") or "_x_" in k]
        others = [k for k in scalar if k not in key_first][: max(0, 16 - len(key_first))]
        keys = [k for k in scalar if k in key_first or k in others]
        return table(keys, [[fmt(r.get(k)) for k in keys] for r in data])
    tail = "\n".join(text.strip().splitlines()[-30:])
    return f"```\n{tail}\n```" if tail else "(no output)"


def render_burst(text: str) -> str:
    """`refhub bench burst --json`: the run's facts, then seconds per receiver for every N, side by side."""
    data = parse_json_output(text)
    if not isinstance(data, dict) or not data.get("rows"):
        return render_generic(text)
    head = render_generic(json.dumps({k: v for k, v in data.items() if not isinstance(v, (list, dict))}))
    systems = [("pipeline", "refhub pipeline"), ("no_pipeline", "refhub no pipeline"),
               ("gloo_chain", "gloo send/recv chain"), ("gloo_async", "gloo async broadcast"), ("ray", "Ray")]
    present = [(k, t) for k, t in systems if any(r.get(f"{k}_per_receiver_s") is not None for r in data["rows"])]
    n1 = next((r.get("pipeline_per_receiver_s") for r in data["rows"] if r.get("n") == 1), None)
    def cell(r: Row, k: str) -> str:
        v, rng = r.get(f"{k}_per_receiver_s"), r.get(f"{k}_per_receiver_range_s")
        if v is None or not rng or (data.get("rounds") or 1) <= 1:
            return fmt(v)
        return f"{fmt(v)} ({fmt(rng[0])}-{fmt(rng[1])})"

    rows = []
    for r in data["rows"]:
        pipe = r.get("pipeline_per_receiver_s")
        x = f"**{pipe / n1:.3f}**" if pipe and n1 else ""
        rows.append([str(r["n"])] + [cell(r, k) for k, _ in present[:1]] + [x] + [cell(r, k) for k, _ in present[1:]])
    per_n = table(["N", present[0][1], "x N=1"] + [t for _, t in present[1:]], rows)
    ideal = data.get("ideal_one_transfer_s")
    out = [head, "", f"Per receiver, seconds (median of {data.get('rounds')} interleaved rounds, min-max in parentheses; "
           f"the ideal single transfer is {ideal} s):", "", per_n]
    far = {r["n"]: r["pipeline_per_receiver_s"] / n1 for r in data["rows"] if r.get("n", 0) >= 4 and n1}
    if far:
        met = all(v <= 1.1 for v in far.values())
        said = ", ".join(f"N={n} {v:.2f}x" for n, v in sorted(far.items()))
        out += ["", f"Target N=4 and N=6 within 1.1x of N=1: **{'met' if met else 'not met'}** ({said})."]
    return "\n".join(out)


def render_server(text: str) -> str:
    """`refhub bench server-sweep --json`: one row per configuration (clients, sockets, shards, frame form)."""
    data = parse_json_output(text)
    if not isinstance(data, dict) or not data.get("rows"):
        return render_generic(text)

    def med(v: Any) -> str:
        if isinstance(v, dict) and "median" in v:
            return f"{fmt(v['median'])} ({fmt(v['min'])}-{fmt(v['max'])})"
        return fmt(v) if v is not None else ""

    rows = [[str(r.get("clients")), str(r.get("client_sockets")), str(r.get("shards_per_replica")),
             "batched" if r.get("batched_frames") else "one request", med(r.get("ops_per_s")),
             med(r.get("mean_latency_ms")), fmt(r.get("server_cpu_util")), str(r.get("server_failed_replicas", "")),
             str(r.get("error_replies", ""))] for r in data["rows"]]  # fmt: skip
    head = (f"{data.get('rounds')} rounds per configuration, {data.get('cpus')} CPUs (server and load generators "
            "on the same cores); median (min-max) over the rounds:")  # fmt: skip
    return "\n".join([head, "", table(["clients", "sockets", "shards", "frames", "ops/s", "mean latency ms",
                                        "server CPU", "replicas failed (missed heartbeats)", "error replies"], rows)])


def _median_range(v: Any, rng: Any) -> str:
    """`median (min-max)` from a median and a [min, max] pair; just the median without the pair."""
    if v is None:
        return "-"
    if isinstance(rng, (list, tuple)) and len(rng) == 2:
        return f"{fmt(v)} ({fmt(rng[0])}-{fmt(rng[1])})"
    return fmt(v)


def render_dataplane(text: str) -> str:
    """`refhub bench dataplane --json`: the run's facts (generic), then refhub against the raw engine per
    round, median (min-max): the verified replicate's GB/s, raw's and the per-round ratio."""
    data = parse_json_output(text)
    if isinstance(data, list):
        data = data[-1] if data else None
    if not isinstance(data, dict) or not isinstance(data.get("ratio_rounds"), dict):
        return render_generic(text)
    strict = {k: data.get(k) for k in ("ratio_vs_better_raw_per_round", "control_ratio_vs_better_raw_per_round")}
    head = render_generic(json.dumps({k: v for k, v in data.items() if k not in strict}))

    def rng(d: Any) -> str:
        if not isinstance(d, dict) or "median" not in d:
            return "-"
        return _median_range(d["median"], [d.get("min"), d.get("max")] if "min" in d else None)

    rr = data["ratio_rounds"]
    form = data.get("raw_form")
    rows = [["refhub replicate (verified)", rng(data.get("refhub_GBps")), f"**{rng(rr)}**"]]
    if isinstance(data.get("control_ratio_rounds"), dict):
        rows.append(["control: raw one-batch READs again", rng(data.get("control_GBps")), rng(data["control_ratio_rounds"])])
    rows.append([f"raw engine READs ({form}, the better form)" if form else "raw engine READs", rng(data.get("raw_GBps")), "1"])
    parts = [head, f"Per round, median (min-max) of {rr.get('rounds')} interleaved rounds:",
             table(["series", "GB/s", "x raw (per round)"], rows)]
    if all(isinstance(v, (int, float)) for v in strict.values()):
        parts.append("Against the better of the two raw forms in every round (the stricter statistic used before "
                     f"2026-12-02): replicate {fmt(strict['ratio_vs_better_raw_per_round'])}x, control "
                     f"{fmt(strict['control_ratio_vs_better_raw_per_round'])}x.")
    return "\n\n".join(parts)


FAILOVER_CASES = {"none": "no failure", "kill": "SIGKILL", "stop": "SIGSTOP (silent)", "cut": "link cut (silent)"}


def render_failover(text: str) -> str:
    """`refhub bench failover --json`: the run's facts, then B's time per way A failed, with the extra
    time over the no-failure case, where B's bytes came from and whether they verified."""
    data = parse_json_output(text)
    if not isinstance(data, dict) or not isinstance(data.get("no_failure"), dict):
        return render_generic(text)
    head = render_generic(json.dumps({k: v for k, v in data.items() if not isinstance(v, (list, dict))}))
    cases = {"none": data["no_failure"], **(data.get("failures") or {})}
    rows = []
    for case, r in cases.items():
        rr = r.get("B_seconds_rounds") or {}
        secs = f"{fmt(r.get('B_seconds'))} s" + (f" ({fmt(rr['min'])}-{fmt(rr['max'])})" if "min" in rr else "")
        extra = (data.get("extra_s") or {}).get(case)
        sources = ", then ".join(str(s[0] if isinstance(s, (list, tuple)) else s) for s in r.get("B_sources") or [])
        rows.append([FAILOVER_CASES.get(case, case), secs, f"+{extra:.2f} s" if isinstance(extra, (int, float)) else "",
                     sources, "correct" if r.get("B_data_ok") else "**WRONG**"])  # fmt: skip
    return "\n".join([head, "", table(["A", "B's time (median, min-max)", "extra", "B's sources", "checksums"], rows)])


def _engine_rows(data: Any) -> tuple[list[Row], list[str]]:
    rows = [r for r in data if isinstance(r, dict) and r.get("engine") == "tent"] if isinstance(data, list) else []
    baselines = []
    for r in data if isinstance(data, list) else []:
        e = r.get("engine") if isinstance(r, dict) else None
        if e and e != "tent" and e not in baselines:
            baselines.append(e)
    return rows, baselines


def render_local(text: str) -> str:
    """`tent bench --json` rows: ours and every baseline side by side, medians (min-max) of the rounds."""
    data = parse_json_output(text)
    ours, baselines = _engine_rows(data)
    if not ours:
        return render_generic(text)
    base = {(r["engine"], r["op"], r["block_size"], r["batch_size"]): r for r in data
            if isinstance(r, dict) and r.get("engine") in baselines}  # fmt: skip
    header = ["transport", "op", "block", "tent GB/s"] + [f"{b} GB/s" for b in baselines] + [f"x {b}" for b in baselines]
    header += ["tent P50 / P99 us", "verified bytes", "rounds"]
    out = []
    for r in ours:
        key = (r["op"], r["block_size"], r["batch_size"])
        cells = [r["transport"], r["op"], human(r["block_size"]) + (f" x{r['batch_size']}" if r["batch_size"] > 1 else ""),
                 with_spread(r, "gbps")]  # fmt: skip
        cells += [with_spread(base[(b, *key)], "gbps") if (b, *key) in base else "-" for b in baselines]
        cells += [f"**{with_spread(r, f'x_{b}')}**" if f"x_{b}" in r else "-" for b in baselines]
        cells += [f"{fmt(r.get('p50_us'))} / {fmt(r.get('p99_us'))}", fmt(r.get("verified_bytes")), fmt(r.get("rounds"))]
        out.append(cells)
    notes = []
    for b in baselines:
        par = sorted({r.get("parallel") for r in data if isinstance(r, dict) and r.get("engine") == b} - {None})
        if par:
            notes.append(f"`{b}` ran with {', '.join(map(str, par))} threads/streams per transfer")
    tuning = next((r for r in data if isinstance(r, dict) and r.get("kind") == "mooncake_tuning"), None)
    if tuning:
        chosen = tuning.get("chosen") or {}
        notes.append("Mooncake's best knob setting in the sweep: " + (", ".join(f"`{k}={v}`" for k, v in chosen.items()) or "its defaults"))
        settings: dict[str, list[float]] = {}
        for t in tuning.get("rows", []):
            settings.setdefault(json.dumps(t.get("mooncake_env", {}), sort_keys=True), []).append(t["gbps"])
        notes.append("Sweep (GB/s at each point, in sweep order): " + "; ".join(
            f"{' '.join(f'{k}={v}' for k, v in json.loads(s).items()) or 'defaults'}: {' '.join(fmt(g) for g in v)}"
            for s, v in settings.items()))  # fmt: skip
    cpu = [r for r in ours if r.get("cpu_s_per_gb") is not None]
    if cpu:
        def _cpu(b: str, r: Row) -> str:
            row = base.get((b, r["op"], r["block_size"], r["batch_size"]), {})
            other, whole = row.get("cpu_s_per_gb"), row.get("fio_process_cpu_s_per_gb")
            return (f" / {b} {fmt(other)}" if other is not None else "") + (f" ({fmt(whole)} whole)" if whole is not None else "")

        notes.append("CPU seconds per GB moved, median of the rounds (tent: its process, every thread; fio: its job threads, "
                     "and in brackets its whole process, start-up and io_uring's kernel workers included): "
                     + ", ".join(f"{r['op']} {human(r['block_size'])} tent {fmt(r['cpu_s_per_gb'])}"
                                 + "".join(_cpu(b, r) for b in baselines) for r in cpu))  # fmt: skip
    fio = next((r for r in data if isinstance(r, dict) and r.get("kind") == "fio_tuning"), None)
    if fio:
        sweep: dict[tuple[str, int], list[str]] = {}
        for t in fio.get("rows", []):
            s = t.get("fio_setting", {})
            sweep.setdefault((t["op"], t["block_size"]), []).append(
                f"{s.get('ioengine')} j{s.get('numjobs')} d{s.get('iodepth')} {fmt(t['gbps'])}")
        notes.append("fio's settings (I/O engine, jobs, depth) swept before the rounds, GB/s, the fastest per point kept: "
                     + "; ".join(f"{op} {human(bs)}: {', '.join(v)}" for (op, bs), v in sweep.items()))  # fmt: skip
    skew = [r for r in data if isinstance(r, dict) and r.get("engine") == "fio" and r.get("fio_job_start_skew_ms_max") is not None]
    if skew:
        notes.append("fio's rate is its bytes over the span of all its jobs' I/Os (fio's own figure divides by its longest "
                     "job's runtime); per point, its jobs' start skew (max over the rounds) and its own figure / the span's: "
                     + ", ".join(f"{r['op']} {human(r['block_size'])} {fmt(r['fio_job_start_skew_ms_max'])} ms, "
                                 f"{fmt(r['fio_reported_gbps'] / r['gbps']) if r.get('fio_reported_gbps') and r.get('gbps') else '-'}"
                                 for r in skew))  # fmt: skip
    sub = next((r for r in data if isinstance(r, dict) and r.get("kind") == "submit_cost"), None)
    if sub:
        notes.append(f"submit() of one 64 KiB request: median {fmt(sub.get('median_us'))} us, P99 {fmt(sub.get('p99_us'))} us; "
                     f"back to back (queued) {fmt(sub.get('queued_median_us'))} us")  # fmt: skip
    return table(header, out) + ("\n\n" + "\n".join(f"- {n}" for n in notes) if notes else "")


def render_path(text: str) -> str:
    data = parse_json_output(text)
    rows = [r for r in data or [] if isinstance(r, dict) and r.get("stage")]
    if not rows:
        return render_generic(text)
    cpu = any("cpu_s_per_GiB" in r for r in rows)  # reports of builds before the CPU accounting have none
    limit = any("cpu_bound_limit" in r for r in rows)
    header = (["stage", "transport", "block", "GB/s", "x slower stage"] + (["CPU s/GiB (both processes)"] if cpu else [])
              + (["CPU-bound limit of x slower stage"] if limit else []) + ["rounds"])  # fmt: skip
    out = []
    for r in rows:
        cells = [r["stage"], r["transport"], human(r["block_size"]), with_spread(r, "gbps"),
                 with_spread(r, "x_slower_stage") if "x_slower_stage" in r else ""]  # fmt: skip
        if cpu:
            cells.append(with_spread(r, "cpu_s_per_GiB") if r.get("cpu_s_per_GiB") is not None else "")
        if limit:
            cells.append(with_spread(r, "cpu_bound_limit") if "cpu_bound_limit" in r else "")
        out.append([*cells, fmt(r.get("rounds"))])
    wire = rows[0].get("wire_gbit")
    return (_wire_note(wire) + "\n\n" + table(header, out)) if wire else table(header, out)


def _wire_note(gbit: float) -> str:
    return (f"Wire: one veth pair between two network namespaces, shaped by tc (TBF, both directions) to "
            f"{fmt(gbit)} Gbit/s at layer 2 ({fmt(gbit * 0.956 / 8)} GB/s TCP goodput ceiling at MTU 1500).")


def render_fabric(text: str) -> str:
    data = parse_json_output(text)
    rows = [r for r in data or [] if isinstance(r, dict) and r.get("engine") == "tent" and "policy" in r]
    if not rows:
        return render_generic(text)
    fab = next((r for r in data if r.get("kind") == "fabric"), {})
    open_loop = any(r.get("offered_gbit") for r in rows)
    out = []
    if open_loop:
        header = ["policy", "block", "offered Gbit/s", "realized Gbit/s", "delivered Gbit/s", "P50 ms", "P99 ms",
                  "P99 / round robin's", "seeds"]  # fmt: skip
        for r in rows:
            out.append([r["policy"], human(r["block_size"]), fmt(r.get("offered_gbit")), with_spread(r, "realized_gbit"),
                        with_spread(r, "gbit"), with_spread(r, "p50_us", 1e-3), with_spread(r, "p99_us", 1e-3),
                        f"**{with_spread(r, 'p99_vs_round_robin')}**" if "p99_vs_round_robin" in r else "",
                        fmt(r.get("rounds"))])  # fmt: skip
    else:
        header = ["policy", "block", "Gbit/s", "x nominal sum", "x actual sum", "x round robin", "P50 ms", "P99 ms",
                  "rail shares", "rounds"]  # fmt: skip
        for r in rows:
            out.append([r["policy"], human(r["block_size"]), with_spread(r, "gbit"), fmt(r.get("x_nominal")),
                        fmt(r.get("x_actual")), with_spread(r, "x_round_robin") if "x_round_robin" in r else "",
                        with_spread(r, "p50_us", 1e-3), with_spread(r, "p99_us", 1e-3),
                        " ".join(f"{x:.3f}" for x in r.get("rail_share", [])), fmt(r.get("rounds"))])  # fmt: skip
    head = ""
    if fab:
        head = (f"Rails: {' '.join(fmt(x) for x in fab.get('rail_gbit_actual', []))} Gbit/s measured "
                f"(nominal sum {fmt(fab.get('nominal_sum_gbit'))}, actual sum {fmt(fab.get('actual_sum_gbit'))}).\n\n")  # fmt: skip
    return head + table(header, out)


def render_fault(text: str) -> str:
    data = parse_json_output(text)
    rows = [r for r in data or [] if isinstance(r, dict) and r.get("kind") == "fault_summary"]
    if not rows:
        return render_generic(text)
    keys = ["app_errors", "corrupt", "bytes_verified", "all_verified", "steady_gbit", "dip_ms", "detect_ms",
            "readmit_ms", "readmit_state_ms"]  # fmt: skip
    return table(["fault", *keys], [[r.get("fault", "")] + [fmt(r.get(k)) for k in keys] for r in rows])


def render_mixed(text: str) -> str:
    """`tent bench --fabric --mixed --json`: per QoS variant the median (min-max) over the rounds,
    with each variant's per-round ratio to qos=off (tent_bench.fabric_bench.qos_markdown)."""
    from .fabric_bench import qos_markdown

    data = parse_json_output(text)
    rows = [r for r in data or [] if isinstance(r, dict)] if isinstance(data, list) else []
    return qos_markdown(rows).strip() or render_generic(text)


def render_resilience(text: str) -> str:
    """`scripts/bench-resilience.sh --json`: the fault scenarios, then the QoS variants, every figure
    the median (min-max) of the rounds (tent_bench.resilience.markdown, fabric_bench.qos_markdown)."""
    from .fabric_bench import qos_markdown
    from .resilience import markdown

    data = parse_json_output(text)
    if not isinstance(data, dict) or not isinstance(data.get("resilience"), dict):
        return render_generic(text)
    res = data["resilience"]
    out = [markdown(res.get("rows") or []).strip()]
    qos = qos_markdown(data.get("qos") or []).strip()
    if qos:
        out += ["QoS (the table of the QoS section above, from the same run):", qos]
    return "\n\n".join(out)


def render_compat(text: str) -> str:
    """`scripts/bench-compat.sh --json`: facade, native and Mooncake GB/s as median (min-max) of the
    rounds, the per-round ratios, and the Mooncake knob setting its sweep chose."""
    data = parse_json_output(text)
    if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
        return render_generic(text)
    rows = [r for r in data if "facade_gbps" in r]
    tuning = next((r for r in data if r.get("kind") == "mooncake_tuning"), None)
    if not rows:
        return render_generic(text)

    def med(r: Row, key: str) -> str:
        v, sp = r.get(key), r.get(key.removesuffix("_gbps") + "_spread" if key.endswith("_gbps") else f"{key}_spread")
        if v is None:
            return "-"
        return f"{fmt(v)} ({fmt(sp[0])}-{fmt(sp[1])})" if isinstance(sp, list) and len(sp) == 2 else fmt(v)

    moon = any("mooncake_gbps" in r for r in rows)
    header = ["op", "block", "batch", "facade GB/s", "native GB/s", "facade / native"]
    header += ["Mooncake GB/s", "facade / Mooncake"] if moon else []
    out = []
    for r in rows:
        cells = [r["op"], human(r["block"]), str(r["batch"]), med(r, "facade_gbps"), med(r, "native_gbps"),
                 f"**{med(r, 'facade_x_native')}**"]  # fmt: skip
        if moon:
            cells += [med(r, "mooncake_gbps"), f"**{med(r, 'facade_x_mooncake')}**"]
        out.append(cells)
    head = f"Median (min-max) of {rows[0].get('rounds')} rounds; ratios computed within each round."
    notes = []
    if tuning:
        chosen = tuning.get("chosen") or {}
        notes.append("Mooncake ran with the best setting of its knob sweep (before the rounds, the same points, "
                     "geometric mean GB/s): " + (", ".join(f"`{k}={v}`" for k, v in chosen.items()) or "its defaults"))  # fmt: skip
        notes.append("Sweep (geometric mean GB/s per setting): " + "; ".join(
            f"{' '.join(f'{k}={v}' for k, v in (t.get('mooncake_env') or {}).items()) or 'defaults'}: "
            + (fmt(t['score_gbps']) if t.get("score_gbps") is not None else f"failed ({t.get('error', '?')})")
            for t in tuning.get("settings", [])))  # fmt: skip
    return "\n\n".join([head, table(header, out)] + (["\n".join(f"- {n}" for n in notes)] if notes else []))


def render_tail(text: str) -> str:
    data = parse_json_output(text)
    if not isinstance(data, dict) or "runs" not in data:
        return render_generic(text)
    runs = data["runs"]
    summary = table(
        ["op", "block", "requests", "P50 ms", "P99 ms", "P99 / P50", "max ms", "GB/s median run", "slowest run / median",
         "verified bytes", "slice errors"],
        [[data["op"], human(data["block_size"]), fmt(data["requests"]), fmt(data["p50_us"] / 1e3), fmt(data["p99_us"] / 1e3),
          f"**{fmt(data['p99_over_p50'])}**", fmt(data["max_us"] / 1e3), fmt(data["median_run_gbps"]),
          f"**{fmt(data['slowest_run_over_median'])}**", fmt(data.get("verified_bytes")), fmt(data.get("slice_errors"))]],
    )  # fmt: skip
    per_run = "Runs (GB/s, each of " + fmt(data["run_requests"]) + " requests): " + " ".join(fmt(r["gbps"]) for r in runs)
    slow = "Slowest requests (ms at s from the start; failed and retried slices in it): " + ", ".join(
        f"{fmt(x['us'] / 1e3)} at {fmt(x['at_s'])}" + (f" ({x['failed_slices']} failed)" if x.get("failed_slices") else "")
        for x in data.get("slowest", [])[:5])  # fmt: skip
    kernel = data.get("tcp_counters")
    tcp = ("Kernel TCP counters that moved during the runs (whole network namespace): "
           + (", ".join(f"{k} +{v}" for k, v in kernel.items()) if kernel else "none")) if kernel is not None else ""  # fmt: skip
    return "\n\n".join(x for x in (summary, per_run, slow, tcp) if x)


def render_small(text: str) -> str:
    """scripts/bench-small.sh prints its own markdown tables (tent_bench.small.markdown) and the
    submit() figures as JSON lines: kept as they are."""
    return "\n".join(line for line in text.splitlines() if not line.startswith("results in ")).strip()


def render_staging(text: str) -> str:
    """`tent bench-staging --json`: each stage's GB/s and the staged path against its slower stage."""
    data = parse_json_output(text)
    ops = data.get("ops") if isinstance(data, dict) else None
    if not isinstance(ops, dict) or not ops:
        return render_generic(text)
    stages: list[str] = []
    for e in ops.values():
        stages += [k for k, v in e.items() if isinstance(v, dict) and "median_GBps" in v and k not in stages]
    both = any("ratio_both_vs_slower_stage" in e for e in ops.values())
    limit = any("ratio_cpu_bound_limit" in e for e in ops.values())
    header = (["op", *(f"{k} GB/s" for k in stages), "slower stage", "staged / slower stage"]
              + (["both / slower stage"] if both else []) + (["CPU-bound limit of staged / slower stage"] if limit else []))
    # where staged falls short of that limit: its stages' CPU over its own, and the cores it kept busy
    short = any("limit_shortfall" in e for e in ops.values())
    cores = int(data.get("cores") or 0)
    if short:
        header += ["stages' CPU / staged CPU", "share of the cores busy: staged (wire alone)"]

    def med(d: dict[str, Any], key: str = "median") -> str:
        return f"{fmt(d[key])} ({fmt(d['min'])}-{fmt(d['max'])})"

    rows = []
    for op, e in ops.items():
        cells = [op] + [med(e[k], "median_GBps") if k in e else "-" for k in stages] + [str(e.get("slower_stage", "-"))]
        cells.append(f"**{med(e['ratio_staged_vs_slower_stage'])}**" if "ratio_staged_vs_slower_stage" in e else "-")
        if both:
            cells.append(med(e["ratio_both_vs_slower_stage"]) if "ratio_both_vs_slower_stage" in e else "-")
        if limit:
            cells.append(med(e["ratio_cpu_bound_limit"]) if "ratio_cpu_bound_limit" in e else "-")
        if short:
            sf, busy = e.get("limit_shortfall"), e.get("cores_busy", {})
            cells.append(med(sf["cpu"]) if sf else "-")
            cells.append(f"{fmt(sf['cores_busy']['median'])} ({fmt(busy['wire'] / cores)})"
                         if sf and "wire" in busy and cores else "-")
        rows.append(cells)
    wire = data.get("wire") if isinstance(data.get("wire"), dict) else None
    return (_wire_note(wire["rate_gbit"]) + "\n\n" if wire else "") + table(header, rows)


def target_path(text: str) -> str:
    data = parse_json_output(text)
    rows = [r for r in data or [] if isinstance(r, dict) and "x_slower_stage" in r]
    if not rows:
        return ""
    vals = [r["x_slower_stage"] for r in rows]
    limits = [r["cpu_bound_limit"] for r in rows if "cpu_bound_limit" in r]
    why = ("; the CPU-bound limit computed for this run: " + ", ".join(f"{v:.2f}x" for v in limits)
           if limits and any(v < 1.0 for v in limits) else "")
    paths = sorted({str(r.get("path", "initiator-staged")) for r in rows})
    what = "staged" if paths == ["initiator-staged"] else f"file->remote ({', '.join(paths)} path)"
    return f"Target {what} >= 0.8x its slower stage: **{'met' if all(v >= 0.8 for v in vals) else 'not met'}** (" + ", ".join(
        f"{v:.2f}x" for v in vals) + why + ")."  # fmt: skip


def target_staging(text: str) -> str:
    data = parse_json_output(text)
    ops = data.get("ops") if isinstance(data, dict) else None
    if not isinstance(ops, dict):
        return ""
    vals = {op: e["ratio_staged_vs_slower_stage"]["median"] for op, e in ops.items() if "ratio_staged_vs_slower_stage" in e}
    if not vals:
        return ""
    ok = all(v >= 0.8 for v in vals.values())
    limits = {op: e["ratio_cpu_bound_limit"]["median"] for op, e in ops.items() if "ratio_cpu_bound_limit" in e}
    why = ("; the CPU-bound limit computed for this run: " + ", ".join(f"{op} {v:.2f}x" for op, v in limits.items())
           if limits and any(v < 1.0 for v in limits.values()) else "")
    return f"Target staged >= 0.8x its slower stage: **{'met' if ok else 'not met'}** (" + ", ".join(
        f"{op} {v:.2f}x" for op, v in vals.items()) + why + ")."  # fmt: skip


# ------------------------------------------------------------------ targets (computed from the numbers)


def _ratio_target(text: str, baseline: str, floor: float, blocks: set[int] | None = None) -> str:
    data = parse_json_output(text)
    ours, _ = _engine_rows(data)
    vals = [(r, r.get(f"x_{baseline}")) for r in ours if blocks is None or r["block_size"] in blocks]
    vals = [(r, v) for r, v in vals if v is not None]
    if not vals:
        return f"Target >= {floor}x {baseline}: no {baseline} rows (baseline unavailable?)"
    bad = [f"{r['op']} {human(r['block_size'])} {v:.2f}x" for r, v in vals if v < floor]
    lo, hi = min(v for _, v in vals), max(v for _, v in vals)
    return (f"Target >= {floor}x {baseline} (median of the per-round ratios): "
            + ("**met**" if not bad else "**not met** at " + ", ".join(bad)) + f" ({lo:.2f}-{hi:.2f}x)")  # fmt: skip


def target_dataplane(text: str) -> str:
    """refhub's verified replicate against the raw engine READs of the same bytes (issue 14: >= 0.9x)."""
    d = parse_json_output(text)
    if isinstance(d, list):
        d = d[-1] if d else {}
    ratio = d.get("ratio") if isinstance(d, dict) else None
    if ratio is None:
        return "Target >= 0.9x the raw engine: no ratio in the output"
    limit = d.get("cpu_bound_ratio_limit")
    why = f"; the CPU-bound limit computed for this run: {limit:.2f}x" if isinstance(limit, (int, float)) else ""
    control = d.get("control_ratio_rounds")
    if isinstance(control, dict) and isinstance(control.get("median"), (int, float)):
        why += f"; the control, raw again, scored {control['median']:.2f}x"
    return f"Target >= 0.9x the raw engine (median of the per-round ratios): **{'met' if ratio >= 0.9 else 'not met'}** ({ratio:.2f}x{why})"


def target_tail(text: str) -> str:
    d = parse_json_output(text)
    if not isinstance(d, dict) or "p99_over_p50" not in d:
        return ""
    ok1, ok2 = d["p99_over_p50"] <= 3.0, d["slowest_run_over_median"] >= 0.5
    return (f"Targets: P99 <= 3x P50: **{'met' if ok1 else 'not met'}** ({d['p99_over_p50']:.2f}x); no run below half "
            f"the median run: **{'met' if ok2 else 'not met'}** (slowest {d['slowest_run_over_median']:.2f}x).")  # fmt: skip


def target_offered(text: str) -> str:
    data = parse_json_output(text)
    rows = [r for r in data or [] if isinstance(r, dict) and r.get("p99_vs_round_robin") is not None and r.get("offered_gbit")]
    if not rows:
        return ""
    parts = [f"{fmt(r['offered_gbit'])} Gbit/s: {r['p99_vs_round_robin']:.2f}x"
             + ("" if r["p99_vs_round_robin"] <= 0.5 else " (not met)") for r in rows]
    ok = all(r["p99_vs_round_robin"] <= 0.5 for r in rows)
    return f"Target P99 <= 0.5x round robin's: **{'met' if ok else 'not met'}** ({'; '.join(parts)})."


# ------------------------------------------------------------------ steps


@dataclass
class Step:
    name: str  # the document block
    argv: list[str]  # relative to the repository root
    quick_argv: list[str] | None = None  # None: the same command in quick mode (with QUICK=1 in the env)
    render: Callable[[str], str] = render_generic
    target: Callable[[str], str] | None = None
    needs_root: bool = False
    timeout_s: float = 600.0
    covers: tuple[str, ...] = ()  # scripts/bench-*.sh whose work this step does (not run again)
    needs: tuple[str, ...] = ()  # files (relative to the root) without which the step is skipped
    skip_if: tuple[str, ...] = ()  # files whose presence means another step does this work
    opt_in: bool = False  # runs only when named in --only (long or needs a testbed)
    probe: Callable[[Path], str | None] | None = None  # a reason to skip, found at run time
    env: dict[str, str] = field(default_factory=dict)
    quick_env: dict[str, str] = field(default_factory=dict)

    def command(self, quick: bool) -> list[str]:
        return self.quick_argv if quick and self.quick_argv is not None else self.argv


TENT = ".venv/bin/tent"
PY = ".venv/bin/python"
REFHUB = ".venv/bin/refhub"
LOCAL_SCRIPTS = ("scripts/bench-local.sh",)
FABRIC_SCRIPTS = ("scripts/bench-fabric.sh",)
REFHUB_SCRIPTS = ("scripts/bench-refhub.sh",)
_Q = ["--quick", "--rounds", "1", "--iters", "5"]


def default_steps() -> list[Step]:
    b = [TENT, "bench", "--json"]
    fab = [TENT, "bench", "--fabric", "4x1gbit", "--json"]
    deg = [*fab, "--degrade", "3:0.5", "--policy", "spray,round_robin"]
    return [
        Step("tcp", [*b, "--transport", "tcp", "--block-sizes", "4M,64M", "--iters", "400", "--rounds", "5",
                     "--baseline", "socket,mooncake"],
             [*b, "--transport", "tcp", "--block-sizes", "4M", *_Q, "--baseline", "socket"],
             render_local, lambda t: _ratio_target(t, "socket", 0.8) + "  \n" + _ratio_target(t, "mooncake", 2.0),
             covers=LOCAL_SCRIPTS, timeout_s=900),  # fmt: skip
        Step("tcp-tail", [PY, "-m", "tent_bench.tail", "--requests", "1000", "--run", "100", "--block", "64M", "--op", "WRITE"],
             [PY, "-m", "tent_bench.tail", "--requests", "20", "--run", "5", "--block", "4M", "--op", "WRITE"],
             render_tail, target_tail, timeout_s=900),  # fmt: skip
        Step("shm-cma", [*b, "--transport", "shm", "--block-sizes", "4M,64M", "--iters", "400", "--rounds", "5", "--baseline",
                         "cma", "--config", '{"transports": {"shm": {"mode": "cma"}}}'],
             [*b, "--transport", "shm", "--block-sizes", "4M", *_Q, "--baseline", "cma", "--config",
              '{"transports": {"shm": {"mode": "cma"}}}'],
             render_local, lambda t: _ratio_target(t, "cma", 0.9), covers=LOCAL_SCRIPTS),  # fmt: skip
        Step("shm-memfd", [*b, "--transport", "shm", "--block-sizes", "4M,64M", "--iters", "400", "--rounds", "5",
                           "--baseline", "memcpy", "--config", '{"transports": {"shm": {"mode": "memfd"}}}'],
             [*b, "--transport", "shm", "--block-sizes", "4M", *_Q, "--baseline", "memcpy", "--config",
              '{"transports": {"shm": {"mode": "memfd"}}}'],
             render_local, lambda t: _ratio_target(t, "memcpy", 0.7, {64 << 20}), covers=LOCAL_SCRIPTS),  # fmt: skip
        Step("submit-cost", [*b, "--transport", "tcp", "--block-sizes", "64K", "--iters", "200", "--ops", "WRITE",
                             "--rounds", "1", "--submit-cost"],
             [*b, "--transport", "tcp", "--block-sizes", "64K", *_Q, "--ops", "WRITE", "--submit-cost"],
             render_local, covers=LOCAL_SCRIPTS),  # fmt: skip
        Step("gds-fio", [*b, "--transport", "gds", "--block-sizes", "1M,64M", "--iters", "40", "--min-bytes", "4G",
                         "--rounds", "5", "--baseline", "fio"],
             [*b, "--transport", "gds", "--block-sizes", "1M", *_Q, "--baseline", "fio"],
             render_local, lambda t: _ratio_target(t, "fio", 0.9), covers=LOCAL_SCRIPTS),  # fmt: skip
        Step("path-direct", [*b, "--path", "file:tcp", "--block-sizes", "64M", "--iters", "20", "--rounds", "3",
                             "--config", '{"transports": {"gds": {"direct": 1}}}'],
             [*b, "--path", "file:tcp", "--block-sizes", "4M", *_Q, "--config", '{"transports": {"gds": {"direct": 1}}}'],
             render_path, target_path, covers=LOCAL_SCRIPTS),  # fmt: skip
        Step("path-buffered", [*b, "--path", "file:tcp", "--block-sizes", "64M", "--iters", "20", "--rounds", "3"],
             [*b, "--path", "file:tcp", "--block-sizes", "4M", *_Q], render_path, target_path,
             covers=LOCAL_SCRIPTS),  # fmt: skip
        # the staged pipeline the mapped path replaced for this case (still the path of READs into a
        # file and of files that cannot be mapped): shown beside it, judged by no target of its own
        Step("path-buffered-staged", [*b, "--path", "file:tcp", "--block-sizes", "64M", "--iters", "20", "--rounds", "3",
                                      "--config", '{"mapped_paths": false}'],
             [*b, "--path", "file:tcp", "--block-sizes", "4M", *_Q, "--config", '{"mapped_paths": false}'], render_path,
             covers=LOCAL_SCRIPTS),  # fmt: skip
        Step("fabric-equal", [*fab, "--policy", "spray,round_robin", "--block-sizes", "1M,64M", "--rounds", "3"],
             [*fab, "--policy", "spray,round_robin", "--block-sizes", "1M", "--quick", "--rounds", "1"],
             render_fabric, needs_root=True, covers=FABRIC_SCRIPTS),  # fmt: skip
        Step("fabric-degraded", [*deg, "--block-sizes", "1M,64M", "--rounds", "3", "--timeline", "docs/timeline-degraded.png"],
             [*deg, "--block-sizes", "1M", "--quick", "--rounds", "1"],
             render_fabric, needs_root=True, covers=FABRIC_SCRIPTS),  # fmt: skip
        Step("fabric-offered", [*deg, "--block-sizes", "64M", "--offered-load", "0.8,1.2,1.6", "--seeds", "3"],
             [*deg, "--block-sizes", "1M", "--offered-load", "0.5", "--seeds", "1"],
             render_fabric, target_offered, needs_root=True, covers=FABRIC_SCRIPTS, timeout_s=900),  # fmt: skip
        Step("fabric-mixed", [*fab, "--mixed", "--policy", "spray"], [*fab, "--mixed", "--policy", "spray", "--quick"],
             render_mixed, needs_root=True, skip_if=("scripts/bench-resilience.sh",)),  # fmt: skip
        Step("fault-down-up", [*fab, "--fault", "down 0 at 1s; up 0 at 3s", "--duration", "5", "--timeline",
                               "docs/timeline-down-up.png"],
             [*fab, "--fault", "down 0 at 1s; up 0 at 2s", "--duration", "3"],
             render_fault, needs_root=True, covers=FABRIC_SCRIPTS, opt_in=True),  # fmt: skip
        Step("fault-degrade", [*fab, "--fault", "degrade 2:0.5 at 1s; restore 2 at 3s", "--duration", "5", "--timeline",
                               "docs/timeline-degrade.png"],
             [*fab, "--fault", "degrade 2:0.5 at 1s; restore 2 at 2s", "--duration", "3"],
             render_fault, needs_root=True, covers=FABRIC_SCRIPTS, opt_in=True),  # fmt: skip
        Step("fault-flap", [*fab, "--fault", "flap 1 every 300ms from 1s until 11s", "--duration", "12", "--timeline",
                            "docs/timeline-flap.png"],
             [*fab, "--fault", "flap 1 every 300ms from 1s until 3s", "--duration", "4"],
             render_fault, needs_root=True, covers=FABRIC_SCRIPTS, opt_in=True),  # fmt: skip
        Step("resilience", ["scripts/bench-resilience.sh", "--json"], ["scripts/bench-resilience.sh", "--quick", "--json"],
             render_resilience, needs=("scripts/bench-resilience.sh",), needs_root=True,
             covers=("scripts/bench-resilience.sh",), timeout_s=900),  # fmt: skip
        Step("small-peer", [*b, "--transport", "tcp", "--block-sizes", "64K,256K", "--iters", "2000", "--rounds", "5",
                            "--baseline", "mooncake"],
             [*b, "--transport", "tcp", "--block-sizes", "64K", *_Q, "--baseline", "mooncake"],
             render_local, lambda t: _ratio_target(t, "mooncake", 1.0), covers=LOCAL_SCRIPTS, timeout_s=900),  # fmt: skip
        Step("small", ["scripts/bench-small.sh"], needs=("scripts/bench-small.sh",), covers=("scripts/bench-small.sh",),
             render=render_small, quick_env={"ROUNDS": "1", "BUDGET": "8M", "TCP_SECONDS": "0.02", "TCP_ROUNDS": "1"}),  # fmt: skip
        Step("auth", ["scripts/bench-auth.sh"], needs=("scripts/bench-auth.sh",), covers=("scripts/bench-auth.sh",),
             env={"ROUNDS": "5"}, quick_env={"ROUNDS": "1", "BUDGET": "0.2"}),  # fmt: skip
        Step("compat", ["scripts/bench-compat.sh", "--json"], render=render_compat, needs=("scripts/bench-compat.sh",),
             covers=("scripts/bench-compat.sh",),
             env={"ROUNDS": "5"}, quick_env={"ROUNDS": "1", "DURATION": "0.2", "TUNE_DURATION": "0.1"}),  # fmt: skip
        Step("staging-copy", [TENT, "bench-staging", "--size", "512M", "--rounds", "5", "--copy-ns-per-mib", "1500000",
                              "--both", "--json"],
             [TENT, "bench-staging", "--size", "32M", "--rounds", "1", "--copy-ns-per-mib", "1500000", "--json"],
             render_staging, target_staging, probe=has_subcommand(TENT, "bench-staging")),  # fmt: skip
        Step("staging-wire", [TENT, "bench-staging", "--size", "512M", "--rounds", "5", "--json"],
             [TENT, "bench-staging", "--size", "32M", "--rounds", "1", "--json"],
             render_staging, target_staging, probe=has_subcommand(TENT, "bench-staging")),  # fmt: skip
        # the same two staged paths over a real wire: two network namespaces, one tc-shaped veth pair
        Step("staging-veth", [TENT, "bench-staging", "--size", "512M", "--rounds", "5", "--wire", "4gbit", "--json"],
             [TENT, "bench-staging", "--size", "32M", "--rounds", "1", "--wire", "4gbit", "--json"],
             render_staging, target_staging, needs_root=True, probe=has_subcommand(TENT, "bench-staging")),  # fmt: skip
        Step("path-veth", [*b, "--path", "file:tcp", "--wire", "4gbit", "--block-sizes", "64M", "--iters", "20",
                           "--rounds", "3"],
             [*b, "--path", "file:tcp", "--wire", "4gbit", "--block-sizes", "4M", *_Q],
             render_path, target_path, needs_root=True),  # fmt: skip
        # refhub's benchmarks, as scripts/bench-refhub.sh runs them, one block per table
        Step("refhub-dataplane-shm", [REFHUB, "bench", "dataplane", "--json"],
             [REFHUB, "bench", "dataplane", "--json", "--quick"], render=render_dataplane, target=target_dataplane,
             covers=REFHUB_SCRIPTS),  # fmt: skip
        Step("refhub-dataplane-tcp", [REFHUB, "bench", "dataplane", "--json", "--transport", "tcp", "--repeat", "9"],
             [REFHUB, "bench", "dataplane", "--json", "--transport", "tcp", "--quick"], render=render_dataplane,
             target=target_dataplane, covers=REFHUB_SCRIPTS),  # fmt: skip
        Step("refhub-server", [REFHUB, "bench", "server-sweep", "--json"],
             [REFHUB, "bench", "server-sweep", "--json", "--quick"], render=render_server, covers=REFHUB_SCRIPTS,
             timeout_s=900),  # fmt: skip
        Step("refhub-burst", [REFHUB, "bench", "burst", "--json"], [REFHUB, "bench", "burst", "--json", "--quick"],
             render=render_burst, needs_root=True, covers=REFHUB_SCRIPTS, timeout_s=1800),  # fmt: skip
        Step("refhub-failover", [REFHUB, "bench", "failover", "--json"], [REFHUB, "bench", "failover", "--json", "--quick"],
             render=render_failover, needs_root=True, covers=REFHUB_SCRIPTS),  # fmt: skip
        # Soft-RoCE guests (scripts/rdma-vm.sh; tent_rdma.bench prints its own tables with --markdown)
        Step("rdma", ["scripts/rdma-vm.sh", "--memory", "8G", "--timeout", "2400", "--out", "/tmp/tent-rdma-bench", "--",
                      PY, "-m", "tent_rdma.bench", "single", "--sizes", "64K,1M", "--bytes", "32M", "--rounds", "3",
                      "--mooncake", "--markdown"],
             needs=("scripts/rdma-vm.sh",), needs_root=True, opt_in=True, timeout_s=2700),  # fmt: skip
        Step("rdma-two-vm", ["scripts/rdma-vm.sh", "--vms", "2", "--nics", "2", "--rates", "3mbit,3mbit", "--timeout", "2400",
                             "--out", "/tmp/tent-rdma-bench2", "--", PY, "-m", "tent_rdma.testbed", "--limit", "2300", "--",
                             PY, "-m", "tent_rdma.bench", "two-vm", "--rates", "3mbit,3mbit", "--bytes", "8M",
                             "--rounds", "3", "--markdown"],
             needs=("scripts/rdma-vm.sh",), needs_root=True, opt_in=True, timeout_s=2700),  # fmt: skip
    ]


def discover_scripts(root: Path, steps: list[Step]) -> list[Step]:
    """scripts/bench-*.sh that no step runs or covers: each becomes a step with generic rendering."""
    known = {c for s in steps for c in s.covers} | {s.argv[0] for s in steps} | {"scripts/bench-all.sh"}
    out = []
    for p in sorted((root / "scripts").glob("bench-*.sh")):
        rel = str(p.relative_to(root))
        if rel not in known:
            name = p.stem.removeprefix("bench-")
            out.append(Step(name, [rel], needs=(rel,), covers=(rel,), needs_root=_script_needs_root(p), timeout_s=1200))
    return out


def _script_needs_root(path: Path) -> bool:
    try:
        head = path.read_text(errors="replace")[:2000]
    except OSError:
        return False
    return "id -u" in head or "needs root" in head or "(root" in head


# ------------------------------------------------------------------ running


@dataclass
class Result:
    step: Step
    status: str  # ok | failed | timeout | skipped
    seconds: float = 0.0
    reason: str = ""
    stdout: str = ""
    stderr: str = ""


KEPT_NOTE = "its table keeps the figures of an earlier series"


def block_for(res: Result, existing: list[str], quick: bool, series: str = "") -> str | None:
    """The new body of a step's block, or None to leave the document's block as it is.

    A skipped step (opt-in, no root, a tool missing) never erases the figures an earlier series
    wrote: its block stays, and its row in the machine block says so (the reason is amended here)."""
    if res.status != "skipped":
        return render_result(res, quick, series)
    if res.step.name in existing:
        res.reason = f"{res.reason}; {KEPT_NOTE}"
    return None


def skip_reason(step: Step, root: Path, is_root: bool, quick: bool, only: set[str] | None) -> str | None:
    if step.opt_in and not (only and step.name in only):
        return f"opt-in: run with --only {step.name}"
    for f in step.needs:
        if not (root / f).exists():
            return f"{f} not found in this tree"
    for f in step.skip_if:
        if (root / f).exists():
            return f"done by {f}"
    exe = step.command(quick)[0]
    if "/" in exe and not (root / exe).exists():
        return f"{exe} not found (make install?)"
    if step.needs_root and not is_root:
        return "needs root (network namespaces): run with sudo"
    return step.probe(root) if step.probe else None


def has_subcommand(*argv: str) -> Callable[[Path], str | None]:
    """Probe: the command answers `--help` (e.g. a CLI subcommand another part of the project adds)."""

    def probe(root: Path) -> str | None:
        try:
            p = subprocess.run([*argv, "--help"], cwd=root, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{' '.join(argv)}` cannot run: {exc}"
        return None if p.returncode == 0 else f"`{' '.join(argv)}` is not available in this tree"

    return probe


def run_step(step: Step, root: Path, quick: bool, out_dir: Path) -> Result:
    argv = step.command(quick)
    env = {**os.environ, **step.env, **(step.quick_env if quick else {})}
    if quick:
        env["QUICK"] = "1"
    env["PATH"] = f"{root / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    t0 = time.monotonic()
    try:
        # its own process group: on a timeout the whole step (target processes, fabric workers) is
        # interrupted (SIGINT first, so its cleanup runs: namespaces, temporary files), then killed
        p = subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    except OSError as exc:
        res = Result(step, "failed", time.monotonic() - t0, f"could not start: {exc}")
    else:
        try:
            so, se = p.communicate(timeout=step.timeout_s)
        except subprocess.TimeoutExpired:
            so, se = _stop_group(p)
            res = Result(step, "timeout", time.monotonic() - t0, f"timed out after {step.timeout_s:.0f} s", so, se)
        else:
            status = "ok" if p.returncode == 0 else "failed"
            res = Result(step, status, time.monotonic() - t0, "" if status == "ok" else f"exit code {p.returncode}", so, se)
    (out_dir / f"{step.name}.out").write_text(res.stdout)
    (out_dir / f"{step.name}.err").write_text(res.stderr)
    return res


def display_command(argv: list[str], env: dict[str, str] | None = None) -> str:
    """The command as a reader types it (`tent bench ...`, `python -m ...`: the installed venv's),
    with the environment the step sets."""
    shown = [a.removeprefix(".venv/bin/") if i == 0 else a for i, a in enumerate(argv)]
    prefix = [f"{k}={shlex.quote(v)}" for k, v in (env or {}).items()]
    return " ".join(prefix + [shlex.quote(a) for a in shown])


def _stop_group(p: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGINT to the step's process group, 20 s to clean up, then SIGKILL; what it printed."""
    import signal

    for sig, grace in ((signal.SIGINT, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            return p.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    return "", ""


def series_stamp(facts: dict[str, Any]) -> str:
    """Which series wrote a block: a block an opt-in or skipped step left from an earlier series
    keeps its own stamp, so no table reads as part of a series it was not measured in."""
    return f"in the series of {facts['date']} (commit {facts['commit']})"


def render_result(res: Result, quick: bool, series: str = "") -> str:
    cmd = display_command(res.step.command(quick), {**res.step.env, **(res.step.quick_env if quick else {})})
    lines = [f"`{cmd}`", ""]
    if res.status == "skipped":
        lines.append(f"_Not run by `scripts/bench-all.sh`: {res.reason}._")
        return "\n".join(lines)
    if res.status != "ok":
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-12:])
        lines.append(f"_**{res.status}** ({res.reason}, after {res.seconds:.0f} s); last output:_")
        lines += ["", "```", tail or "(none)", "```"]
        return "\n".join(lines)
    try:
        body = res.step.render(res.stdout)
        verdict = res.step.target(res.stdout) if res.step.target else ""
    except Exception as exc:  # noqa: BLE001 - a renderer bug must not lose the raw numbers
        body, verdict = render_generic(res.stdout), f"(renderer failed: {type(exc).__name__}: {exc})"
    lines.append(body)
    if verdict:
        lines += ["", verdict]
    lines += ["", f"_{res.seconds:.0f} s; generated by `scripts/bench-all.sh`{' ' + series if series else ''}._"]
    return "\n".join(lines)


def machine_facts(root: Path) -> dict[str, Any]:
    cpu = ""
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(ln for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal")).split()[1])
        mem = f"{kb / (1 << 20):.0f} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10).stdout.strip()  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {"cpu": cpu, "cores": os.cpu_count(), "memory": mem, "kernel": platform.release(),
            "python": platform.python_version(), "load_start": os.getloadavg(), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip


def render_machine(facts: dict[str, Any], results: list[Result], quick: bool, total_s: float) -> str:
    la = " ".join(f"{x:.2f}" for x in facts["load_start"])
    le = " ".join(f"{x:.2f}" for x in facts.get("load_end", ()))
    counts = {s: sum(r.status == s for r in results) for s in ("ok", "failed", "timeout", "skipped")}
    lines = [
        f"**Generated** {facts['date']} by `scripts/bench-all.sh{' --quick' if quick else ''}` (commit {facts['commit']}), "
        f"{total_s / 60:.1f} min for {len(results)} steps: {counts['ok']} ok, {counts['failed']} failed, "
        f"{counts['timeout']} timed out, {counts['skipped']} skipped.",
        "",
        f"**Machine**: {facts['cpu'] or 'unknown CPU'}, {facts['cores']} cores, {facts['memory']} memory, Linux {facts['kernel']}, "
        f"Python {facts['python']}. Load average (1/5/15 min) at the start: {la}; at the end: {le}.",
    ]  # fmt: skip
    if quick:
        lines += ["", "**Quick mode (smoke test): these numbers are not measurements.**"]
    lines += ["", table(["step", "status", "seconds", "note"],
                        [[r.step.name, r.status, f"{r.seconds:.0f}", r.reason] for r in results])]  # fmt: skip
    return "\n".join(lines)


PARTIAL = "**Re-run alone**"  # the machine block's lines for steps a later `--only` run replaced


def block_body(doc: str, name: str) -> str | None:
    m = next((m for m in _BLOCK.finditer(doc) if m.group("name") == name), None)
    return m.group("body").rstrip("\n") if m else None


def render_partial_machine(previous: str, facts: dict[str, Any], results: list[Result]) -> str:
    """The machine block after an `--only` run: the series that wrote the rest of the document
    keeps its header; each re-run step's row is replaced (a new step's row appended) and one line
    per re-run says when, at which commit, on which machine and under what load, so no table is
    read as part of a series it was not measured in."""
    ran = {r.step.name: r for r in results if r.status != "skipped"}
    if not ran:
        return previous
    la = " ".join(f"{x:.2f}" for x in facts["load_start"])
    le = " ".join(f"{x:.2f}" for x in facts.get("load_end", ()))
    stamp = f"re-run alone {facts['date']} (commit {facts['commit']})"
    lines, seen = [], set()
    for ln in previous.splitlines():
        cells = [c.strip() for c in ln.strip().strip("|").split("|")] if ln.startswith("| ") else []
        if cells and cells[0] in ran:
            r = ran[cells[0]]
            seen.add(cells[0])
            ln = "| " + " | ".join([r.step.name, r.status, f"{r.seconds:.0f}", "; ".join(x for x in (stamp, r.reason) if x)]) + " |"
        lines.append(ln)
    new_rows = ["| " + " | ".join([n, r.status, f"{r.seconds:.0f}", "; ".join(x for x in (stamp, r.reason) if x)]) + " |"
                for n, r in ran.items() if n not in seen]  # fmt: skip
    if new_rows:
        last = max((i for i, ln in enumerate(lines) if ln.startswith("| ")), default=len(lines) - 1)
        lines[last + 1:last + 1] = new_rows
    note = (f"{PARTIAL} {facts['date']} (commit {facts['commit']}): {', '.join(ran)} on "
            f"{facts['cpu'] or 'unknown CPU'}, {facts['cores']} cores; load average at the start {la}, at the end {le}.")
    first_table = next((i for i, ln in enumerate(lines) if ln.startswith("| ")), len(lines))
    lines[first_table:first_table] = [note, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/bench-all.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="short runs (smoke test); writes a copy of the document")
    ap.add_argument("--only", default=None, help="comma-separated step names (see --list)")
    ap.add_argument("--skip", default="", help="comma-separated step names not to run")
    ap.add_argument("--list", action="store_true", help="print the steps and exit")
    ap.add_argument("--doc", default=None, help="the document to update (default: docs/benchmarks.md; "
                                                "with --quick: a copy in the output directory)")  # fmt: skip
    ap.add_argument("--out", default=None, help="directory for raw outputs (default: a fresh temporary one)")
    ap.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    ap.add_argument("--step-timeout", type=float, default=None, metavar="SECONDS",
                    help="cap every step's time limit (a step past it is interrupted and reported)")  # fmt: skip
    ap.add_argument("--step", action="append", default=[], metavar="NAME=COMMAND",
                    help="an extra step (shell-split command, generic rendering); may repeat")  # fmt: skip
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    steps = default_steps()
    steps += discover_scripts(root, steps)
    for spec in args.step:
        name, sep, cmd = spec.partition("=")
        if not sep or not name or not cmd:
            ap.error(f"--step takes NAME=COMMAND, got {spec!r}")
        steps.append(Step(name, shlex.split(cmd)))
    if args.step_timeout:
        for s in steps:
            s.timeout_s = min(s.timeout_s, args.step_timeout)
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        ap.error(f"two steps share a name: {names}")
    only = {n.strip() for n in args.only.split(",") if n.strip()} if args.only else None
    skip = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = ((only or set()) | skip) - set(names)
    if unknown:
        ap.error(f"unknown step(s) {sorted(unknown)}; steps: {', '.join(names)}")
    if args.list:
        for s in steps:
            print(f"{s.name:22s} {' '.join(shlex.quote(a) for a in s.argv)}{'   (opt-in)' if s.opt_in else ''}")
        return 0
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tent-bench-all-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    src_doc = root / "docs" / "benchmarks.md"
    if args.doc:
        doc_path = Path(args.doc)
    elif args.quick:
        doc_path = out_dir / "benchmarks.md"
    else:
        doc_path = src_doc
    if not doc_path.exists():
        shutil.copyfile(src_doc, doc_path)
    is_root = os.geteuid() == 0
    facts = machine_facts(root)
    t_start = time.monotonic()
    results: list[Result] = []
    blocks: dict[str, str] = {}
    selected = [s for s in steps if only is None or s.name in only]
    # a series of some steps updates their tables; the header of the series that wrote the rest stays
    previous_machine = block_body(doc_path.read_text(), "machine") if only and not args.quick else None
    for i, step in enumerate(selected, 1):
        why = "skipped by --skip" if step.name in skip else skip_reason(step, root, is_root, args.quick, only)
        if why:
            res = Result(step, "skipped", reason=why)
        else:
            print(f"[{i}/{len(selected)}] {step.name}: {' '.join(step.command(args.quick))}", file=sys.stderr, flush=True)
            res = run_step(step, root, args.quick, out_dir)
        print(f"[{i}/{len(selected)}] {step.name}: {res.status} {res.reason} ({res.seconds:.0f} s)", file=sys.stderr, flush=True)
        block = block_for(res, blocks_in(doc_path.read_text()), args.quick, series_stamp(facts))
        if block is not None:
            blocks[step.name] = block
        results.append(res)
        # written after every step: an interrupted series keeps what it measured
        facts["load_end"] = os.getloadavg()
        if previous_machine is not None:
            blocks["machine"] = render_partial_machine(previous_machine, facts, results)
        else:
            blocks["machine"] = render_machine(facts, results, args.quick, time.monotonic() - t_start)
        text = replace_blocks(doc_path.read_text(), blocks)
        if TARGETS in blocks_in(text):
            text = replace_blocks(text, {TARGETS: targets_summary(text)})
        doc_path.write_text(text)
    print(f"{doc_path} updated; raw outputs in {out_dir}", file=sys.stderr)
    return 0 if all(r.status in ("ok", "skipped") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
