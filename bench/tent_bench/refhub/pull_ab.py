"""Interleaved A/B of refhub's pull forms against the raw engine READs, in one reader process.

The dataplane bench (`refhub bench dataplane`) runs one publisher and one reader process and compares
refhub's verified replicate with the better of two raw READ forms, round by round; its rounds swing by
+-0.2 on a shared 2-core host, so two builds compared run against run resolve little. This probe runs
the same two processes (the bench's own publisher and shard) and, in every round, the raw forms and
each named pull variant (refhub.client's module knobs set for that run only), in rotating order, each
run preceded by a junk fill and followed by a byte check. Per run it records the wall time, the reader's
CPU and the publisher's CPU (from /proc: over loopback the kernel's receive work lands in either
process), and the replicate's split (control requests, the pull, the rest). Variant against variant
within a round is the tight comparison; each against the raw forms says where it stands.

    python -m tent_bench.refhub.pull_ab --transport tcp --rounds 8 \
        --variants '{"default": {}, "no_digest": {"RECV_DIGEST": false}}'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from .data import _cpu_s, dp_reader_setup, run_publisher_and_reader, shard_sizes, windowed_reads


def _proc_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process `pid`, all its threads (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _threads_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (/proc/<pid>/task/*/comm; same-named threads summed)."""
    out: dict[str, float] = {}
    tck = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:  # the thread ended
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tck
    return out


def _diff(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a.get(k, 0.0) for k in b if b[k] - a.get(k, 0.0) > 0}


