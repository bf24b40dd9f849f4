"""Helpers for the Soft-RoCE testbed (scripts/rdma-vm.sh): a never-repeating byte pattern, engine
settings for emulated NICs, and the two-guest driver.

    python -m tent_rdma.testbed [--segments JSON] [--config JSON] -- CMD...

runs in both guests of `scripts/rdma-vm.sh --vms 2`: guest "b" serves a target engine, guest "a"
waits for it and runs CMD (with TENT_TWO_VM_TARGET=<engine id>). The guests share the host folder
TENT_VM_OUT: b writes b.ready, a writes a.done when CMD ended (b then exits); a can have b run
commands (perftest servers, tc changes) through job files. Every wait is bounded.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

MiB = 1 << 20
CONTROL_PORT = 7100

# Settings for Soft-RoCE under QEMU TCG, where a CPU emulates the NIC: completions take long, so
# hardware retry timers and progress timeouts are stretched (the defaults suit real NICs).
VM_ENGINE_CONFIG: dict[str, Any] = {
    # a slice fails after this long without progress: emulated CPUs on a loaded host stall for seconds
    "slice_timeout_s": 15.0,
    "request_deadline_s": 120.0,
    # emulated CPUs on a loaded host: a describe (with its auth handshake) can take seconds
    "control_timeout_s": 30.0,
    "health": {"stall_s": 3.0, "stall_cut_s": 6.0},
    "transports": {"rdma": {"qp_timeout": 16, "retry_cnt": 7, "slice_timeout_ms": 15000, "handshake_timeout_s": 30.0}},
}


def tbf_args(rate: str) -> list[str]:
    """A tc tbf qdisc shaping a rail NIC to `rate` without dropping (scripts/rdma-vm.sh shapes the
    same way at boot). RoCE expects a lossless fabric (PFC): rxe recovers a lost packet only after
    an ACK timeout, go-back-N, so a drop costs a whole timeout of silence. tbf's queue must hold what
    the NIC's QPs can have in flight; rxe caps that at 64 packets per QP (64 KiB at MTU 1024), and
    `latency 100ms` at 4 Mbit/s queued 114 KiB: two QPs overflowed it."""
    return ["tbf", "rate", rate, "burst", "64kb", "limit", "4mb"]


def pattern64(n: int, seed: int) -> np.ndarray:
    """n bytes of a pattern that never repeats: byte i is byte i % 8 of splitmix64(i // 8 ^ seed).
    splitmix64 is a bijection on 64-bit words, so no two 8-byte words of a buffer are equal and a
    byte landing at the wrong offset cannot go unnoticed."""
    words = (n + 7) // 8
    x = np.arange(words, dtype=np.uint64) ^ np.uint64(seed * 0x9E3779B97F4A7C15 % (1 << 64))
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return x.view(np.uint8)[:n].copy()
DEFAULT_SEGMENTS = [{"name": "data", "size": 32 * MiB, "seed": 1}, {"name": "sink", "size": 32 * MiB, "seed": 2}]


def serve(out: str, segments: list[dict[str, Any]], config: dict[str, Any], limit_s: float) -> int:
    from tent_core.engine import Engine

    with Engine(config, host=os.environ["TENT_VM_IP"], port=CONTROL_PORT, transports=["rdma"]) as eng:
        for s in segments:
            b = eng.allocate(int(s["size"]), segment=s["name"])
            b.array[:] = pattern64(int(s["size"]), int(s.get("seed", 0)))
        tmp = os.path.join(out, "b.ready.tmp")
        with open(tmp, "w") as f:
            json.dump({"engine_id": eng.engine_id, "segments": {s["name"]: s for s in segments}}, f)
        os.rename(tmp, os.path.join(out, "b.ready"))
        logging.info("target %s serving", eng.engine_id)
        deadline = time.monotonic() + limit_s
        while not os.path.exists(os.path.join(out, "a.done")):
            if time.monotonic() > deadline:
                logging.error("guest a never finished")
                return 1
            run_jobs(out)
            time.sleep(0.2)
    return 0


def run_jobs(out: str) -> None:
    """Commands guest a asks guest b to run (perftest servers, tc changes): job-N.json holds
    {"argv": [...], "timeout": s, "background": bool}; b answers job-N.started and job-N.result."""
    for name in sorted(os.listdir(out)):
        if not (name.startswith("job-") and name.endswith(".json")):
            continue
        base = os.path.join(out, name[: -len(".json")])
        if os.path.exists(base + ".started"):
            continue
        with open(os.path.join(out, name)) as f:
            job = json.load(f)
        argv, timeout = list(job["argv"]), float(job.get("timeout", 120))
        if job.get("background"):
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            open(base + ".started", "w").close()
            try:
                output, _ = proc.communicate(timeout=timeout)
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                proc.kill()
                output, rc = proc.communicate()[0], 124
        else:
            open(base + ".started", "w").close()
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
                output, rc = r.stdout + r.stderr, r.returncode
            except subprocess.TimeoutExpired:
                output, rc = "", 124
        tmp = base + ".result.tmp"
        with open(tmp, "w") as f:
            json.dump({"rc": rc, "output": output[-20000:]}, f)
        os.rename(tmp, base + ".result")


def remote_job(
    argv: list[str], timeout: float = 120.0, background: bool = False, wait_result: bool = True
) -> dict[str, Any] | None:
    """Guest a: have guest b run argv. background: returns once b started it (a server)."""
    out = os.environ["TENT_VM_OUT"]
    n = 0
    while os.path.exists(os.path.join(out, f"job-{n}.json")):
        n += 1
    base = os.path.join(out, f"job-{n}")
    with open(base + ".json.tmp", "w") as f:
        json.dump({"argv": argv, "timeout": timeout, "background": background}, f)
    os.rename(base + ".json.tmp", base + ".json")
    deadline = time.monotonic() + 60 + (0 if background and not wait_result else timeout)
    want = ".started" if background and not wait_result else ".result"
    while not os.path.exists(base + want):
        if time.monotonic() > deadline:
            raise TimeoutError(f"guest b did not run {argv}")
        time.sleep(0.1)
    if want == ".started":
        return None
    with open(base + ".result") as f:
        return json.load(f)


def remote_result(timeout: float) -> dict[str, Any]:
    """The result of the latest background job (bounded wait)."""
    out = os.environ["TENT_VM_OUT"]
    n = 0
    while os.path.exists(os.path.join(out, f"job-{n + 1}.json")):
        n += 1
    base = os.path.join(out, f"job-{n}")
    deadline = time.monotonic() + timeout
    while not os.path.exists(base + ".result"):
        if time.monotonic() > deadline:
            raise TimeoutError("guest b's job did not finish")
        time.sleep(0.1)
    with open(base + ".result") as f:
        return json.load(f)


def initiate(out: str, cmd: list[str], limit_s: float) -> int:
    ready = os.path.join(out, "b.ready")
    deadline = time.monotonic() + limit_s
    try:
        while not os.path.exists(ready):
            if time.monotonic() > deadline:
                print("two_vm: guest b never became ready", file=sys.stderr)
                return 1
            time.sleep(0.5)
        with open(ready) as f:
            info = json.load(f)
        env = dict(os.environ, TENT_TWO_VM_TARGET=info["engine_id"])
        left = max(60.0, deadline - time.monotonic())
        try:
            return subprocess.run(cmd, env=env, timeout=left).returncode
        except subprocess.TimeoutExpired:
            print(f"two_vm: {cmd} ran past {left:.0f}s", file=sys.stderr)
            return 124
    finally:
        with open(os.path.join(out, "a.done"), "w") as f:
            f.write("done\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--segments", default=json.dumps(DEFAULT_SEGMENTS))
    ap.add_argument("--config", default=json.dumps(VM_ENGINE_CONFIG))
    ap.add_argument("--limit", type=float, default=1500.0, help="seconds either guest waits at most")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    # only the rdma plugin is imported (and by the processes started here): under an emulated CPU
    # the other plugins' imports (CUDA bindings, cuFile) take minutes
    os.environ.setdefault("TENT_PLUGINS", "rdma")
    out = os.environ["TENT_VM_OUT"]
    role = os.environ.get("TENT_VM_ROLE")
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if role == "b":
        return serve(out, json.loads(args.segments), json.loads(args.config), args.limit)
    if role == "a":
        return initiate(out, cmd, args.limit)
    print(f"two_vm: TENT_VM_ROLE must be a or b, got {role!r}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
