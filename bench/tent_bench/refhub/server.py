"""Reference-server capacity benchmark (paper §5.1.4): closed-loop publish/update/unpublish.

Thousands of simulated clients, multiplexed over a few DEALER sockets in a few load-generator
processes, each keep exactly one request outstanding against a real ZeroMQ server process. Each
client is one shard handle (replicas of ``shards`` handles); its loop is publish(v) -> update() ->
[replicate_done if update moved it] -> unpublish() -> v+1. Every reply counts as one op.
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


def _gen_main(addr: str, first: int, count: int, shards: int, nsock: int, batch: bool,
              t_start: float, warm: float, duration: float, q: Any) -> None:
    ctx = zmq.Context()
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

    def flush() -> None:
        for si, box in enumerate(outbox):
            if not box:
                continue
            if batch:
                socks[si].send_multipart(auths[si].wrap(packb(box)))
            else:
                for m in box:
                    socks[si].send_multipart(auths[si].wrap(packb(m)))
            box.clear()

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
    while True:
        now = time.time()
        if not measuring and now >= m_start:
            measuring = True
            ops = 0
            lat_sum = 0.0
            lat_n = 0
            errors = 0
            sent_at.clear()
        if now >= m_end:
            break
        for s, _ in poller.poll(100):
            while True:
                try:
                    data = by_sock[s].unwrap(s.recv_multipart(zmq.NOBLOCK))
                except zmq.Again:
                    break
                reps = unpackb(data, strict_map_key=False)
                if type(reps) is not list:
                    reps = [reps]
                for rep in reps:
                    r = rep.get("rid")
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
                    rid += 1
                    nxt["rid"] = rid
                    pending[rid] = cid
                    if rid % 64 == 0:
                        sent_at[rid] = now
                    outbox[c[0]].append(nxt)
        flush()
    q.put({"ops": ops, "lat_sum": lat_sum, "lat_n": lat_n or 1, "errors": errors})
    ctx.destroy(0)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def run(clients: int = 4096, procs: int = 2, sockets: int = 4, shards: int = 1, duration: float = 5.0,
        warm: float = 2.0, batch: bool = True) -> dict:
    env = dict(os.environ)
    server = subprocess.Popen(
        [sys.executable, "-m", "refhub.cli", "serve", "--bind", "tcp://127.0.0.1:0", "--hb-timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    try:
        line = server.stdout.readline()
        addr = line.split("listening on ")[1].split()[0]
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        per = clients // procs
        # keep replicas whole inside one generator
        per -= per % shards
        t_start = time.time() + 1.0
        ps = []
        for p in range(procs):
            n = per if p < procs - 1 else clients - per * (procs - 1)
            pr = ctx.Process(target=_gen_main, args=(addr, p * per, n, shards, sockets, batch, t_start, warm, duration, q))
            pr.start()
            ps.append(pr)
        time.sleep(max(0.0, t_start + warm - time.time()))
        cpu0 = _cpu(server.pid)
        results = [q.get(timeout=duration + warm + 60) for _ in ps]
        cpu1 = _cpu(server.pid)
        for pr in ps:
            pr.join(timeout=10)
        ops = sum(r["ops"] for r in results)
        lat = sum(r["lat_sum"] for r in results) / max(1, sum(r["lat_n"] for r in results))
        return {
            "bench": "server",
            "clients": clients,
            "shards_per_replica": shards,
            "generator_procs": procs,
            "sockets_per_proc": sockets,
            "batched_frames": batch,
            "duration_s": duration,
            "ops": ops,
            "error_replies": sum(r["errors"] for r in results),
            "ops_per_s": round(ops / duration, 1),
            "mean_latency_ms": round(lat * 1000, 2),
            "server_cpu_util": round((cpu1 - cpu0) / duration, 2),
            "cpus": os.cpu_count(),
        }
    finally:
        server.terminate()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
