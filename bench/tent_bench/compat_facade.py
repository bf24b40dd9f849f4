"""Mooncake-compatible facade vs TENT's native API (and, optionally, the real Mooncake).

One target process exposes a pre-faulted buffer through the facade (P2P handshake). One initiator
process drives it two ways **on the same TENT engine, connections and buffers**:

- ``facade``: Mooncake's calls (``batch_transfer_sync_read/write`` with raw addresses, or
  ``transfer_sync_read/write`` for batch 1);
- ``native``: ``Engine.submit([Request, ...]).wait()`` with segment offsets, the requests built per
  batch as an application would.

With ``--mooncake`` a second pair of processes runs the real Mooncake (``mooncake-transfer-engine``,
TCP, P2P handshake) through the same calls on the same sizes, at its best knob setting: before the
rounds, every setting of ``tent_bench.baselines.MOONCAKE_KNOBS`` (lanes per peer, slice size,
connection pool: the tcp block's sweep) runs every point twice, the settings interleaved point by
point, and the one with the best geometric mean GB/s is kept (``--no-tune``: its defaults); the JSON ends with a ``mooncake_tuning`` record. Per round every engine runs every point
(the order of engines rotates each round); a point runs for ``--duration`` seconds. The table gives the
median GB/s of the rounds, the spread (min-max) and ``facade / native`` computed per round, then the
median. Within a point and round, facade and native alternate in ``--slices`` short turns (A B B A ...),
so a change of load on a shared host affects both alike. Bytes are checked once before timing with data that never repeats (fresh random bytes).

    python -m tent_bench.compat_facade [--rounds 5] [--duration 0.5] [--mooncake] [--force-tcp] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

BUFFER = 64 << 20
DEFAULT_POINTS = [(4 << 10, 1), (64 << 10, 1), (64 << 10, 32), (1 << 20, 16), (4 << 20, 8)]
MOONCAKE_ENV = {"MC_FORCE_TCP": "1", "MC_LOG_LEVEL": "ERROR", "GLOG_minloglevel": "2", "MC_YLT_LOG_LEVEL": "error"}


# ---------------------------------------------------------------------------- worker side
def _engine_class(kind: str) -> Any:
    if kind == "mooncake":
        from mooncake.engine import TransferEngine  # the real one (this process has no shim on its path)

        if TransferEngine.__module__.startswith("tent_core"):
            raise SystemExit("--mooncake: `mooncake` resolves to TENT's shim, not the real Mooncake")
        return TransferEngine
    from tent_core.compat.mooncake import TransferEngine

    return TransferEngine


def _prefault(te: Any, addr: int, n: int) -> None:
    chunk = b"\1" * (1 << 20)
    for off in range(0, n, len(chunk)):
        te.write_bytes_to_buffer(addr + off, chunk, min(len(chunk), n - off))


def role_target(kind: str) -> None:
    te = _engine_class(kind)()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("target: initialize failed")
    addr = te.allocate_managed_buffer(BUFFER)
    _prefault(te, addr, BUFFER)
    print(json.dumps({"name": f"127.0.0.1:{te.get_rpc_port()}", "addr": addr}), flush=True)
    sys.stdin.read()


def _walk(block: int, batch: int) -> list[list[int]]:
    """Offsets of consecutive batches walking through the buffer (never the same hot lines)."""
    slots = max(1, BUFFER // block)
    out, i = [], 0
    for _ in range(max(1, slots // batch)):
        out.append([((i + j) % slots) * block for j in range(batch)])
        i += batch
    return out


def role_initiator(kind: str, target: str, raddr: int) -> None:
    te = _engine_class(kind)()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise SystemExit("initiator: initialize failed")
    laddr = te.allocate_managed_buffer(BUFFER)
    _prefault(te, laddr, BUFFER)
    native = None
    if kind == "tent":
        from tent_core import Request
        from tent_core.compat.mooncake import SEGMENT

        eng = te.engine
        lbuf = te._local.find(laddr, BUFFER)
        rbase = next(b for b in eng.peer_buffers(target) if b["segment"] == SEGMENT and b["addr"] == raddr)
        remote = f"{target}/{SEGMENT}"
        native = (eng, lbuf, rbase["offset"], remote, Request)
    _verify(te, native, target, laddr, raddr)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("quit"):
            break
        print(json.dumps(_measure(te, native, cmd, target, laddr, raddr)), flush=True)


def _verify(te: Any, native: Any, target: str, laddr: int, raddr: int) -> None:
    n = 1 << 20
    data = os.urandom(n)
    assert te.write_bytes_to_buffer(laddr, data, n) == 0
    assert te.transfer_sync_write(target, laddr, raddr + 4096, n) == 0, "verify: facade write"
    te.write_bytes_to_buffer(laddr, bytes(n), n)
    if native is not None:
        eng, lbuf, roff, remote, Request = native
        from tent_core import READ

        eng.submit([Request(READ, lbuf, laddr - lbuf.addr, remote, roff + 4096, n)]).wait()
    else:
        assert te.transfer_sync_read(target, laddr, raddr + 4096, n) == 0
    assert te.read_bytes_from_buffer(laddr, n) == data, "verify: bytes differ"


def _runner(te: Any, native: Any, api: str, op: str, block: int, batch: int, target: str, laddr: int, raddr: int) -> Any:
    lengths = [block] * batch
    if api == "native":
        from tent_core import READ, WRITE

        eng, lbuf, roff, remote, Request = native
        opc = READ if op == "READ" else WRITE
        lo = laddr - lbuf.addr

        def run(offs: list[int]) -> None:
            eng.submit([Request(opc, lbuf, lo + o, remote, roff + o, block) for o in offs]).wait()

    elif batch == 1:
        fn = te.transfer_sync_read if op == "READ" else te.transfer_sync_write

        def run(offs: list[int]) -> None:
            if fn(target, laddr + offs[0], raddr + offs[0], block) != 0:
                raise RuntimeError(f"{fn.__name__} failed")

    else:
        fn = te.batch_transfer_sync_read if op == "READ" else te.batch_transfer_sync_write

        def run(offs: list[int]) -> None:
            if fn(target, [laddr + o for o in offs], [raddr + o for o in offs], lengths) != 0:
                raise RuntimeError(f"{fn.__name__} failed")

    return run


def _measure(te: Any, native: Any, cmd: dict, target: str, laddr: int, raddr: int) -> dict:
    """Run each API of cmd["apis"] for cmd["duration"] seconds in total, alternating between them in
    cmd["slices"] short turns (A B B A A B ...), so a load change on the host hits all of them alike."""
    apis, op, block, batch = cmd["apis"], cmd["op"], cmd["block"], cmd["batch"]
    walk = _walk(block, batch)
    runs = {api: _runner(te, native, api, op, block, batch, target, laddr, raddr) for api in apis}
    for run in runs.values():
        for offs in walk[: min(len(walk), 3)]:
            run(offs)  # warm-up
    turns = max(1, int(cmd.get("slices", 1)))
    turn_s = cmd["duration"] / turns
    done = dict.fromkeys(apis, 0)
    spent = dict.fromkeys(apis, 0.0)
    pos = 0
    for k in range(turns):
        order = apis if k % 2 == 0 else apis[::-1]
        for api in order:
            run = runs[api]
            n = 0
            t0 = time.perf_counter()
            end = t0 + turn_s
            while True:
                run(walk[pos % len(walk)])
                pos += 1
                n += 1
                now = time.perf_counter()
                if now >= end:
                    break
            done[api] += n
            spent[api] += now - t0
    return {api: done[api] * batch * block / spent[api] / 1e9 for api in apis}


# ---------------------------------------------------------------------------- orchestration
class Proc:
    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "tent_bench.compat_facade", *args], env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def read(self, timeout: float = 120) -> dict:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.p.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            raise RuntimeError(f"worker {self.p.args} did not answer")
        return json.loads(out[0])

    def send(self, msg: dict) -> None:
        self.p.stdin.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
        self.p.stdin.flush()  # type: ignore[union-attr]

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.p.stdin.close()  # type: ignore[union-attr]
                self.p.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self.p.kill()
                self.p.wait(10)


def _pair(kind: str, env: dict[str, str]) -> tuple[Proc, Proc]:
    target = Proc(["--role", "target", "--kind", kind], env)
    try:
        info = target.read()
        init = Proc(["--role", "initiator", "--kind", kind, "--target", info["name"], "--addr", str(info["addr"])], env)
        try:
            init.read()
        except BaseException:
            init.close()
            raise
    except BaseException:
        target.close()
        raise
    return target, init


def tune_mooncake(base_env: dict[str, str], ops: list[str], points: list[tuple[int, int]], duration: float,
                  knobs: list[dict[str, str]], passes: int = 2) -> tuple[dict[str, str], dict[str, Any]]:  # fmt: skip
    """Mooncake's TCP knob sweep (tent_bench.baselines.MOONCAKE_KNOBS, as the tcp block's): one
    process pair per setting, all alive at once; every point runs under every setting back to back
    (the settings' order rotating per point and pass, so a change of load on a shared host hits
    them alike), `passes` times. The setting with the best geometric mean GB/s over every sample
    (baselines.knob_score) is the one the rounds use."""
    from .baselines import knob_score
    from .rounds import round_order

    settings: list[dict[str, Any]] = [{"mooncake_env": dict(env)} for env in knobs]
    pairs: dict[int, tuple[Proc, Proc]] = {}
    try:
        for k, env in enumerate(knobs):
            try:
                pairs[k] = _pair("mooncake", {**base_env, **MOONCAKE_ENV, **env})
            except (RuntimeError, OSError) as exc:  # a setting this build rejects is not the best one
                settings[k]["error"] = str(exc)
        samples: dict[int, dict[str, list[float]]] = {k: {} for k in pairs}
        n = 0
        for _ in range(passes):
            for op in ops:
                for block, batch in points:
                    for k in round_order(list(pairs), n):
                        if "error" in settings[k]:
                            continue
                        _t, i = pairs[k]
                        try:
                            i.send({"apis": ["facade"], "op": op, "block": block, "batch": batch, "duration": duration,
                                    "slices": 1})  # fmt: skip
                            got = i.read(timeout=duration * 40 + 60)["facade"]
                        except (RuntimeError, OSError, KeyError) as exc:
                            settings[k]["error"] = str(exc)
                            continue
                        samples[k].setdefault(f"{op} {block}x{batch}", []).append(round(got, 4))
                    n += 1
        for k, by_point in samples.items():
            if "error" not in settings[k] and by_point:
                settings[k]["points_gbps"] = by_point
                settings[k]["score_gbps"] = round(knob_score([g for v in by_point.values() for g in v]), 4)
            print(f"mooncake knobs {knobs[k] or 'defaults'}: {settings[k].get('score_gbps', settings[k].get('error'))}",
                  file=sys.stderr)  # fmt: skip
    finally:
        for t, i in pairs.values():
            i.close()
            t.close()
    tuning = {"kind": "mooncake_tuning", "settings": settings, "duration_s": duration, "passes": passes}
    return best_setting(settings), tuning


def best_setting(settings: list[dict[str, Any]]) -> dict[str, str]:
    """The `mooncake_env` of the entry with the highest `score_gbps` (entries that failed have none)."""
    ran = [s for s in settings if s.get("score_gbps") is not None]
    if not ran:
        raise RuntimeError("mooncake: no knob setting ran: " + "; ".join(str(s.get("error")) for s in settings))
    return dict(max(ran, key=lambda s: s["score_gbps"])["mooncake_env"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["target", "initiator"], help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="tent", help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--addr", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=0.5, help="seconds per point and API, each round")
    ap.add_argument("--slices", type=int, default=10, help="turns facade and native take within each point")
    ap.add_argument("--ops", default="READ,WRITE")
    ap.add_argument("--points", default=None, help="BLOCK:BATCH,... e.g. 65536:32,4194304:8")
    ap.add_argument("--mooncake", action="store_true", help="also the real Mooncake (make bench-deps)")
    ap.add_argument("--force-tcp", action="store_true", help="TENT restricted to TCP (MC_FORCE_TCP), as Mooncake here")
    ap.add_argument("--no-tune", action="store_true", help="--mooncake: its default knobs, no sweep")
    ap.add_argument("--tune-duration", type=float, default=0.25, help="seconds per point and knob setting in the sweep")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.role == "target":
        role_target(a.kind)
        return
    if a.role == "initiator":
        role_initiator(a.kind, a.target, a.addr)
        return
    points = DEFAULT_POINTS
    if a.points:
        points = [(int(b), int(n)) for b, n in (p.split(":") for p in a.points.split(","))]
    ops = [o.strip().upper() for o in a.ops.split(",") if o.strip()]
    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # never the shim: the real names
    tent_env = dict(base_env, **({"MC_FORCE_TCP": "1"} if a.force_tcp else {}))
    procs: list[Proc] = []
    workers: dict[str, Proc] = {}
    tuning: dict[str, Any] | None = None
    moon_env: dict[str, str] = {}
    moon_base = base_env
    if a.mooncake:
        from .baselines import MOONCAKE_KNOBS

        knob_names = {k for env in MOONCAKE_KNOBS for k in env}
        moon_base = {k: v for k, v in base_env.items() if k not in knob_names}  # the chosen setting alone decides
        if not a.no_tune:
            # Mooncake at its best on this machine, as every baseline (issue 14): its knobs swept first
            moon_env, tuning = tune_mooncake(moon_base, ops, points, a.tune_duration, MOONCAKE_KNOBS)
            tuning["chosen"] = moon_env
    try:
        t, i = _pair("tent", tent_env)
        procs += [t, i]
        workers["facade"] = workers["native"] = i
        if a.mooncake:
            t, i = _pair("mooncake", {**moon_base, **MOONCAKE_ENV, **moon_env})
            procs += [t, i]
            workers["mooncake"] = i
        # the TENT worker alternates facade and native in short turns within each point; the
        # Mooncake worker (another process pair) runs before or after it, the order rotating per round
        groups = [("tent", ["facade", "native"])] + ([("mooncake", ["facade"])] if a.mooncake else [])
        res: dict[tuple, dict[str, list[float]]] = {}
        for r in range(a.rounds):
            order = groups[r % len(groups):] + groups[: r % len(groups)]
            for op in ops:
                for block, batch in points:
                    for kind, apis in order:
                        w = workers["native" if kind == "tent" else "mooncake"]
                        w.send({"apis": apis, "op": op, "block": block, "batch": batch,
                                "duration": a.duration * len(apis), "slices": a.slices})
                        got = w.read(timeout=a.duration * 40 + 60)
                        for api, gbps in got.items():
                            name = "mooncake" if kind == "mooncake" else api
                            res.setdefault((op, block, batch), {}).setdefault(name, []).append(gbps)
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
        for w in (p for p in procs[1::2]):
            w.send({"quit": True})
    finally:
        for p in procs:
            p.close()
    rows = []
    for (op, block, batch), by in res.items():
        row: dict[str, Any] = {"op": op, "block": block, "batch": batch, "rounds": a.rounds}
        for api, vals in by.items():
            row[f"{api}_gbps"] = round(statistics.median(vals), 3)
            row[f"{api}_spread"] = [round(min(vals), 3), round(max(vals), 3)]
        ratios = [f / n for f, n in zip(by["facade"], by["native"], strict=True) if n > 0]
        row["facade_x_native"] = round(statistics.median(ratios), 3)
        row["facade_x_native_spread"] = [round(min(ratios), 3), round(max(ratios), 3)]
        if "mooncake" in by:
            mr = [f / m for f, m in zip(by["facade"], by["mooncake"], strict=True) if m > 0]
            row["facade_x_mooncake"] = round(statistics.median(mr), 3)
            row["facade_x_mooncake_spread"] = [round(min(mr), 3), round(max(mr), 3)]
            row["mooncake_env"] = moon_env
        rows.append(row)
    if a.json:
        print(json.dumps(rows + ([tuning] if tuning else []), indent=2))
        return
    if tuning:
        print(f"Mooncake knobs (best of its sweep): {moon_env or 'defaults'}")
    hdr = ["op", "block", "batch", "facade GB/s", "native GB/s", "facade/native"] + (["Mooncake GB/s", "facade/Mooncake"] if a.mooncake else [])
    print(" | ".join(hdr))
    for r in rows:
        cells = [r["op"], f"{r['block'] >> 10}K", str(r["batch"]), f"{r['facade_gbps']:.3f}", f"{r['native_gbps']:.3f}",
                 f"{r['facade_x_native']:.3f}"]
        if a.mooncake:
            cells += [f"{r['mooncake_gbps']:.3f}", f"{r['facade_x_mooncake']:.2f}"]
        print(" | ".join(cells))


if __name__ == "__main__":
    main()
