"""Pipeline replication settings side by side: ``python -m tent_bench.refhub.pipeline_ab`` (root).

The burst benchmark's shaped star (``tent_bench.refhub.net``), refhub with pipeline replication only,
one reference server and set of receivers per configuration (each configuration is a set of
``REFHUB_*`` environment variables, read by the client at import), all started up front and run
interleaved, the order alternating per round. Per configuration and N: the median over rounds of
the mean per-receiver time, its ratio to N=1, the first hop's time (the receiver that reads the
publisher) and each later hop's lag behind its source (the difference of their end times: the
nodes share one kernel, so their monotonic clocks agree); and per position along the chain
(``chain``: depth 1 reads the publisher, depth 2 reads depth 1, ...) the medians of its time, its
lag, the time it waited for its source's next bytes (``starved_s``), and the mean and largest request
delay its batches saw (``request_delay_s``, ``request_delay_max_s``: what the link waited for its
requests; refhub.window). Every copy is verified.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from . import net

DEFAULT_CONFS = {
    "default": {},
    "inflight_50ms": {"REFHUB_INFLIGHT_S": "0.05"},  # the complete copy's reader as before issue 14's burst track
    "small_windows": {"REFHUB_BATCH_S": "0.005", "REFHUB_INFLIGHT_S": "0.025", "REFHUB_PARTIAL_INFLIGHT_S": "0.03"},
}


def _hop_lags(out: list[dict]) -> tuple[list[float], list[float]]:
    ends = {f"rollout{i}": x["t_end"] for i, x in enumerate(out)}
    lags = [x["t_end"] - ends[x["sources"][0][0]] for x in out if x["sources"][0][0] in ends]
    first = [x["secs"] for x in out if x["sources"][0][0] == "publisher"]
    return lags, first


def _mark_times(x: dict) -> list[float] | None:
    """A reply's absolute times (the nodes' shared monotonic clock) at which it held each sixteenth of
    the bytes, or None when the reply lacks them."""
    if not x.get("marks_s") or x.get("t_start") is None or x.get("routed_s") is None:
        return None
    return [x["t_start"] + x["routed_s"] + m for m in x["marks_s"]]


def _mark_lag(x: dict, src: dict | None, i: int) -> float | None:
    """How much later than its source a reader held the first (i+1)/16 of the bytes."""
    mine, theirs = _mark_times(x), _mark_times(src) if src else None
    if not mine or not theirs or len(mine) <= i or len(theirs) <= i:
        return None
    return mine[i] - theirs[i]


def _submit_ms(sub: list | None) -> dict[str, float | None]:
    if not sub or not sub[2]:
        return {"submit_ms": None, "submit_cpu_ms": None, "submit_max_ms": None}
    return {"submit_ms": 1000 * sub[0] / sub[2], "submit_cpu_ms": 1000 * sub[1] / sub[2], "submit_max_ms": 1000 * sub[3]}


def chain(out: list[dict]) -> list[dict]:
    """One round's receivers (``out[i]`` is rollout i's reply) by depth along the pipeline: each with
    the replica it first read from, its time, its lag behind that source (None for the publisher's
    readers), its starved time and its mean request delay. Readers whose source is not reached from the
    publisher (none in a healthy run) are left out."""
    ends = {f"rollout{i}": x["t_end"] for i, x in enumerate(out)}
    by_name = {f"rollout{i}": x for i, x in enumerate(out)}
    t00 = min((x["t_start"] for x in out if x.get("t_start") is not None), default=None)
    readers: dict[str, list[tuple[str, dict]]] = {}
    for i, x in enumerate(out):
        readers.setdefault(x["sources"][0][0], []).append((f"rollout{i}", x))
    hops: list[dict] = []
    level, depth = ["publisher"], 1
    while level and depth <= len(out):
        nxt = []
        for src in level:
            for name, x in readers.get(src, []):
                rd = x.get("request_delay_s")
                hops.append({"depth": depth, "name": name, "source": src, "secs": x["secs"],
                             "lag_s": x["t_end"] - ends[src] if src in ends else None,
                             # where the lag arises: behind the source at the first sixteenth of the bytes
                             # (the hop's start delay), at half, and at the end (lag_s)
                             "lag_first16_s": _mark_lag(x, by_name.get(src), 0),
                             "lag_half_s": _mark_lag(x, by_name.get(src), 7),
                             # the hop's own start: the request until the server named its source, and
                             # the pull's start until its first batch landed
                             "start_s": x["t_start"] - t00 if t00 is not None and x.get("t_start") is not None else None,
                             "routed_s": x.get("routed_s"), "first_s": x.get("first_s"),
                             # what contends for the 2 cores: the node's CPU seconds and involuntary
                             # context switches during its pull
                             "cpu_s": x.get("cpu_s"), "nivcsw": x.get("nivcsw"),
                             # a submit's mean wall and CPU time and the pull's longest, ms (what the
                             # pulling thread waited for inside the engine's submit)
                             **_submit_ms(x.get("submit_s")),
                             "starved_s": x.get("starved_s"), "request_delay_s": rd[0] if rd else None,
                             "request_delay_max_s": rd[1] if rd else None,
                             "probe_hits": (x.get("probes") or [0, 0])[1], "caught_up_s": x.get("caught_up_s"),
                             "window_full_s": x.get("window_full_s"),
                             # waiting READs (REFHUB_WAIT_READ): re-issues after a READ waited out its time at the source
                             "wait_retries": (x.get("wait_read") or [False, 0, 0])[2] if (x.get("wait_read") or [False])[0]
                             else None})
                nxt.append(name)
        level, depth = nxt, depth + 1
    return hops


def _by_depth(rounds: list[list[dict]]) -> list[dict]:
    """Medians per chain depth over rounds."""
    out = []
    for d in sorted({h["depth"] for r in rounds for h in r}):
        hs = [h for r in rounds for h in r if h["depth"] == d]
        row: dict[str, Any] = {"depth": d, "hops": len(hs)}
        for k in ("secs", "lag_s", "lag_first16_s", "lag_half_s", "start_s", "routed_s", "first_s", "cpu_s",
                  "nivcsw", "submit_ms", "submit_cpu_ms", "submit_max_ms", "starved_s", "request_delay_s", "request_delay_max_s", "probe_hits",
                  "caught_up_s", "window_full_s", "wait_retries"):
            vals = [h[k] for h in hs if h[k] is not None]
            row[k] = round(statistics.median(vals), 3) if vals else None
        out.append(row)
    return out


def run(ns: list[int], rounds: int, confs: dict[str, dict[str, str]], size_mb: float = 64, rate: str = "500mbit",
        timeline: str | None = None) -> dict:
    sizes = net._sizes(size_mb, 32 if size_mb >= 64 else 8)
    ports = itertools.count(5600)

    def server(nodes: net.Nodes, name: str) -> tuple[subprocess.Popen, str]:
        bind = f"tcp://{nodes.ip(0)}:{next(ports) if nodes.shaped else net._free_port()}"
        p = nodes.popen(0, [sys.executable, "-m", "refhub.cli", "serve", "--bind", bind, "--hb-timeout", "3"], name,
                        stdin=subprocess.DEVNULL)
        if "listening" not in net._read_plain(p, 60, name):
            raise RuntimeError(f"{name}: {nodes.tail(name)}")
        return p, bind

    samples: dict[str, dict[int, list[dict[str, Any]]]] = {c: {n: [] for n in ns} for c in confs}
    t0 = time.monotonic()
    with net.Nodes(max(ns) + 2, rate) as nodes:
        systems: dict[str, net._RefhubSystem] = {}
        saved = dict(os.environ)
        orig = net._server
        try:
            for c, env in confs.items():
                os.environ.update(env)
                net._server = lambda nodes_, _pipeline, name: server(nodes_, name)  # one port per system
                s = systems[c] = net._RefhubSystem(nodes, max(ns), sizes, True)
                s.start()
                os.environ.clear()
                os.environ.update(saved)
            k = 0
            for rnd in range(rounds):
                for n in ns:
                    names = list(confs)
                    for c in names[k % len(names):] + names[:k % len(names)]:
                        rcv = systems[c].rcv[:n]
                        for p in rcv:
                            net._send(p, {"cmd": "replicate"})
                        out = [net._read(p, 900, f"{c} rollout{i}") for i, p in enumerate(rcv)]
                        bad = [x for x in out if not x.get("ok") or not x.get("data_ok")]
                        if bad:
                            raise RuntimeError(f"{c} n={n}: {bad}")
                        for p in rcv:
                            net._send(p, {"cmd": "drop", "junk": 1000 * (rnd + 1) + n})
                        for i, p in enumerate(rcv):
                            net._read(p, 60, f"{c} rollout{i} drop")
                        if timeline:  # every receiver's reply of the round, for a per-round look
                            with open(timeline, "a") as f:
                                f.write(json.dumps({"config": c, "n": n, "round": rnd, "replies": out}) + "\n")
                        lags, first = _hop_lags(out)
                        samples[c][n].append({"mean_s": statistics.mean(x["secs"] for x in out), "hop_lags_s": lags,
                                              "first_hop_s": first, "chain": chain(out)})
                    k += 1
        finally:
            net._server = orig
            os.environ.clear()
            os.environ.update(saved)
            for s in systems.values():
                s.close()
        shaped = nodes.shaped
    rows = []
    for c in confs:
        base = statistics.median(g["mean_s"] for g in samples[c][ns[0]])
        for n in ns:
            got = samples[c][n]
            med = statistics.median(g["mean_s"] for g in got)
            lags = [x for g in got for x in g["hop_lags_s"]]
            spread = (max(g["mean_s"] for g in got) - min(g["mean_s"] for g in got)) / med
            rows.append({"config": c, "n": n, "per_receiver_s": round(med, 3), f"x_n{ns[0]}": round(med / base, 3),
                         "spread": round(spread, 3),
                         "first_hop_s": round(statistics.median(x for g in got for x in g["first_hop_s"]), 3),
                         "hop_lag_median_s": round(statistics.median(lags), 3) if lags else None,
                         "hop_lag_max_s": round(max(lags), 3) if lags else None,
                         "rounds_s": [round(g["mean_s"], 3) for g in got],
                         "chain": _by_depth([g["chain"] for g in got])})
    return {"bench": "pipeline_ab", "size_MB": size_mb, "rate": rate, "shaped": shaped, "rounds": rounds,
            "configs": confs, "rows": rows, "wall_s": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1,4,6")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mb", type=float, default=64)
    ap.add_argument("--rate", default="500mbit")
    ap.add_argument("--configs", default=json.dumps(DEFAULT_CONFS), help="JSON {name: {REFHUB_*: value}}")
    ap.add_argument("--timeline", help="append every round's receiver replies (JSON lines) to this file")
    a = ap.parse_args()
    res = run([int(x) for x in a.n.split(",")], a.rounds, json.loads(a.configs), a.size_mb, a.rate, a.timeline)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
