"""Reference-server capacity benchmark (paper §5.1.4): closed-loop publish/update/unpublish.

Thousands of clients in a few load-generator processes each keep exactly one request outstanding
against a real ZeroMQ server process. Each client is one shard handle (replicas of ``shards``
handles); its loop is publish(v) -> update() -> [replicate_done if update moved it] -> unpublish()
-> v+1. Every reply to one of those counts as one op.

Two forms:
- ``per_client`` (the paper's setting): every client owns its DEALER socket (its own TCP connection
  to the server), sends one request per frame, and heartbeats its handle every ``hb_interval`` as
  the refhub client library does; the server runs its default heartbeat timeout, so a client the
  server cannot keep up with is failed and counted.
- multiplexed (the older figure, kept as its own row): the clients of a generator share ``sockets``
  DEALER sockets and, with ``batch``, one frame carries every request a socket has ready.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import time
from typing import Any

import msgpack
import zmq
from refhub.server import client_auth

from tent_core.auth import ZmqClientAuth


def _raise_nofile() -> int:
    """Soft fd limit up to the hard one (one TCP connection per client needs an fd each)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _gen_main(addr: str, first: int, count: int, shards: int, nsock: int, batch: bool,
              start_q: Any, warm: float, duration: float, q: Any, hb_interval: float = 0.0) -> None:
    try:
        _generate(addr, first, count, shards, nsock, batch, start_q, warm, duration, q, hb_interval)
    except Exception as exc:  # the parent waits on q: tell it why at once instead of letting it time out
        q.put({"error": f"{type(exc).__name__}: {exc}"})
        raise


