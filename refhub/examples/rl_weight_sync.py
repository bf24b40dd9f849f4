"""RL weight sync on refhub: trainer ranks publish each step's weights, rollout workers receive them in place.

    python refhub/examples/rl_weight_sync.py [--trainers 2] [--rollouts 2] [--steps 3] [--mb 24]

One reference server (a thread of this process, or --server), ``--trainers`` trainer processes and
``--rollouts`` rollout processes, all separate OS processes. Each step, every trainer rank "trains"
(writes new values into its model), sends its share of the weights with
``RefhubCheckpointEngine.send_weights`` as version = step, then waits until every rollout holds that
version. Each rollout preallocated its model once and receives every version into the same tensors,
then checks every tensor against the values it computes itself for that step (fresh values every step:
stale bytes cannot pass). torch tensors when torch is installed (on the GPU when one is present),
numpy arrays otherwise. Exit status 0 only if every rollout verified every step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import sys
import time
import zlib
from typing import Any

import numpy as np


def layout(mb: int) -> list[tuple[str, tuple[int, ...], str]]:
    """A small transformer-like state dict: big matrices, and many tiny tensors (biases, norms)."""
    big = max(1, mb * (1 << 20) // (4 * 4 * 1024 * 1024)) * 1024
    out = [("embed.weight", (big, 1024), "float32")]
    for i in range(4):
        out += [
            (f"layers.{i}.attn.qkv.weight", (3 * 256, 1024), "float32"),
            (f"layers.{i}.attn.qkv.bias", (3 * 256,), "float32"),
            (f"layers.{i}.mlp.up.weight", (1024, 512), "bfloat16"),
            (f"layers.{i}.norm.weight", (1024,), "float32"),
            (f"layers.{i}.step", (1,), "int64"),
        ]
    return out


def backend() -> tuple[str, str]:
    """torch when installed (REFHUB_EXAMPLE_BACKEND=numpy forces numpy), on CUDA when present."""
    if os.environ.get("REFHUB_EXAMPLE_BACKEND") == "numpy":
        return "numpy", "cpu"
    try:
        import torch
    except ImportError:
        return "numpy", "cpu"
    return "torch", "cuda" if torch.cuda.is_available() else "cpu"


def values(name: str, shape: tuple[int, ...], dtype: str, step: int) -> np.ndarray:
    """The bytes tensor `name` holds after `step`: a seeded stream, different for every (name, step)."""
    n = int(np.prod(shape)) * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    rng = np.random.default_rng(zlib.crc32(f"{name}@{step}".encode()))
    return rng.integers(0, 256, n, dtype=np.uint8)


def make(shape: tuple[int, ...], dtype: str, lib: str, device: str) -> Any:
    if lib == "numpy":
        return np.zeros(shape, np.uint16 if dtype == "bfloat16" else dtype)
    import torch

    return torch.zeros(shape, dtype=getattr(torch, dtype), device=device)


def fill(t: Any, data: np.ndarray) -> None:
    if isinstance(t, np.ndarray):
        t.reshape(-1).view(np.uint8)[:] = data
        return
    import torch

    t.view(-1).view(torch.uint8).copy_(torch.from_numpy(data))


def as_bytes(t: Any) -> np.ndarray:
    if isinstance(t, np.ndarray):
        return t.reshape(-1).view(np.uint8)
    import torch

    return t.detach().reshape(-1).view(torch.uint8).cpu().numpy()


def trainer(rank: int, world: int, rollouts: int, steps: int, mb: int, server: str, out: Any, stop: Any) -> None:
    from refhub.checkpoint import RefhubCheckpointEngine

    lib, device = backend()
    model = {n: make(s, d, lib, device) for n, s, d in layout(mb)}
    eng = RefhubCheckpointEngine(server=server, model="policy", timeout=120)
    trainer_kw, _ = RefhubCheckpointEngine.build_topology(world, rollouts, [eng.prepare()])
    eng.init_process_group(**{k: v[rank] for k, v in trainer_kw.items()})
    try:
        for step in range(1, steps + 1):
            for n, s, d in layout(mb):  # "training": every parameter changes
                fill(model[n], values(n, s, d, step))
            t0 = time.monotonic()
            v = asyncio.run(eng.send_weights(iter(model.items()), version=step))
            eng.wait_received(v, rollouts, timeout=120)
            out.put({"role": "trainer", "rank": rank, "step": step, "seconds": time.monotonic() - t0})
        stop.wait(60)  # stay a source until everyone is done
    finally:
        eng.close()


def rollout(rank: int, world: int, trainers: int, steps: int, mb: int, server: str, out: Any, stop: Any) -> None:
    from refhub.checkpoint import RefhubCheckpointEngine

    lib, device = backend()
    specs = {n: (s, d) for n, s, d in layout(mb)}
    model = {n: make(s, d, lib, device) for n, (s, d) in specs.items()}  # preallocated once
    ptrs = {n: (t.data_ptr() if lib == "torch" else t.ctypes.data) for n, t in model.items()}
    eng = RefhubCheckpointEngine(server=server, model="policy", timeout=120)
    _, rollout_kw = RefhubCheckpointEngine.build_topology(trainers, world, [eng.prepare()])
    eng.init_process_group(**{k: v[rank] for k, v in rollout_kw.items()})
    eng.register_receive_buffers(model)
    try:
        for step in range(1, steps + 1):
            t0 = time.monotonic()

            async def take(step: int = step) -> dict[str, Any]:
                return {n: t async for n, t in eng.receive_weights(version=step)}

            got = asyncio.run(take())
            dt = time.monotonic() - t0
            bad = [n for n, (s, d) in specs.items() if not np.array_equal(as_bytes(got[n]), values(n, s, d, step))]
            moved = [n for n, t in got.items() if (t.data_ptr() if lib == "torch" else t.ctypes.data) != ptrs[n]]
            out.put({"role": "rollout", "rank": rank, "step": step, "seconds": dt, "bad": bad, "moved": moved,
                     "bytes": sum(int(as_bytes(t).nbytes) for t in got.values())})
        stop.wait(60)
    finally:
        eng.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--rollouts", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--mb", type=int, default=24, help="approximate model size in MiB")
    ap.add_argument("--server", default=None, help="a running refhub server (default: one in this process)")
    ap.add_argument("--timeout", type=float, default=300.0)
    a = ap.parse_args()
    server = a.server
    if server is None:
        from refhub.server import start_embedded

        server = start_embedded()
    lib, device = backend()
    print(f"refhub server {server}; tensors: {lib} on {device}; {a.trainers} trainer ranks, {a.rollouts} rollouts", flush=True)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    stop = ctx.Event()
    procs = [ctx.Process(target=trainer, args=(r, a.trainers, a.rollouts, a.steps, a.mb, server, q, stop)) for r in range(a.trainers)]
    procs += [ctx.Process(target=rollout, args=(r, a.rollouts, a.trainers, a.steps, a.mb, server, q, stop)) for r in range(a.rollouts)]
    for p in procs:
        p.start()
    expect = (a.trainers + a.rollouts) * a.steps
    results: list[dict] = []
    deadline = time.monotonic() + a.timeout
    ok = True
    try:
        while len(results) < expect:
            if time.monotonic() > deadline:
                print("timed out waiting for the workers", file=sys.stderr)
                ok = False
                break
            try:
                results.append(q.get(timeout=1))
            except Exception:
                if any(p.exitcode not in (None, 0) for p in procs):
                    print("a worker failed: " + ", ".join(f"{p.name}={p.exitcode}" for p in procs), file=sys.stderr)
                    ok = False
                    break
                continue
            r = results[-1]
            if r["role"] == "rollout":
                status = "ok" if not r["bad"] and not r["moved"] else f"MISMATCH {r['bad'][:3]} moved {r['moved'][:3]}"
                ok = ok and status == "ok"
                print(f"step {r['step']}: rollout {r['rank']} received {r['bytes'] / 1e6:.1f} MB in place in "
                      f"{r['seconds']:.3f}s, verified: {status}", flush=True)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30 if ok else 1)
            if p.is_alive():
                p.kill()
                p.join(5)
    ok = ok and all(p.exitcode == 0 for p in procs)
    rolled = [r for r in results if r["role"] == "rollout"]
    print(json.dumps({"ok": ok, "steps": a.steps, "rollout_receipts": len(rolled), "backend": f"{lib}/{device}"}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
