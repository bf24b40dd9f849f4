"""What the burst testbed's links hold during a pipeline run: ``python -m tent_bench.refhub.link_sample`` (root).

Runs ``pipeline_ab`` (one configuration, refhub's defaults unless ``--configs`` says otherwise) and,
in a thread beside it, samples every ``--period`` seconds each node's *uplink* TBF (``tc -s qdisc``:
the bytes queued, drops) and the publisher's TCP connections (``ss -tin``: smoothed RTT, cwnd, bytes
unacknowledged). Per round, while the publisher is sending: the median smoothed RTT of its busy
connections, their count, how much they have unacknowledged (against their cwnd: app- or cwnd-
limited), the publisher's uplink queue (median, and how often it was empty) and the uplink queue of
the receiver it sends to (depth 1 of the chain: its TCP ACKs and READ requests leave through that
queue, behind the bytes it forwards to depth 2), with drops on any TBF.

Each sample forks ``tc`` once per node and ``ss`` once, so on a small host it is itself load: compare
N=1 and N>1 rows of the same run, not against a run without it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import threading
import time
from typing import Any

from . import net, pipeline_ab

_BACKLOG = re.compile(r"backlog (\d+)b")
_DROPPED = re.compile(r"dropped (\d+)")
_PEER = re.compile(r"\s(\d+\.\d+\.\d+\.\d+):\d+\s*$")


def parse_ss(out: str) -> list[dict]:
    """``ss -tinH`` output: per connection its peer address and, where shown, srtt (ms), cwnd and
    unacked (segments), mss and bytes_sent."""
    conns = []
    for blk in re.split(r"\n(?=\S)", out.strip()):
        if not blk:
            continue
        head = blk.split("\n", 1)[0]
        peer = _PEER.search(head)
        row: dict[str, Any] = {"peer": peer.group(1) if peer else None}
        for key, pat, cast in (("srtt_ms", r"\brtt:([\d.]+)/", float), ("cwnd", r"\bcwnd:(\d+)", int),
                               ("unacked", r"\bunacked:(\d+)", int), ("mss", r"\bmss:(\d+)", int),
                               ("bytes_sent", r"\bbytes_sent:(\d+)", int)):
            m = re.search(pat, blk)
            row[key] = cast(m.group(1)) if m else None
        conns.append(row)
    return conns


def parse_tc(out: str) -> tuple[int | None, int | None]:
    """``tc -s qdisc show dev X`` output: (bytes queued, packets dropped)."""
    b, d = _BACKLOG.search(out), _DROPPED.search(out)
    return (int(b.group(1)) if b else None, int(d.group(1)) if d else None)


class Sampler:
    """Samples the uplinks and the publisher's connections of a `net.Nodes` star until stopped."""

    def __init__(self, period: float) -> None:
        self.period = period
        self.nodes: net.Nodes | None = None
        self.samples: list[dict] = []
        self.marks: list[float] = []  # when each replicate command went out
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-sample", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while self.nodes is None and not self._stop.wait(0.05):
            pass
        nodes = self.nodes
        if nodes is None or nodes.fabric is None:
            return
        fab = nodes.fabric
        while not self._stop.is_set():
            t = time.monotonic()
            q = {}
            for j in range(1, nodes.count):
                out = subprocess.run(["tc", "-n", fab.ns(j), "-s", "qdisc", "show", "dev", nodes.ifname(j)],
                                     capture_output=True, text=True, timeout=10).stdout
                q[j] = parse_tc(out)
            out = subprocess.run(["ip", "netns", "exec", fab.ns(1), "ss", "-tinH", "state", "established"],
                                 capture_output=True, text=True, timeout=10).stdout
            self.samples.append({"t": t, "q": q, "pub": parse_ss(out)})
            self._stop.wait(max(0.0, self.period - (time.monotonic() - t)))