def _generate(addr: str, first: int, count: int, shards: int, nsock: int, batch: bool,
              start_q: Any, warm: float, duration: float, q: Any, hb_interval: float) -> None:
    _raise_nofile()
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, nsock + 64)  # libzmq allows 1023 sockets per context by default
    socks = []
    auths = []
    auth = client_auth()  # the same token as the server's (REFHUB_/TENT_AUTH_TOKEN), if any
    for _ in range(nsock):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 0)
        s.setsockopt(zmq.RCVHWM, 0)
        s.connect(addr)
        ca = ZmqClientAuth(auth.key("refhub") if auth else None)
        ca.handshake(s, 10.0)
        socks.append(s)
        auths.append(ca)
    q.put({"connected": nsock})
    t_start = start_q.get(timeout=600)  # every generator connected: the common start time
    by_sock = {s: ca for s, ca in zip(socks, auths, strict=True)}
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    packb = msgpack.packb
    unpackb = msgpack.unpackb
    # client state: [sock index, handle, phase, version]
    clients: dict[int, list] = {}
    pending: dict[int, int] = {}  # rid -> client id
    outbox: list[list] = [[] for _ in socks]
    dirty: set[int] = set()
    rid = 0
    for i in range(count):
        cid = first + i
        replica, shard = divmod(cid, shards)
        si = i % nsock
        clients[cid] = [si, None, "open", 1]
        rid += 1
        pending[rid] = cid
        outbox[si].append({"op": "open", "rid": rid, "model": "bench", "replica": f"r{replica}", "shard": shard,
                           "num_shards": shards})
        dirty.add(si)
    # heartbeats (per-client form): client i beats at its own phase of the interval, on its own socket
    hb_order = list(clients) if hb_interval > 0 else []
    hb_next = 0
    hb_sent = 0
    hb_late = 0.0

    def flush() -> None:
        for si in dirty:
            box = outbox[si]
            if batch:
                socks[si].send_multipart(auths[si].wrap(packb(box)))
            else:
                for m in box:
                    socks[si].send_multipart(auths[si].wrap(packb(m)))
            box.clear()
        dirty.clear()

    while time.time() < t_start:
        time.sleep(0.001)
    flush()
    ops = 0
    measuring = False
    m_start = t_start + warm
    m_end = m_start + duration
    lat_sum = 0.0
    lat_n = 0
    errors = 0
    sent_at: dict[int, float] = {}
    hb_replies = 0
    cycled: set[int] = set()  # clients that went through a whole publish .. unpublish cycle while measuring
    hb_t0 = t_start
    # a socket of one client holds a reply or two: read one per readiness (the next poll reports the
    # rest) instead of paying for the EAGAIN that ends a drain loop; shared sockets are drained
    drain = 1 if nsock == count else 1 << 30
    while True:
        now = time.time()
        if not measuring and now >= m_start:
            measuring = True
            ops = 0
            lat_sum = 0.0
            lat_n = 0
            errors = 0
            hb_sent = hb_replies = 0
            hb_late = 0.0
            cycled.clear()
            sent_at.clear()
        if now >= m_end:
            break
        if hb_order:
            # every client whose heartbeat is due by now (count * elapsed / interval beats so far)
            due = int((now - hb_t0) / hb_interval * len(hb_order))
            if due - hb_next > len(hb_order):  # a full interval behind: the generator is the bottleneck
                hb_late = max(hb_late, (due - hb_next) / len(hb_order) * hb_interval)
            while hb_next < due:
                cid = hb_order[hb_next % len(hb_order)]
                hb_next += 1
                c = clients[cid]
                if c[1] is None:
                    continue  # not open yet
                outbox[c[0]].append({"op": "hb", "rid": 0, "hs": [c[1]]})
                dirty.add(c[0])
                hb_sent += 1
        for s, _ in poller.poll(100 if not hb_order else 5):
            for _ in range(drain):
                try:
                    data = by_sock[s].unwrap(s.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                reps = unpackb(data, strict_map_key=False)
                if type(reps) is not list:
                    reps = [reps]
                for rep in reps:
                    r = rep.get("rid")
                    if r == 0 and "unknown" in rep:  # a heartbeat's answer
                        hb_replies += 1
                        if rep["unknown"]:
                            raise RuntimeError(f"heartbeat: the server forgot handles {rep['unknown']}")
                        continue
                    cid = pending.pop(r, None)
                    if cid is None:
                        continue
                    ops += 1
                    t0 = sent_at.pop(r, None)
                    if t0 is not None:
                        lat_sum += now - t0
                        lat_n += 1
                    c = clients[cid]
                    phase = c[2]
                    if not rep.get("ok", False):
                        errors += 1
                        if phase != "unpublish":
                            raise RuntimeError(f"bench client {cid} {phase}: {rep}")
                    if phase == "open":
                        c[1] = rep["h"]
                        nxt = {"op": "publish", "h": c[1], "version": c[3]}
                        c[2] = "publish"
                    elif phase == "publish":
                        nxt = {"op": "update", "h": c[1]}
                        c[2] = "update"
                    elif phase == "update":
                        if "src" in rep:
                            nxt = {"op": "replicate_done", "h": c[1], "ok": True}
                            c[2] = "done"
                            c[3] = max(c[3], rep["version"])
                        else:
                            nxt = {"op": "unpublish", "h": c[1]}
                            c[2] = "unpublish"
                    elif phase == "done":
                        nxt = {"op": "unpublish", "h": c[1]}
                        c[2] = "unpublish"
                    else:
                        c[3] += 1
                        nxt = {"op": "publish", "h": c[1], "version": c[3]}
                        c[2] = "publish"
                        if measuring:
                            cycled.add(cid)
                    rid += 1
                    nxt["rid"] = rid
                    pending[rid] = cid
                    if rid % 64 == 0:
                        sent_at[rid] = now
                    outbox[c[0]].append(nxt)
                    dirty.add(c[0])
        flush()
    q.put({"ops": ops, "lat_sum": lat_sum, "lat_n": lat_n or 1, "errors": errors, "hb_sent": hb_sent,
           "hb_replies": hb_replies, "hb_late_s": hb_late, "sockets": nsock, "cycled": len(cycled)})
    ctx.destroy(0)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def run(clients: int = 4096, procs: int = 2, sockets: int = 4, shards: int = 1, duration: float = 5.0,
        warm: float = 2.0, batch: bool = True, per_client: bool = False, hb_interval: float = 0.5,
        hb_timeout: float = 5.0) -> dict:
    """One closed-loop run against a fresh server process. `per_client`: one socket per client, one
    request per frame, heartbeats every `hb_interval` and the server failing handles silent for
    `hb_timeout` (then `sockets` and `batch` do not apply)."""
    from refhub.client import query

    if per_client:
        batch = False
    else:
        hb_interval, hb_timeout = 0.0, 600.0  # the multiplexed form sends no heartbeats
    env = dict(os.environ)
    server = subprocess.Popen(
        [sys.executable, "-m", "refhub.cli", "serve", "--bind", "tcp://127.0.0.1:0", "--hb-timeout", str(hb_timeout)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, preexec_fn=_raise_nofile,
    )
    ps: list = []
    try:
        line = server.stdout.readline()
        addr = line.split("listening on ")[1].split()[0]
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        per = clients // procs
        # keep replicas whole inside one generator
        per -= per % shards
        starts = []
        t_conn = time.monotonic()
        for p in range(procs):
            n = per if p < procs - 1 else clients - per * (procs - 1)
            sq = ctx.Queue()
            pr = ctx.Process(target=_gen_main, args=(addr, p * per, n, shards, n if per_client else sockets, batch, sq,
                                                     warm, duration, q, hb_interval))
            pr.start()
            ps.append(pr)
            starts.append(sq)
        for _ in ps:
            got = q.get(timeout=600)
            if "connected" not in got:
                raise RuntimeError(f"generator: {got}")
        connect_s = time.monotonic() - t_conn
        t_start = time.time() + 0.5
        for sq in starts:
            sq.put(t_start)
        time.sleep(max(0.0, t_start + warm - time.time()))
        cpu0 = _cpu(server.pid)
        results = [q.get(timeout=duration + warm + 120) for _ in ps]
        failed = [r["error"] for r in results if "error" in r]
        if failed:
            raise RuntimeError(f"generator: {failed}")
        cpu1 = _cpu(server.pid)
        for pr in ps:
            pr.join(timeout=10)
        st = query(addr, {"op": "stats"}, timeout=10)
        ops = sum(r["ops"] for r in results)
        lat = sum(r["lat_sum"] for r in results) / max(1, sum(r["lat_n"] for r in results))
        out = {
            "bench": "server",
            "form": "one socket per client, one request per frame, heartbeats" if per_client else
                    ("multiplexed sockets, batched frames" if batch else "multiplexed sockets, one request per frame"),
            "clients": clients,
            "client_sockets": sum(r["sockets"] for r in results),
            "shards_per_replica": shards,
            "generator_procs": procs,
            "batched_frames": batch,
            "duration_s": duration,
            "connect_s": round(connect_s, 2),
            "ops": ops,
            "error_replies": sum(r["errors"] for r in results),
            "clients_cycled": sum(r["cycled"] for r in results),
            "ops_per_s": round(ops / duration, 1),
            "mean_latency_ms": round(lat * 1000, 2),
            "server_cpu_util": round((cpu1 - cpu0) / duration, 2),
            "server_failed_replicas": st.get("failures"),
            "cpus": os.cpu_count(),
        }
        if per_client:
            out |= {"hb_interval_s": hb_interval, "hb_timeout_s": hb_timeout,
                    "hb_per_s": round(sum(r["hb_sent"] for r in results) / duration, 1),
                    "hb_replies": sum(r["hb_replies"] for r in results),
                    "generator_hb_lag_s": round(max(r["hb_late_s"] for r in results), 3)}
        else:
            out["sockets_per_proc"] = sockets
        return out
    finally:
        for pr in ps:
            if pr.is_alive():
                pr.terminate()
                pr.join(timeout=10)
        server.terminate()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=5)


def sweep(clients: list[int], shards: list[int], procs: int = 2, duration: float = 5.0, warm: float = 2.0,
          hb_interval: float = 0.5, rounds: int = 1, batched_clients: int | None = 4096) -> dict:
    """The paper's figure: per-client sockets with heartbeats for every (clients, shards) pair, then
    the multiplexed batched figure as its own row; `rounds` > 1 repeats the whole series (rows of one
    round interleave with the others) and reports median and spread per row."""
    from .rounds import summary

    configs = [dict(clients=c, shards=k, per_client=True, hb_interval=hb_interval) for c in clients for k in shards]
    if batched_clients:
        configs.append(dict(clients=batched_clients, shards=1, per_client=False, batch=True))
    runs: list[list[dict]] = [[] for _ in configs]
    for _ in range(rounds):
        for i, cfg in enumerate(configs):
            try:
                runs[i].append(run(procs=procs, duration=duration, warm=warm, **cfg))
            except Exception as exc:  # noqa: BLE001 - the limit reached is a result, reported per row
                runs[i].append({"error": f"{type(exc).__name__}: {exc}"[:400], **cfg})
    rows = []
    for rs in runs:
        ok = [r for r in rs if "error" not in r]
        row = dict(ok[-1]) if ok else dict(rs[-1])
        if ok:
            row["ops_per_s"] = summary([r["ops_per_s"] for r in ok], 1)
            row["mean_latency_ms"] = summary([r["mean_latency_ms"] for r in ok], 2)
        row["errors"] = [r["error"] for r in rs if "error" in r]
        rows.append(row)
    return {"bench": "server-sweep", "rows": rows, "rounds": rounds, "cpus": os.cpu_count()}
