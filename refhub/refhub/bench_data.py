"""Data-plane benchmarks (paper §5.1.1-5.1.3), one process per worker on this host.

- dataplane: one publisher, one reader; replicate latency and GB/s vs a raw tent_core READ of the
  same bytes (the loopback "line rate").
- burst: one publisher, K readers replicating at once, each capped by an emulated NIC (token
  bucket in the reader); total stall time with pipeline replication vs without.
- failover: trainer -> A (capped) -> B; SIGKILL A mid-transfer; B's completion time vs no failure.

Loopback numbers show trends only (no RDMA, 2 cores).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import statistics
import time
from typing import Any

import numpy as np

MB = 1 << 20


def _tensors(size_mb: float, n: int = 4) -> list[np.ndarray]:
    per = int(size_mb * MB) // n
    return [np.zeros(per, dtype=np.uint8) for _ in range(n)] + [np.zeros(4096, dtype=np.uint8) for _ in range(8)]


def _publisher(addr: str, size_mb: float, ready: Any, stop: Any) -> None:
    import refhub

    h = refhub.open("bench", replica="trainer", server=addr, hb_interval=0.2)
    ts = _tensors(size_mb)
    rng = np.random.default_rng(0)
    for i, t in enumerate(ts):
        t[:] = rng.integers(0, 255, t.nbytes, dtype=np.uint8)
        h.register(f"t{i}", t)
    h.publish(1)
    ready.put(h.engine.segment_name(h.segment))
    stop.wait()
    h.close()


def _reader(addr: str, name: str, size_mb: float, throttle: float | None, start: Any, q: Any) -> None:
    import refhub

    h = refhub.open("bench", replica=name, server=addr, hb_interval=0.2, throttle_Bps=throttle)
    ts = _tensors(size_mb)
    for i, t in enumerate(ts):
        h.register(f"t{i}", t)
    q.put(("ready", name))
    start.wait()
    t0 = time.monotonic()
    try:
        h.replicate("latest", timeout=300)
        q.put(("done", name, time.monotonic() - t0, h.stats))
    except Exception as exc:  # reported to the parent
        q.put(("error", name, repr(exc)))
    start.wait()  # keep serving until the parent is done
    h.close()


def _server(pipeline: bool = True) -> str:
    from .server import start_embedded

    return start_embedded(hb_timeout=3.0, pipeline=pipeline)


def dataplane(size_mb: float = 256, repeat: int = 5) -> dict:
    ctx = mp.get_context("spawn")
    addr = _server()
    ready, stop = ctx.Queue(), ctx.Event()
    pub = ctx.Process(target=_publisher, args=(addr, size_mb, ready, stop))
    pub.start()
    seg = ready.get(timeout=120)
    times, gbps, xfer = [], [], []
    try:
        for i in range(repeat):
            q, start = ctx.Queue(), ctx.Event()
            rd = ctx.Process(target=_reader, args=(addr, f"r{i}", size_mb, None, start, q))
            rd.start()
            q.get(timeout=60)
            start.set()
            msg = q.get(timeout=300)
            rd.join(timeout=30)
            if msg[0] != "done":
                raise RuntimeError(msg)
            times.append(msg[2])
            gbps.append(msg[3]["GBps"])
            xfer.append(msg[3]["transfer_GBps"])
        # raw engine READ of the same bytes (no refhub): the line rate of this host
        from tent_core import Engine

        eng = Engine()
        total = sum(t.nbytes for t in _tensors(size_mb)[:4])
        dst = eng.allocate(total)
        raw = []
        for _ in range(repeat):
            t0 = time.monotonic()
            # the same number of bytes from the publisher's segment (progress word, pack, large tensors)
            eng.read(dst, seg, total, remote_offset=0, timeout=60)
            raw.append(total / (time.monotonic() - t0) / 1e9)
        eng.close()
    finally:
        stop.set()
        pub.join(timeout=30)
    return {
        "bench": "dataplane",
        "size_MB": size_mb,
        "replicate_s_median": round(statistics.median(times), 4),
        "replicate_GBps_median": round(statistics.median(gbps), 3),
        "transfer_only_GBps_median": round(statistics.median(xfer), 3),
        "raw_tent_read_GBps_median": round(statistics.median(raw), 3),
        "efficiency": round(statistics.median(gbps) / statistics.median(raw), 3),
        "transfer_efficiency": round(statistics.median(xfer) / statistics.median(raw), 3),
        "repeat": repeat,
        "note": "loopback, one host; trend only",
    }


def _burst_once(k: int, size_mb: float, cap_MBps: float, pipeline: bool) -> dict:
    ctx = mp.get_context("spawn")
    addr = _server(pipeline)
    ready, stop = ctx.Queue(), ctx.Event()
    pub = ctx.Process(target=_publisher, args=(addr, size_mb, ready, stop))
    pub.start()
    ready.get(timeout=120)
    q, start = ctx.Queue(), ctx.Event()
    rds = [ctx.Process(target=_reader, args=(addr, f"r{i}", size_mb, cap_MBps * 1e6, start, q)) for i in range(k)]
    for r in rds:
        r.start()
    for _ in rds:
        q.get(timeout=120)
    start.set()
    res = [q.get(timeout=600) for _ in rds]
    for r in rds:
        r.join(timeout=30)
    stop.set()
    pub.join(timeout=30)
    errs = [r for r in res if r[0] != "done"]
    if errs:
        raise RuntimeError(errs)
    stalls = [r[2] for r in res]
    return {"k": k, "total_stall_s": round(sum(stalls), 3), "makespan_s": round(max(stalls), 3),
            "partial_sources": sum(1 for r in res if r[3]["sources"][0][1])}


def burst(ks: tuple[int, ...] = (1, 2, 4), size_mb: float = 64, cap_MBps: float = 200) -> dict:
    """K readers at once, each capped (emulated NIC ingress). Sources are not capped on egress here, so
    without pipeline the trainer is limited only by this host's copy bandwidth: a trend, not the paper's curve."""
    rows = []
    for k in ks:
        rows.append({"pipeline": _burst_once(k, size_mb, cap_MBps, True), "no_pipeline": _burst_once(k, size_mb, cap_MBps, False)})
    return {"bench": "burst", "size_MB": size_mb, "reader_cap_MBps": cap_MBps, "rows": rows,
            "note": "loopback; reader-side token bucket; trend only"}


def failover(size_mb: float = 64, cap_MBps: float = 100, kill_at: float = 0.5) -> dict:
    ctx = mp.get_context("spawn")
    out = {}
    for inject in (False, True):
        addr = _server()
        ready, stop = ctx.Queue(), ctx.Event()
        pub = ctx.Process(target=_publisher, args=(addr, size_mb, ready, stop))
        pub.start()
        ready.get(timeout=120)
        qa, sa = ctx.Queue(), ctx.Event()
        a = ctx.Process(target=_reader, args=(addr, "A", size_mb, cap_MBps * 1e6, sa, qa))
        qb, sb = ctx.Queue(), ctx.Event()
        b = ctx.Process(target=_reader, args=(addr, "B", size_mb, None, sb, qb))
        a.start()
        b.start()
        qa.get(timeout=60)
        qb.get(timeout=60)
        sa.set()
        time.sleep(0.1)
        sb.set()
        expected = size_mb * MB / (cap_MBps * 1e6)
        if inject:
            time.sleep(expected * kill_at)
            os.kill(a.pid, signal.SIGKILL)
        res = qb.get(timeout=300)
        if res[0] != "done":
            raise RuntimeError(res)
        out["with_failure" if inject else "no_failure"] = {"B_seconds": round(res[2], 3), "sources": res[3]["sources"],
                                                          "reroutes": res[3]["reroutes"]}
        stop.set()
        for p in (a, b, pub):
            if p.is_alive():
                p.terminate()
            p.join(timeout=10)
    return {"bench": "failover", "size_MB": size_mb, "A_cap_MBps": cap_MBps, "kill_at_fraction": kill_at, **out}
