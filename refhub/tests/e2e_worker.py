"""A refhub worker process driven by line commands on stdin (one JSON result line per command)."""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from refhub.client import RefhubError, ServerFailover

import refhub


def data(v: int, shard: int, nbytes: int, i: int) -> np.ndarray:
    return np.random.default_rng(v * 1000 + shard * 10 + i).integers(0, 255, nbytes, dtype=np.uint8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--backup", default=None)
    ap.add_argument("--model", default="m")
    ap.add_argument("--replica", required=True)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--num-shards", type=int, default=1)
    ap.add_argument("--size-mb", type=float, default=8)
    ap.add_argument("--retain", type=int, default=0)
    ap.add_argument("--throttle-mbps", type=float, default=0)
    ap.add_argument("--dc", default="default")
    ap.add_argument("--spot", action="store_true")
    ap.add_argument("--mode", default="direct", help="registration mode of the large tensors: direct or copy")
    ap.add_argument("--torch", action="store_true", help="register CPU torch tensors (float32 + bfloat16)")
    a = ap.parse_args()
    h = refhub.open(a.model, replica=a.replica, shard=a.shard, num_shards=a.num_shards, server=a.server,
                    backup=a.backup, retain={"keep_latest": a.retain} if a.retain else None, datacenter=a.dc,
                    spot=a.spot, hb_interval=0.2, failover_after=1.0, request_timeout=30.0,
                    throttle_Bps=a.throttle_mbps * 1e6 if a.throttle_mbps else None)
    big = int(a.size_mb * (1 << 20))
    sizes = [big // 2, big - big // 2, 1000, 4096, 70000]  # two large, three tiny (packed)
    if a.torch:
        import torch

        def alloc(n: int, i: int):  # float32 and bfloat16 tensors of n bytes (n rounded to the element size)
            dt = torch.float32 if i % 2 == 0 else torch.bfloat16
            esz = 4 if dt == torch.float32 else 2
            return torch.zeros(n // esz, dtype=dt)

        sizes = [n - n % 4 for n in sizes]

        def u8(t):
            return t.view(torch.uint8).numpy()
    else:
        def alloc(n: int, i: int):
            return np.zeros(n, dtype=np.uint8)

        def u8(t):
            return t

    tensors = [alloc(n, i) for i, n in enumerate(sizes)]

    def register_all() -> None:
        for i, t in enumerate(tensors):
            h.register(f"t{i}", t, mode=a.mode)

    register_all()

    def fill(v: int) -> None:
        for i, t in enumerate(tensors):
            u8(t)[:] = data(v, a.shard, sizes[i], i)

    def check(v: int) -> bool:
        return all((u8(t) == data(v, a.shard, sizes[i], i)).all() for i, t in enumerate(tensors))

    def retrying(fn, deadline=20.0):
        end = time.monotonic() + deadline
        while True:
            try:
                return fn()
            except (ServerFailover, TimeoutError, RefhubError) as exc:
                if time.monotonic() > end or (isinstance(exc, RefhubError) and exc.code not in ("failover", "unknown_handle")):
                    raise
                time.sleep(0.2)

    print(json.dumps({"ready": True, "h": h.hid}), flush=True)
    for line in sys.stdin:
        parts = line.split(maxsplit=1)
        if not parts:
            continue
        cmd, arg = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        t0 = time.monotonic()
        try:
            if cmd == "fill":
                fill(int(arg))
                res = {}
            elif cmd == "publish":
                ver = int(arg)
                retrying(lambda ver=ver: h.publish(ver))
                res = {}
            elif cmd == "unpublish":
                h.unpublish()
                res = {"offloads": len(h._offloads)}
            elif cmd in ("replicate", "update"):
                spec = arg or "latest"
                v = h.replicate(int(spec) if spec.isdigit() else spec, timeout=60) if cmd == "replicate" else h.update(timeout=60)
                res = {"v": v, "data_ok": check(v) if v is not None else None, "stats": h.stats}
            elif cmd == "realloc":  # the application reallocates its tensors (copy mode: no engine registration)
                tensors[:] = [alloc(n, i) for i, n in enumerate(sizes)]
                t1 = time.monotonic()
                register_all()
                res = {"register_s": round(time.monotonic() - t1, 4)}
            elif cmd == "check":
                res = {"data_ok": check(int(arg))}
            elif cmd == "wait":
                pred, _, tmo = arg.rpartition(" ")
                res = {"met": h.wait(json.loads(pred), float(tmo))}
            elif cmd == "list":
                res = {"list": h.list()}
            elif cmd == "state":
                res = {"state": h.state, "version": h.version, "h": h.hid, "server": h.conn.server,
                       "failovers": h.conn.generation}
            elif cmd == "exit":
                h.close()
                print(json.dumps({"ok": True}), flush=True)
                return
            else:
                res = {"error": f"unknown command {cmd}"}
            res["ok"] = "error" not in res
        except Exception as exc:  # report, keep serving
            res = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        res["secs"] = round(time.monotonic() - t0, 4)
        print(json.dumps(res, default=str), flush=True)


if __name__ == "__main__":
    main()
