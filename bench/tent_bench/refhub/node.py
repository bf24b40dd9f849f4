"""One benchmark "node" process, run inside a fabric namespace (or on loopback) by tent_bench.refhub.net.

``python -m tent_bench.refhub.node ROLE --spec JSON`` prints ``{"event": "ready", ...}`` once set up,
then obeys JSON lines on stdin and answers each with one JSON line:

* ``publisher``: a refhub handle holding the benchmark tensors, published as version 1.
* ``receiver``: a refhub handle with zeroed tensors; ``{"cmd": "replicate"}`` pulls version 1 (timed,
  verified), ``{"cmd": "drop"}`` unpublishes again so the next round starts from the publisher.
* ``gloo``: one rank of a torch.distributed gloo world (rank 0 = publisher);
  ``{"cmd": "bcast", "n": N}`` broadcasts the tensors from rank 0 to ranks 1..N (timed, verified).
* ``ray``: the Ray driver (in the publisher's node): ``{"cmd": "ray", "n": N}`` puts the tensors and
  has the actors on N receiver nodes get them at once (timed, verified).

Every data check compares xxh3/adler32 checksums of every tensor with the publisher's.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any

import numpy as np


def emit(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def tensors(sizes: list[int], seed: int | None) -> list[np.ndarray]:
    if seed is None:
        return [np.ones(n, dtype=np.uint8) for n in sizes]  # pre-faulted receive buffers
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 255, n, dtype=np.uint8) for n in sizes]


def expected_checksums(sizes: list[int], seed: int) -> list[int]:
    from refhub.client import checksum

    return [checksum(t) for t in tensors(sizes, seed)]


def _engine(spec: dict) -> Any:
    from tent_core import Engine

    if spec.get("host"):
        # both ends share one kernel: only TCP crosses the shaped links (shm would bypass them)
        return Engine(host=spec["host"], transports=["tcp"])
    return Engine()


def _await_receiving(querier: Any, timeout: float) -> None:
    """Until the server reports a shard of the benchmark model being received (or TimeoutError)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listing = querier.call({"op": "list", "model": "burst"})
        if any(v.get("receiving_shards", 0) > 0 for v in listing.get("versions", {}).values()):
            return
        time.sleep(0.005)
    raise TimeoutError(f"no replica started receiving within {timeout:.0f}s")


