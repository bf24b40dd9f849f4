"""Chain vs striped replication with plain TCP on the burst testbed: ``python -m tent_bench.refhub.topology_probe`` (root).

A bound for what a replication *topology* can reach on the burst benchmark's links (one TBF-shaped
link per node each way, ``tent_bench.refhub.net``), without refhub, TENT, verification or a control
plane: each node is a small process in its namespace with one buffer; a plan says which byte ranges
("segments") a node sends to which other node, and a node forwards a segment's bytes as soon as they
have landed (store-and-forward per ``PIECE``), so a chain pipelines like refhub's.

- ``chain``: the publisher sends everything to r1, r_k forwards to r_{k+1} (refhub's pipeline).
- ``striped``: the buffer is cut into N stripes; the publisher sends stripe i to r_i, and r_i
  forwards stripe i to every other receiver: every uplink carries about (N-1)/N of the data, each
  downlink one copy, and no receiver is more than one forwarding hop from the publisher.
- ``striped_lockstep``: the same plan, but each node sends all its segments from one thread, one
  ``PIECE`` of each in turn: no stripe runs ahead of another (with a thread per segment the kernel's
  per-flow share decides, and a receiver ends with its slowest stripe).

Per N, topology and round: each receiver's time from the common start until all its bytes landed;
the summary is the median over rounds of the mean per receiver and its ratio to N = 1, next to the
kernel's view of each node's uplink TBF (drops, overlimits: ``tc -s qdisc``) and the TCP senders'
retransmits (``ss -ti``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import socket
import statistics
import struct
import sys
import threading
import time

from . import net

PIECE = 256 << 10
PORT = 47000
HDR = struct.Struct("!QQ")  # offset, length


def _node(spec: dict) -> None:
    """One node: listen, accept the incoming segments, forward the outgoing ones as their bytes land."""
    size = spec["size"]
    buf = bytearray(size)
    mv = memoryview(buf)
    got: dict[tuple[int, int], int] = {}  # segment -> bytes landed
    cv = threading.Condition()
    full = spec["full"]
    for _, a, b in spec["send"]:
        got[(a, b)] = (b - a) if full else 0
    incoming = [tuple(s) for s in spec["recv"]]
    for s in incoming:
        got[s] = 0
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((spec["ip"], PORT))
    ls.listen(64)
    t_done: list[float] = []

    def rx(c: socket.socket) -> None:
        a, n = HDR.unpack(c.recv(HDR.size, socket.MSG_WAITALL))
        key = (a, a + n)
        pos = 0
        while pos < n:
            k = c.recv_into(mv[a + pos:a + min(n, pos + PIECE)])
            if not k:
                raise RuntimeError("short segment")
            pos += k
            with cv:
                got[key] = pos
                cv.notify_all()
        c.close()

    def acceptor() -> None:
        ths = []
        for _ in incoming:
            c, _ = ls.accept()
            t = threading.Thread(target=rx, args=(c,), daemon=True)
            t.start()
            ths.append(t)
        for t in ths:
            t.join()
        t_done.append(time.monotonic())

    def tx(dst: str, a: int, b: int) -> None:
        c = socket.create_connection((dst, PORT), timeout=30)
        c.sendall(HDR.pack(a, b - a))
        sent = 0
        while a + sent < b:
            with cv:
                while got[(a, b)] <= sent:
                    cv.wait(1.0)
                upto = got[(a, b)]
            c.sendall(mv[a + sent:a + upto])
            sent = upto
        c.shutdown(socket.SHUT_WR)
        c.recv(1)
        c.close()

    def tx_lockstep(sends: list) -> None:
        # every segment of this node advances one PIECE at a time, in turn: no stripe runs ahead of
        # another (with one thread per segment the kernel's per-flow share decides, and a receiver
        # ends with its slowest stripe)
        conns = []
        for d, a, b in sends:
            c = socket.create_connection((d, PORT), timeout=30)
            c.sendall(HDR.pack(a, b - a))
            conns.append(c)
        off = 0
        longest = max(b - a for _, a, b in sends)
        while off < longest:
            for c, (_, a, b) in zip(conns, sends, strict=True):
                lo, hi = a + off, min(b, a + off + PIECE)
                if lo >= hi:
                    continue
                with cv:
                    while got[(a, b)] < hi - a:
                        cv.wait(1.0)
                c.sendall(mv[lo:hi])
            off += PIECE
        for c in conns:
            c.shutdown(socket.SHUT_WR)
        for c in conns:
            c.recv(1)
            c.close()

    acc = threading.Thread(target=acceptor, daemon=True)
    acc.start()
    print("ready", flush=True)
    t0 = float(sys.stdin.readline())
    time.sleep(max(0.0, t0 - time.monotonic()))
    if spec.get("lockstep") and spec["send"]:
        txs = [threading.Thread(target=tx_lockstep, args=(spec["send"],), daemon=True)]
    else:
        txs = [threading.Thread(target=tx, args=(d, a, b), daemon=True) for d, a, b in spec["send"]]
    for t in txs:
        t.start()
    acc.join(60)
    for t in txs:
        t.join(60)
    print(json.dumps({"t_end": t_done[0] if t_done else None, "t0": t0}), flush=True)


def plan(kind: str, n: int, size: int) -> dict[int, dict]:
    """Node index (1 = publisher, 2.. = receivers) -> its send/recv segments."""
    rx = list(range(2, 2 + n))
    p: dict[int, dict] = {j: {"send": [], "recv": [], "full": j == 1} for j in [1, *rx]}
    if kind == "chain":
        order = [1, *rx]
        for s, d in itertools.pairwise(order):
            p[s]["send"].append((d, 0, size))
            p[d]["recv"].append((0, size))
        return p
    cuts = [size * i // n for i in range(n + 1)]
    for i, r in enumerate(rx):
        seg = (cuts[i], cuts[i + 1])
        p[1]["send"].append((r, *seg))
        p[r]["recv"].append(seg)
        for o in rx:
            if o != r:
                p[r]["send"].append((o, *seg))
                p[o]["recv"].append(seg)
    return p


def _tc_stats(nodes: net.Nodes, j: int) -> dict:
    """Drops on node j's uplink TBF (its side of the link) and downlink TBF (the switch's side)."""
    res = {}
    for side, ns, dev in (("up", j, nodes.ifname(j)), ("down", 0, nodes.fabric.link(0, peer=j).if0)):
        out = nodes.fabric.run(ns, ["tc", "-s", "qdisc", "show", "dev", dev]).stdout
        m = re.search(r"dropped (\d+), overlimits (\d+)", out)
        res[side] = int(m.group(1)) if m else 0
    return res


def run_once(nodes: net.Nodes, kind: str, n: int, size: int) -> dict:
    p = plan("striped" if kind == "striped_lockstep" else kind, n, size)
    procs = {}
    tc0 = {j: _tc_stats(nodes, j) for j in p}
    for j, s in p.items():
        spec = {"size": size, "ip": nodes.ip(j), "full": s["full"], "recv": s["recv"],
                "lockstep": kind == "striped_lockstep",
                "send": [(nodes.ip(d), a, b) for d, a, b in s["send"]]}
        procs[j] = nodes.popen(j, [sys.executable, "-c",
                                   f"from tent_bench.refhub.topology_probe import _node; import json; _node(json.loads({json.dumps(json.dumps(spec))}))"],
                               f"probe-{kind}-{n}-{j}", env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    for pr in procs.values():
        if pr.stdout.readline().strip() != "ready":
            raise RuntimeError("probe node did not start")
    t0 = time.monotonic() + 0.3
    for pr in procs.values():
        pr.stdin.write(f"{t0}\n")
        pr.stdin.flush()
    res = {}
    for j, pr in procs.items():
        line = pr.stdout.readline()
        res[j] = json.loads(line)
        nodes.stop(pr)
    tc1 = {j: _tc_stats(nodes, j) for j in p}
    secs = [res[j]["t_end"] - t0 for j in p if j != 1]
    drops = {j: [tc1[j][k] - tc0[j][k] for k in ("up", "down")] for j in p}
    return {"secs": secs, "mean": statistics.mean(secs), "drops_up_down": drops}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="1,4,6")
    ap.add_argument("--size-mb", type=float, default=64)
    ap.add_argument("--rate", default="500mbit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default="chain,striped", help="chain, striped, striped_lockstep")
    a = ap.parse_args()
    ns = [int(x) for x in a.n.split(",")]
    kinds = a.kinds.split(",")
    size = int(a.size_mb * net.MB)
    nodes = net.Nodes(max(ns) + 2, a.rate)
    if not nodes.shaped:
        raise SystemExit("needs root (network namespaces): " + nodes.note)
    rows: dict[tuple[str, int], list[dict]] = {}
    try:
        for r in range(a.rounds):
            for n in ns:
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    if kind.startswith("striped") and n == 1:
                        continue  # the same as the chain
                    x = run_once(nodes, kind, n, size)
                    rows.setdefault((kind, n), []).append(x)
                    print(json.dumps({"round": r, "kind": kind, "n": n, **x}), file=sys.stderr, flush=True)
    finally:
        nodes.close()
    base = statistics.median(x["mean"] for x in rows[("chain", 1)]) if ("chain", 1) in rows else None
    out = []
    for (kind, n), xs in sorted(rows.items()):
        med = statistics.median(x["mean"] for x in xs)
        out.append({"kind": kind, "n": n, "median_mean_s": round(med, 3),
                    "ratio_to_n1": round(med / base, 3) if base else None,
                    "spread": round(max(x["mean"] for x in xs) - min(x["mean"] for x in xs), 3),
                    "slowest_receiver_s": round(statistics.median(max(x["secs"]) for x in xs), 3),
                    "drops_up_down_last_round": xs[-1]["drops_up_down"]})
    print(json.dumps({"size_MB": a.size_mb, "rate": a.rate, "rounds": a.rounds, "rows": out}))


if __name__ == "__main__":
    main()