def per_round(sampler: Sampler, ns: list[int], nodes_ip: dict[str, int]) -> list[dict]:
    """One row per round (the replicate commands of a round go out together): while the publisher
    sends, its busy connections' srtt and in-flight, its uplink queue and its reader's."""
    starts, i, k = [], 0, 0
    while i < len(sampler.marks):
        n = ns[k % len(ns)]
        starts.append((sampler.marks[i], n))
        i, k = i + n, k + 1
    rows = []
    for r, (t0, n) in enumerate(starts):
        t1 = starts[r + 1][0] if r + 1 < len(starts) else t0 + 5.0
        sent: dict[str, int] = {}
        srtt, unacked, cwnd, pub_q, rd_q, busy_conns = [], [], [], [], [], []
        readers: set[int] = set()
        drops = 0
        for s in (x for x in sampler.samples if t0 <= x["t"] < t1):
            moving = []
            by_peer: dict[str, int] = {}
            for c in s["pub"]:
                if c["peer"] and c["bytes_sent"] is not None:
                    by_peer[c["peer"]] = by_peer.get(c["peer"], 0) + c["bytes_sent"]
            for peer, b in by_peer.items():
                if peer in sent and b - sent[peer] > 256 * 1024:
                    moving.append(peer)
                sent[peer] = b
            if not moving:
                continue
            busy = [c for c in s["pub"] if c["peer"] in moving and (c["unacked"] or 0) > 0]
            busy_conns.append(len(busy))
            srtt += [c["srtt_ms"] for c in busy if c["srtt_ms"] is not None]
            unacked += [c["unacked"] * (c["mss"] or 1448) for c in busy if c["unacked"] is not None]
            cwnd += [c["cwnd"] * (c["mss"] or 1448) for c in busy if c["cwnd"] is not None]
            pub_q.append(s["q"][1][0] or 0)
            for peer in moving:
                j = nodes_ip.get(peer)
                if j is not None:
                    readers.add(j)
                    rd_q.append(s["q"][j][0] or 0)
            drops = max(drops, sum(d or 0 for _, d in s["q"].values()))

        def med(xs: list[float], scale: float = 1.0) -> float | None:
            return round(statistics.median(xs) / scale, 1) if xs else None
        rows.append({"n": n, "samples": len(pub_q), "pub_busy_conns": med(busy_conns),
                     "pub_srtt_ms": med(srtt), "pub_srtt_p90_ms": round(sorted(srtt)[int(0.9 * len(srtt))], 1) if srtt else None,
                     "pub_unacked_KB": med(unacked, 1e3), "pub_cwnd_KB": med(cwnd, 1e3),
                     "pub_uplink_queue_KB": med(pub_q, 1e3),
                     "pub_uplink_empty": f"{sum(1 for x in pub_q if x == 0)}/{len(pub_q)}",
                     "reader_uplink_queue_KB": med(rd_q, 1e3),
                     "reader_uplink_queue_max_KB": round(max(rd_q) / 1e3) if rd_q else None,
                     "tbf_drops_total": drops})
    return rows


def run(ns: list[int], rounds: int, confs: dict[str, dict[str, str]], period: float) -> dict:
    if len(confs) != 1:  # interleaved configurations' rounds would not say whose samples are whose
        raise ValueError("link_sample runs one configuration")
    sampler = Sampler(period)
    holder: dict[str, net.Nodes] = {}
    init, send = net.Nodes.__init__, net._send

    def nodes_init(self: net.Nodes, *a: Any, **kw: Any) -> None:
        init(self, *a, **kw)
        holder["nodes"] = self
        sampler.nodes = self

    def marking_send(p: Any, msg: dict) -> None:
        if msg.get("cmd") == "replicate":
            sampler.marks.append(time.monotonic())
        send(p, msg)
    net.Nodes.__init__ = nodes_init  # type: ignore[method-assign]
    net._send = marking_send
    sampler.start()
    try:
        res = pipeline_ab.run(ns, rounds, confs)
    finally:
        sampler.stop()
        net.Nodes.__init__ = init  # type: ignore[method-assign]
        net._send = send
    nodes = holder.get("nodes")
    ips = {nodes.ip(j): j for j in range(1, nodes.count)} if nodes is not None and nodes.shaped else {}
    rows = per_round(sampler, ns, ips)
    summary = {c: {r["n"]: r["per_receiver_s"] for r in res["rows"] if r["config"] == c} for c in confs}
    chain = {c: {r["n"]: [(h["depth"], h["secs"], h["lag_s"]) for h in r["chain"]] for r in res["rows"] if r["config"] == c}
             for c in confs}
    return {"bench": "link_sample", "period_s": period, "rounds": rounds, "per_receiver_s": summary,
            "chain": chain, "links": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1,6")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--period", type=float, default=0.04, help="seconds between samples (each forks tc per node)")
    ap.add_argument("--configs", default=json.dumps({"default": {}}), help="JSON {name: {REFHUB_*: value}}; one")
    a = ap.parse_args()
    print(json.dumps(run([int(x) for x in a.n.split(",")], a.rounds, json.loads(a.configs), a.period), indent=1))


if __name__ == "__main__":
    main()