def run_refhub(role: str, spec: dict) -> None:
    from refhub import client

    eng = _engine(spec)
    h = client.open("burst", replica=spec["name"], server=spec["server"], engine=eng, hb_interval=0.2,
                    request_timeout=120.0)
    ts = tensors(spec["sizes"], spec["seed"] if role == "publisher" else None)
    for i, t in enumerate(ts):
        h.register(f"w{i:04d}", t)
    if role == "publisher":
        h.publish(1)
    # polls the server while waiting for a partial copy: connected (and authenticated) before "ready"
    querier = client.Querier(spec["server"]) if role == "receiver" else None
    emit({"event": "ready", "engine": eng.engine_id})
    expect = expected_checksums(spec["sizes"], spec["seed"]) if role == "receiver" else None
    for line in sys.stdin:
        msg = json.loads(line)
        cmd = msg.get("cmd")
        if cmd == "exit":
            break
        try:
            if cmd == "replicate":
                if msg.get("once_receiving"):  # start on a partial copy: wait until some replica receives
                    _await_receiving(querier, float(msg.get("timeout", 60)))
                    time.sleep(float(msg.get("lead", 0)))
                    emit({"event": "started"})
                # the process's CPU and involuntary context switches during the pull: what grows with N
                # on a shared host (pipeline_ab reports them per depth along the chain)
                ru0, cpu0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
                t0 = time.monotonic()
                v = h.replicate(1, timeout=600)
                dt = time.monotonic() - t0
                ru1, cpu1 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
                from refhub.client import checksum

                ok = [checksum(t) for t in ts] == expect
                emit({"ok": True, "v": v, "secs": dt, "data_ok": ok, "sources": h.stats.get("sources"),
                      "starved_s": h.stats.get("starved_s"), "batches": h.stats.get("batches"),
                      "first_s": h.stats.get("first_s"), "pull_s": h.stats.get("seconds"),
                      "request_delay_s": h.stats.get("request_delay_s"), "probes": h.stats.get("probes"),
                      "caught_up_s": h.stats.get("caught_up_s"), "window_full_s": h.stats.get("window_full_s"),
                      "wait_read": h.stats.get("wait_read"),
                      "rail_errors": sum(r["errors"] for r in eng.rail_stats()),
                      "routed_s": h.stats.get("routed_s"), "submit_s": h.stats.get("submit_s"), "marks_s": h.stats.get("marks_s"),
                      "cpu_s": round(cpu1 - cpu0, 4), "nivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw,
                      # the replicate's own start and end (the checksums above are not part of it); the
                      # namespaces share one monotonic clock
                      "t_start": t0, "t_end": t0 + dt})
            elif cmd == "drop":
                h.unpublish()
                from .rounds import junk_fill

                junk_fill(ts, int(msg.get("junk", 1)))  # the next round's copy cannot verify on these bytes
                emit({"ok": True})
            else:
                emit({"ok": False, "error": f"unknown command {cmd}"})
        except Exception as exc:  # reported to the driver
            emit({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    if querier is not None:
        querier.close()
    h.close()
    eng.close()


GLOO_CHUNK = 4 << 20  # chain form: bytes per send/recv piece (pieces of one tensor pipeline along the chain)
GLOO_FORMS = ("chain", "async")


def run_gloo(spec: dict) -> None:
    """One gloo rank. ``{"cmd": "bcast", "n": N, "form": F}`` moves every tensor from rank 0 to ranks
    1..N in one of gloo's two best forms:

    * ``async``: one broadcast per tensor, all issued as async ops at once, then waited (gloo overlaps
      them; the root still sends every byte to every receiver over its own uplink);
    * ``chain``: a pipelined send/recv chain 0 -> 1 -> ... -> N in GLOO_CHUNK pieces, every rank
      posts all its receives up front and forwards each piece as soon as it lands (each link carries
      the bytes once, as refhub's pipeline replication does)."""
    import datetime
    import os

    import torch
    import torch.distributed as dist
    from refhub.client import checksum

    if spec.get("ifname"):
        os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]
    rank, world = spec["rank"], spec["world"]
    dist.init_process_group("gloo", init_method=spec["init"], rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    arrs = tensors(spec["sizes"], spec["seed"] if rank == 0 else None)
    ts = [torch.from_numpy(a) for a in arrs]
    pieces = [t[i:i + GLOO_CHUNK] for t in ts for i in range(0, t.numel(), GLOO_CHUNK)]
    expect = expected_checksums(spec["sizes"], spec["seed"]) if rank else None
    groups = {n: dist.new_group(ranks=list(range(n + 1))) for n in range(1, world)}
    emit({"event": "ready", "rank": rank})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "exit":
            break
        n = msg["n"]
        form = msg.get("form", "chain")
        if rank > n:
            emit({"ok": True, "skipped": True})
            continue
        g = groups[n]
        if rank:  # the previous round's bytes must not verify this one (as refhub's receivers: junk_fill)
            from .rounds import junk_fill

            junk_fill(arrs, int(msg.get("junk", 1)))  # in place: the torch tensors share these arrays
        dist.barrier(group=g)
        t0 = time.monotonic()
        if form == "async":
            works = [dist.broadcast(t, src=0, group=g, async_op=True) for t in ts]
            for w in works:
                w.wait()
        elif form == "chain":
            if rank == 0:
                works = [dist.isend(p, dst=1, tag=k) for k, p in enumerate(pieces)]
            else:
                recvs = [dist.irecv(p, src=rank - 1, tag=k) for k, p in enumerate(pieces)]
                works = []
                for k, (p, r) in enumerate(zip(pieces, recvs, strict=True)):
                    r.wait()
                    if rank < n:
                        works.append(dist.isend(p, dst=rank + 1, tag=k))
            for w in works:
                w.wait()
        else:
            raise ValueError(f"unknown gloo form {form}")
        dt = time.monotonic() - t0
        ok = [checksum(a) for a in arrs] == expect if rank else True
        emit({"ok": True, "secs": dt, "data_ok": ok})
    dist.destroy_process_group()


def run_ray(spec: dict) -> None:
    import ray
    from refhub.client import checksum

    ray.init(address=spec["address"], logging_level="ERROR", log_to_driver=False, _temp_dir=spec.get("temp_dir"))

    @ray.remote(num_cpus=0)
    class Getter:
        def get(self, refs: list, expect: list) -> dict:
            t0 = time.monotonic()
            arrs = ray.get(refs[0])
            dt = time.monotonic() - t0
            return {"secs": dt, "data_ok": [checksum(a) for a in arrs] == expect}

    actors: list = []

    def ensure(n: int) -> None:  # actors pinned to the receiver nodes 1..n (created and warmed once)
        end = time.monotonic() + 120
        while len(actors) < n:
            j = len(actors) + 1
            while f"rnode{j}" not in ray.cluster_resources():
                if time.monotonic() > end:
                    raise TimeoutError(f"ray node rnode{j} missing after 120s")
                time.sleep(0.2)
            a = Getter.options(resources={f"rnode{j}": 0.01}).remote()
            z = np.zeros(8, np.uint8)
            ray.get(a.get.remote([ray.put([z])], [checksum(z)]))
            actors.append(a)

    expect = expected_checksums(spec["sizes"], spec["seed"])
    arrs = tensors(spec["sizes"], spec["seed"])
    emit({"event": "ready"})
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("cmd") == "exit":
            break
        n = msg["n"]
        ensure(n)
        t0 = time.monotonic()
        ref = ray.put(arrs)
        put_s = time.monotonic() - t0
        res = ray.get([a.get.remote([ref], expect) for a in actors[:n]])
        del ref
        emit({"ok": True, "put_s": put_s, "rows": res})
    ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["publisher", "receiver", "gloo", "ray"])
    ap.add_argument("--spec", required=True)
    a = ap.parse_args()
    spec = json.loads(a.spec)
    if a.role in ("publisher", "receiver"):
        run_refhub(a.role, spec)
    elif a.role == "gloo":
        run_gloo(spec)
    else:
        run_ray(spec)


if __name__ == "__main__":
    main()