def _reader(addr: str, sizes: list[int], info: dict, pub_pid: int, rounds: int, variants: dict, q: Any,
            transport: str | None, order: list[str] | None) -> None:

    from refhub import client as C

    from .rounds import junk_fill

    expect = info["stream_checksums"]
    try:
        h, ts, views, reqs, total = dp_reader_setup(addr, sizes, info, transport)
        eng = h.engine
        seed = [0]

        def check() -> None:
            bad = sum(C.checksum(v) != e for v, e in zip(views, expect, strict=True))
            if bad:
                raise RuntimeError(f"{bad} of {len(views)} stream items differ from the publisher's bytes")

        def raw_one() -> dict:
            eng.submit(reqs, deadline=30).wait()
            return {}

        def raw_windowed() -> dict:
            windowed_reads(eng, reqs)
            return {}

        # the replicate's split: its control requests, the pull (setup, READs, checks), the rest
        spans = {"ctl": 0.0, "pull": 0.0}

        def timed(fn: Any, span: str) -> Any:
            def call(*a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    spans[span] += time.perf_counter() - t0

            return call

        h.conn.request, h._pull = timed(h.conn.request, "ctl"), timed(h._pull, "pull")  # type: ignore[method-assign]

        def replicate(knobs: dict) -> dict:
            saved = {k: getattr(C, k) for k in knobs if k != "verify"}
            verify = knobs.get("verify", True)
            try:
                for k, val in knobs.items():
                    if k != "verify":
                        setattr(C, k, val)
                h._verify = verify
                spans["ctl"] = spans["pull"] = 0.0
                t0 = time.perf_counter()
                h.replicate(1, timeout=120)
                dt = time.perf_counter() - t0
            finally:
                for k, val in saved.items():
                    setattr(C, k, val)
            st = dict(h.stats)
            if verify and not st["verified"]:
                raise RuntimeError("replicate did not verify")
            out = {"ctl_s": spans["ctl"], "pull_s": spans["pull"], "other_s": dt - spans["ctl"] - spans["pull"],
                   "first_s": st.get("first_s"), "batches": st.get("batches"), "submit_s": st.get("submit_s"),
                   "late": st.get("digest_late_bytes"), "in_copy": st.get("digest_in_copy_bytes"), "s": dt}
            h.unpublish()  # outside the timing and the spans, as in the dataplane bench
            return out

        series: dict[str, Any] = {"raw_one": raw_one, "raw_windowed": raw_windowed}
        for name, knobs in variants.items():
            if knobs.get("raw") in ("one", "windowed"):  # a second raw series: what the bench's statistic
                series[name] = series["raw_" + knobs["raw"]]  # makes of a "replicate" exactly as fast as raw
            else:
                series[name] = (lambda kn: lambda: replicate(kn))(knobs)
        names = order or list(series)
        runs: dict[str, list[dict]] = {n: [] for n in series}
        for i in range(rounds + 1):
            k = 0 if order else i % len(names)  # rotating, unless the order is given (each run's predecessor fixed)
            for name in names[k:] + names[:k]:
                seed[0] += 1
                junk_fill([*ts, h._pack.array], seed[0])
                rt0, pt0 = _threads_cpu_s(os.getpid()), _threads_cpu_s(pub_pid)
                p0, c0, t0 = _proc_cpu_s(pub_pid), _cpu_s(), time.perf_counter()
                extra = series[name]()
                dt = extra.pop("s", None) or time.perf_counter() - t0
                c1, p1 = _cpu_s(), _proc_cpu_s(pub_pid)
                extra["threads"] = {"reader": _diff(rt0, _threads_cpu_s(os.getpid())),
                                    "pub": _diff(pt0, _threads_cpu_s(pub_pid))}
                check()
                if i:
                    runs[name].append({"GBps": total / dt / 1e9, "s": dt, "reader_cpu": c1 - c0, "pub_cpu": p1 - p0,
                                       **extra})
        h.close()
        q.put({"ok": True, "total": total, "runs": runs})
    except Exception as exc:
        import traceback

        q.put({"error": repr(exc), "tb": traceback.format_exc()})


def run(variants: dict, rounds: int = 6, size_mb: float = 1024, tensors: int = 500,
        transport: str | None = "tcp", order: list[str] | None = None) -> dict:
    sizes = shard_sizes(size_mb, tensors)
    res, _ = run_publisher_and_reader(
        sizes, transport, _reader,
        lambda addr, info, pid, q: (addr, sizes, info, pid, rounds, variants, q, transport, order), 1800)
    med = statistics.median
    gib = res["total"] / (1 << 30)
    runs = res["runs"]
    raw_best = [max(a["GBps"], b["GBps"]) for a, b in zip(runs["raw_one"], runs["raw_windowed"], strict=True)]
    out: dict[str, Any] = {"rounds": rounds, "size_MB": size_mb, "transport": transport,
                           "order": order or "rotating", "series": {}}
    first = next(iter(variants), None)
    for name, rs in runs.items():
        g = [r["GBps"] for r in rs]
        row: dict[str, Any] = {
            "GBps_median": round(med(g), 3), "GBps_min": round(min(g), 3), "GBps_max": round(max(g), 3),
            "x_raw_best_per_round": [round(x / b, 3) for x, b in zip(g, raw_best, strict=True)],
            "x_raw_one_per_round": [round(x / r["GBps"], 3) for x, r in zip(g, runs["raw_one"], strict=True)],
            "reader_cpu_s_per_GiB": round(med(r["reader_cpu"] for r in rs) / gib, 4),
            "pub_cpu_s_per_GiB": round(med(r["pub_cpu"] for r in rs) / gib, 4),
            "both_cpu_s_per_GiB": round(med(r["reader_cpu"] + r["pub_cpu"] for r in rs) / gib, 4),
            # the two processes' CPU over the run's wall time: how much of the cores the run got
            "cores_busy": round(med((r["reader_cpu"] + r["pub_cpu"]) / r["s"] for r in rs), 2),
        }
        for side in ("reader", "pub"):  # CPU s/GiB per thread name, summed over the rounds
            acc: dict[str, float] = {}
            for r in rs:
                for k, val in r["threads"][side].items():
                    acc[k] = acc.get(k, 0.0) + val
            row[side + "_threads_cpu_s_per_GiB"] = {k: round(val / len(rs) / gib, 4)
                                                   for k, val in sorted(acc.items(), key=lambda kv: -kv[1])}
        row["x_raw_best_median"] = round(med(row["x_raw_best_per_round"]), 3)
        row["x_raw_one_median"] = round(med(row["x_raw_one_per_round"]), 3)
        if "ctl_s" in rs[0]:
            for key in ("ctl_s", "pull_s", "other_s", "first_s"):
                vals = [r[key] for r in rs if r.get(key) is not None]
                row[key + "_median_ms"] = round(1e3 * med(vals), 2) if vals else None
            row["batches_median"] = med(r["batches"] or 0 for r in rs)
            row["late_share"] = round(med((r["late"] or 0) for r in rs) / res["total"], 3)
            row["submit_s_median_ms"] = round(1e3 * med((r["submit_s"] or [0.0])[0] for r in rs), 2)
        if first and name != first and name in variants:
            base = runs[first]
            row["x_" + first + "_per_round"] = [round(a["GBps"] / b["GBps"], 3) for a, b in zip(rs, base, strict=True)]
            row["x_" + first + "_median"] = round(med(row["x_" + first + "_per_round"]), 3)
        out["series"][name] = row
    out["raw_best_GBps_median"] = round(med(raw_best), 3)
    out["raw_one_won_rounds"] = sum(a["GBps"] >= b["GBps"] for a, b in zip(runs["raw_one"], runs["raw_windowed"],
                                                                           strict=True))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--size-mb", type=float, default=1024)
    ap.add_argument("--tensors", type=int, default=500)
    ap.add_argument("--variants", default='{"default": {}}',
                    help='JSON {name: {refhub.client knob: value}}; "verify": false runs unverified; '
                         '{"raw": "one"} runs the raw one-batch READs again as a series of its own')
    ap.add_argument("--order", default="", help="comma-separated series names, run in this order every round "
                    "(default: all, rotating round by round)")
    a = ap.parse_args(argv)
    variants = json.loads(a.variants)
    order = [n for n in a.order.split(",") if n] or None
    if order and sorted(order) != sorted(["raw_one", "raw_windowed", *variants]):
        raise SystemExit("--order must name raw_one, raw_windowed and every variant once")
    for knobs in variants.values():
        for k in knobs:
            if k not in ("verify", "raw"):
                import refhub.client as C

                if not hasattr(C, k):
                    raise SystemExit(f"refhub.client has no knob {k!r}")
    print(json.dumps(run(variants, a.rounds, a.size_mb, a.tensors, a.transport or None, order), indent=1))


if __name__ == "__main__":
    main()
