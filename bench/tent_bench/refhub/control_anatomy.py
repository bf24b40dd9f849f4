"""Where the control requests of a verified replicate spend their time (issue 14, diagnostic).

The dataplane bench's shard (500 tensors, 250 packed, 1 GiB by default) from a publisher process to a
reader process, the reference server embedded in this one (as `refhub bench dataplane` runs it).
Every `replicate` and `replicate_done` is cut into spans by wrapping the library's functions
(monotonic clock, shared by the processes): client encode, the hop to the server (inproc queue, the
client's I/O thread, loopback TCP, the server loop's wake-up), server decode, the state machine's
handling (validation included), reply encode + send, the hop back, client decode, the caller's
wake-up; plus the verifier's setup. Prints medians (min-max) over the replicates of one run.

    python -m tent_bench.refhub.control_anatomy [size_MB=1024] [replicates=7]

For an A/B of refhub itself, run it once per tree, interleaved (PYTHONPATH=<other tree>/refhub
puts that tree's refhub first, here and in the spawned processes).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import sys
import time

from tent_bench.refhub import data as D

NS = time.perf_counter_ns
srv_rec = []

def instrument_server():
    from refhub import protocol
    from refhub import server as S
    from refhub import state as ST
    orig_unpack = protocol.unpack
    cur = {}
    def unpack(b):
        cur["t0"] = NS()
        return orig_unpack(b)
    S.protocol.unpack = unpack
    orig_handle = ST.ServerState.handle
    def handle(self, client, msg, now):
        t = NS()
        out = orig_handle(self, client, msg, now)
        if isinstance(msg, dict) and msg.get("op") in ("replicate", "replicate_done"):
            cur.setdefault("ops", []).append((msg["op"], msg["rid"], cur.get("t0", t), t, NS()))
        return out
    ST.ServerState.handle = handle
    orig_flush = S.Server._flush
    def flush(self, outq):
        t = NS()
        orig_flush(self, outq)
        te = NS()
        for op, rid, t0, th, te_h in cur.pop("ops", []):
            srv_rec.append({"op": op, "rid": rid, "s_recv": t0, "s_handle0": th, "s_handle1": te_h, "s_flush0": t, "s_sent": te})
    S.Server._flush = flush

def reader(addr, sizes, info, rounds, q):
    import msgpack

    import refhub
    from refhub import client as C
    rec = {}
    orig_req = C.Connection.request
    def request(self, msg, timeout=30.0):
        op = msg.get("op")
        t0 = NS()
        try:
            return orig_req(self, msg, timeout)
        finally:
            if op in ("replicate", "replicate_done"):
                rec[msg["rid"]].update(op=op, c_req0=t0, c_req1=NS())
    C.Connection.request = request
    orig_packb = msgpack.packb
    def packb(o, **kw):
        t = NS()
        b = orig_packb(o, **kw)
        if isinstance(o, dict) and o.get("op") in ("replicate", "replicate_done"):
            rec[o["rid"]] = {"c_pack0": t, "c_pack1": NS(), "req_bytes": len(b)}
        return b
    C.msgpack.packb = packb
    if hasattr(C, "_pack"):
        orig_pack = C._pack
        def cpack(o, pb=None):
            t = NS()
            b = orig_pack(o, pb)
            if isinstance(o, dict) and o.get("op") in ("replicate", "replicate_done"):
                rec[o["rid"]] = {"c_pack0": t, "c_pack1": NS(), "req_bytes": len(b)}
            return b
        C._pack = cpack
    orig_unpackb = msgpack.unpackb
    last = {}
    def unpackb(b, **kw):
        t = NS()
        o = orig_unpackb(b, **kw)
        last.update(u0=t, u1=NS(), n=len(b))
        return o
    C.msgpack.unpackb = unpackb
    orig_deliver = C.Connection._deliver
    def deliver(self, rep):
        r = rec.get(rep.get("rid"))
        if r is not None and "c_unpack0" not in r:
            r.update(c_unpack0=last["u0"], c_unpack1=last["u1"], rep_bytes=last["n"], c_deliver=NS())
        return orig_deliver(self, rep)
    C.Connection._deliver = deliver
    ov = C._Verifier.__init__
    vt = []
    def vinit(self, *a, **k):
        t = NS()
        ov(self, *a, **k)
        vt.append(NS() - t)
    C._Verifier.__init__ = vinit
    h = refhub.open("dp", replica="reader", server=addr, hb_interval=0.2, engine=D._dp_engine(None))
    for i, n in enumerate(sizes):
        h.allocate(f"w{i:04d}", n)[:] = 1
    out = []
    for _ in range(rounds):
        t0 = NS()
        h.replicate(1, timeout=120)
        t1 = NS()
        out.append({"total_ms": (t1 - t0) / 1e6, "pull_s": h.stats["seconds"]})
        h.unpublish()
    q.put({"rec": list(rec.values()), "rounds": out, "verifier_us": [x / 1e3 for x in vt]})
    h.close()

def _span(xs: list, scale: float) -> str:
    return f"{statistics.median(xs) / scale:.3f} ({min(xs) / scale:.3f}-{max(xs) / scale:.3f})"


def main() -> None:
    size_mb = float(sys.argv[1]) if len(sys.argv) > 1 else 256
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    instrument_server()
    ctx = mp.get_context("spawn")
    addr = D._server()
    sizes = D.shard_sizes(size_mb, 500)
    ready, stop, q = ctx.Queue(), ctx.Event(), ctx.Queue()
    pub = ctx.Process(target=D._dp_publisher, args=(addr, sizes, ready, stop, None))
    pub.start()
    try:
        info = ready.get(timeout=300)
        rd = ctx.Process(target=reader, args=(addr, sizes, info, rounds, q))
        rd.start()
        res = q.get(timeout=600)
        rd.join(30)
    finally:
        stop.set()
        pub.join(30)
    # the server sees one client's requests in the order it sent them: matched by order per op
    rows: dict[str, list] = {"replicate": [], "replicate_done": []}
    for c in res["rec"]:
        rows[c["op"]].append(c)
    sv = {"replicate": [s for s in srv_rec if s["op"] == "replicate"], "replicate_done": [s for s in srv_rec if s["op"] == "replicate_done"]}
    summ = {}
    for op in rows:
        spans = {k: [] for k in ("total", "c_pack", "to_server", "s_unpack", "s_handle", "s_reply_pack_send", "to_client_io", "c_unpack", "c_wake")}
        for c, s in zip(rows[op], sv[op], strict=True):
            spans["total"].append(c["c_req1"] - c["c_req0"])
            spans["c_pack"].append(c["c_pack1"] - c["c_pack0"])
            spans["to_server"].append(s["s_recv"] - c["c_pack1"])
            spans["s_unpack"].append(s["s_handle0"] - s["s_recv"])
            spans["s_handle"].append(s["s_handle1"] - s["s_handle0"])
            spans["s_reply_pack_send"].append(s["s_sent"] - s["s_flush0"])
            spans["to_client_io"].append(c["c_unpack0"] - s["s_sent"])
            spans["c_unpack"].append(c["c_unpack1"] - c["c_unpack0"])
            spans["c_wake"].append(c["c_req1"] - c["c_deliver"])
        summ[op] = {k: _span(v, 1e6) for k, v in spans.items() if v}
        summ[op]["bytes"] = (rows[op][0]["req_bytes"], rows[op][0]["rep_bytes"])
    summ["verifier_ms"] = _span(res["verifier_us"], 1e3)
    summ["replicate_total_ms"] = [round(r["total_ms"], 1) for r in res["rounds"]]
    print(json.dumps(summ, indent=1))  # noqa: T201 (a command-line tool)

if __name__ == "__main__":
    main()
