"""`tent bench-staging`: a staged path's throughput against its slower stage, measured side by side.

A target process holds (simulated) device memory that the initiator cannot reach directly (its
device IPC is off), so transfers go through target-side staging: TCP between the initiator and
the target's staging slots, and the target's own device copy between the slots and the device
memory, pipelined chunk by chunk. Each round measures, interleaved and with the same bytes:

* ``staged``: host memory here -> device memory there (WRITE) and back (READ), through staging;
* ``wire``: the same transfer to the target's *host* memory over the same TCP transport (stage 1
  alone, the same engine settings);
* ``copy``: the target's copy between a staging-sized host buffer and the device memory, run in the
  target process by its engine over the same simdev transport (stage 2 alone);

and, with ``--both``, device memory here -> device memory there (both sides stage: three stages,
the local copy measured like the target's).

Every transfer is checked byte for byte before timing (patterns that never repeat). The result is
staged / min(wire, copy) per round; the report gives the median and the spread (min..max) over
rounds. ``--copy-ns-per-mib`` slows the simulated device copies (emulating a slower device link) so
the copy can be made the slower stage. Prints a table, or JSON with ``--json``.

By default the wire is loopback TCP, whose copies run on the same cores as the target's device
copy (the staged path then pays a third copy of every byte on cores that "the wire alone" has to
itself). ``--wire RATE`` measures over a real wire instead: the initiator and the target in two
network namespaces joined by one veth pair shaped by tc to RATE (`run_wire`; needs root).

    tent bench-staging --size 256M --rounds 7
    tent bench-staging --size 512M --rounds 5 --wire 4gbit
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import click
import numpy as np

from .cpu import cores as _cores
from .cpu import limit_shortfall, staged_cpu_bound_limit

MiB = 1 << 20


def _parse_size(text: str) -> int:
    t = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


class _Target:
    """The target process (`python -m tent_bench.staging --target`), JSON lines on stdin/stdout."""

    def __init__(self, size: int, config: dict[str, Any], host: str = "127.0.0.1",
                 argv_prefix: list[str] | None = None) -> None:
        argv = [sys.executable, "-m", "tent_bench.staging", "--target", str(size), json.dumps(config), host]
        self.proc = subprocess.Popen([*(argv_prefix or []), *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._read(120)

    def _read(self, timeout: float) -> dict[str, Any]:
        out: list[str] = []
        t = threading.Thread(target=lambda: out.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            self.proc.kill()
            raise RuntimeError("the staging target did not answer")
        return json.loads(out[0])

    def call(self, **msg: Any) -> dict[str, Any]:
        self.proc.stdin.write(json.dumps(msg) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._read(600)

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(30)
        except Exception:
            self.proc.kill()
            self.proc.wait(10)


def _target_main(size: int, config: dict[str, Any], host: str = "127.0.0.1") -> None:
    import hashlib

    from tent_core import READ, WRITE, Engine
    from tent_core.path_planner import pipeline_chunk
    from tent_core.simdev import SimArray, SimDevicePlugin

    eng = Engine(config, host=host, transports=["tcp", "simdev"], plugins=[SimDevicePlugin()])
    dev = SimArray(size)
    eng.register(dev, segment="dev")
    host_buf = eng.allocate(size, segment="host")
    cfg = eng.config
    slot = eng.allocate(cfg.target_staging_chunk_bytes, segment="bench-slot")
    print(json.dumps({"engine": eng.engine_id, "chunk": cfg.target_staging_chunk_bytes}), flush=True)
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "cpu":  # this process's CPU seconds, all threads: the CPU-bound limit's input
            print(json.dumps({"cpu_s": time.process_time()}), flush=True)
        elif msg["cmd"] == "threads":  # names of the Python threads by kernel id (staging_threads)
            ids = {str(t.native_id): t.name for t in threading.enumerate() if t.native_id is not None}
            print(json.dumps({"threads": ids}), flush=True)
        elif msg["cmd"] == "timeline":  # target staging's chunk events (staging_timeline): on, or off and read
            from tent_core import target_staging

            events = target_staging.TIMELINE or []
            target_staging.TIMELINE = [] if msg["on"] else None
            print(json.dumps({"events": events}), flush=True)
        elif msg["cmd"] == "digest":
            src = dev.download(0, msg["n"]) if msg["segment"] == "dev" else host_buf.array[: msg["n"]]
            print(json.dumps({"sha": hashlib.sha256(src.tobytes()).hexdigest()}), flush=True)
        elif msg["cmd"] == "copy":
            # stage 2 alone: the target's slot <-> device copies, chunk after chunk, as staging does them
            n, op = msg["n"], READ if msg["op"] == "READ" else WRITE
            # the chunks the staged path cuts n bytes into (the initiator's settings are the same)
            chunk = pipeline_chunk(n, cfg.target_staging_chunk_bytes, cfg.target_staging_min_chunk_bytes,
                                   cfg.target_staging_chunks)
            t0 = time.perf_counter()
            for off in range(0, n, chunk):
                ln = min(chunk, n - off)
                eng.transfer(op, slot, 0, eng.segment_name("dev"), off, ln)
            print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
    eng.close()


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(size: int, rounds: int, copy_ns_per_mib: int = 0, both: bool = False, chunk: int | None = None,
        depth: int = 4, host: str = "127.0.0.1", target_host: str = "127.0.0.1",
        target_prefix: list[str] | None = None) -> dict[str, Any]:
    """Loopback by default; `run_wire` calls it inside a fabric namespace with the target in the
    other one (`target_prefix` starts it there, both engines bound to their fabric addresses).
    `chunk`: every chunk of the staged path that long; None: the engine's own chunking (sized per
    request, `path_planner.pipeline_chunk`)."""
    import hashlib

    from tent_core import READ, WRITE, Engine
    from tent_core.simdev import SimArray, SimDevicePlugin
    from tent_core.testing import fresh_seed, pattern

    sim = {"ipc": False, "copy_ns_per_mib": copy_ns_per_mib}
    from tent_core.config import load_config
    from tent_core.path_planner import pipeline_chunk

    common: dict[str, Any] = {"target_staging_depth": depth, "target_staging_slots": max(16, 2 * depth),
                              "staging_buffers": 2 * depth}
    if chunk:
        common.update(target_staging_chunk_bytes=chunk, target_staging_min_chunk_bytes=chunk, staging_chunk_bytes=chunk)
    cfg = load_config(common)
    used_chunk = pipeline_chunk(size, cfg.target_staging_chunk_bytes, cfg.target_staging_min_chunk_bytes,
                                cfg.target_staging_chunks)
    tgt = _Target(size, {**common, "transports": {"simdev": sim}}, target_host, target_prefix)
    rows: dict[str, list[dict[str, float]]] = {}
    try:
        remote = tgt.info["engine"]
        plugins = [SimDevicePlugin()] if both else None
        names = ["tcp", "simdev"] if both else ["tcp"]
        with Engine({**common, "transports": {"simdev": sim}} if both else common, transports=names,
                    plugins=plugins, host=host) as eng:
            buf = eng.allocate(size)
            data = pattern(size, seed=fresh_seed())  # a fresh stream per run: no earlier run's bytes verify
            buf.array[:] = data
            want = hashlib.sha256(data.tobytes()).hexdigest()
            local_dev = None
            if both:
                local_dev_arr = SimArray(size)
                local_dev_arr.upload(data)
                local_dev = eng.register(local_dev_arr, segment="ldev")
            # byte checks before timing, on every path measured
            eng.transfer(WRITE, buf, 0, f"{remote}/dev", 0, size, timeout=600)
            assert tgt.call(cmd="digest", segment="dev", n=size)["sha"] == want, "staged WRITE corrupted data"
            back = eng.allocate(size)
            eng.transfer(READ, back, 0, f"{remote}/dev", 0, size, timeout=600)
            assert np.array_equal(back.array, data), "staged READ corrupted data"
            eng.transfer(WRITE, buf, 0, f"{remote}/host", 0, size, timeout=600)
            assert tgt.call(cmd="digest", segment="host", n=size)["sha"] == want, "wire WRITE corrupted data"
            if local_dev is not None:
                eng.transfer(WRITE, local_dev, 0, f"{remote}/dev", 0, size, timeout=600)
                assert tgt.call(cmd="digest", segment="dev", n=size)["sha"] == want, "both-staged WRITE corrupted data"
            paths = {"staged_write": eng.explain(op="WRITE", remote=f"{remote}/dev", length=size).chosen}

            def measure(op: str) -> dict[str, float]:
                o = WRITE if op == "WRITE" else READ
                local = buf if o == WRITE else back
                steps = {
                    "staged": lambda: eng.transfer(o, local, 0, f"{remote}/dev", 0, size, timeout=600),
                    "wire": lambda: eng.transfer(o, local, 0, f"{remote}/host", 0, size, timeout=600),
                    "copy": None,
                }
                if local_dev is not None:
                    steps["both"] = lambda: eng.transfer(o, local_dev, 0, f"{remote}/dev", 0, size, timeout=600)
                out: dict[str, float] = {}
                order = list(steps)
                k = len(rows.get(op, []))
                order = order[k % len(order):] + order[:k % len(order)]  # rotate: no path always goes first
                for name in order:
                    cpu0 = time.process_time() + tgt.call(cmd="cpu")["cpu_s"]
                    if name == "copy":
                        out["copy"] = tgt.call(cmd="copy", op=op, n=size)["seconds"]
                    else:
                        out[name] = _timed(steps[name])
                    out[f"cpu_{name}"] = time.process_time() + tgt.call(cmd="cpu")["cpu_s"] - cpu0
                return out

            for _ in range(rounds):
                for op in ("WRITE", "READ"):
                    rows.setdefault(op, []).append(measure(op))
    finally:
        tgt.close()
    report: dict[str, Any] = {"size": size, "rounds": rounds, "chunk": used_chunk, "depth": depth,
                              "copy_ns_per_mib": copy_ns_per_mib, "cores": _cores(), "paths": paths, "ops": {}}
    for op, rs in rows.items():
        gb = {k: [size / r[k] / 1e9 for r in rs] for k in rs[0] if not k.startswith("cpu_")}
        ratio = [(size / r["staged"]) / min(size / r["wire"], size / r["copy"]) for r in rs]
        entry: dict[str, Any] = {k: {"median_GBps": statistics.median(v), "min": min(v), "max": max(v)} for k, v in gb.items()}
        entry["ratio_staged_vs_slower_stage"] = {"median": statistics.median(ratio), "min": min(ratio), "max": max(ratio)}
        entry["cpu_s_per_GiB"] = {k[4:]: statistics.median(r[k] for r in rs) * (1 << 30) / size
                                  for k in rs[0] if k.startswith("cpu_")}
        limit = [staged_cpu_bound_limit(r["wire"], r["copy"], r["cpu_wire"], r["cpu_copy"], _cores()) for r in rs]
        entry["ratio_cpu_bound_limit"] = {"median": statistics.median(limit), "min": min(limit), "max": max(limit)}
        # the cores each path's two processes kept busy (CPU s / wall s), and, where the limit is below 1,
        # what the staged path lost against it: ratio = limit x shortfall["cpu"] x shortfall["cores_busy"]
        entry["cores_busy"] = {k[4:]: round(statistics.median(r[k] / r[k[4:]] for r in rs), 3)
                               for k in rs[0] if k.startswith("cpu_")}
        short = [limit_shortfall(r["staged"], r["cpu_staged"], r["cpu_wire"], r["cpu_copy"], _cores()) for r in rs]
        entry["limit_shortfall"] = {k: {"median": statistics.median(s[k] for s in short), "min": min(s[k] for s in short),
                                        "max": max(s[k] for s in short)} for k in ("cpu", "cores_busy")}
        entry["slower_stage"] = "wire" if statistics.median(gb["wire"]) <= statistics.median(gb["copy"]) else "copy"
        if "both" in gb:
            rb = [(size / r["both"]) / min(size / r["wire"], size / r["copy"]) for r in rs]
            entry["ratio_both_vs_slower_stage"] = {"median": statistics.median(rb), "min": min(rb), "max": max(rb)}
        report["ops"][op] = entry
    return report


def run_wire(size: int, rounds: int, rate: str, copy_ns_per_mib: int = 0, both: bool = False, chunk: int | None = None,
             depth: int = 4, shaper: str = "tbf", timeout_s: float = 1800.0) -> dict[str, Any]:
    """The same measurement over a real wire: the initiator in one network namespace, the target in
    another, joined by one veth pair shaped to `rate` (tc, both directions; addresses from
    198.18.0.0/15). Unlike loopback TCP, the wire's bytes then cost the two ends only their socket
    copies, not a second pair of copies on the same cores, so the staged path is compared with a
    stage that does not compete with it for CPU. Needs root; the fabric is deleted on every exit."""
    from .testbed.fabric import Fabric

    ok, why = Fabric.available()
    if not ok:
        raise RuntimeError(f"--wire needs root and ip netns: {why}")
    with Fabric(nodes=2, rails=1, rate=rate, shaper=shaper) as fab:
        args = {"size": size, "rounds": rounds, "copy_ns_per_mib": copy_ns_per_mib, "both": both, "chunk": chunk,
                "depth": depth, "host": fab.addrs(0)[0], "target_host": fab.addrs(1)[0],
                "target_prefix": fab.exec_argv(1, [])}
        report = fab.run_json(0, [sys.executable, "-m", "tent_bench.staging", "--initiator", json.dumps(args)],
                              timeout_s, "the wire benchmark")
        report["wire"] = {"rate_gbit": fab.rate(0) / 1e9, "shaper": shaper, "fabric": fab.prefix,
                          "initiator": args["host"], "target": args["target_host"]}
    return report


@click.command("bench-staging")
@click.option("--size", default="256M", show_default=True, help="Bytes per transfer (e.g. 64M, 1G).")
@click.option("--rounds", default=7, show_default=True, type=click.IntRange(1, 100), help="Interleaved rounds.")
@click.option("--chunk", default=None, help="Every staging chunk this long (e.g. 4M); default: the engine's chunking, "
              "sized per request (target_staging_chunk_bytes / _min_chunk_bytes / _chunks).")
@click.option("--depth", default=4, show_default=True, type=click.IntRange(1, 64), help="Chunks in flight per request.")
@click.option("--copy-ns-per-mib", default=0, show_default=True, type=click.IntRange(0),
              help="Extra cost of each simulated device copy per MiB (makes the copy the slower stage).")
@click.option("--both", is_flag=True, help="Also device -> device (both sides stage).")
@click.option("--wire", "wire_rate", default=None, metavar="RATE",
              help="Over a real wire: initiator and target in two network namespaces joined by a veth pair "
                   "shaped to RATE (e.g. 2gbit). Needs root.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def main(size: str, rounds: int, chunk: str | None, depth: int, copy_ns_per_mib: int, both: bool, wire_rate: str | None,
         as_json: bool) -> None:
    """A target-staged path's throughput against its slower stage (interleaved rounds, median, spread)."""
    if wire_rate:
        try:
            rep = run_wire(_parse_size(size), rounds, wire_rate, copy_ns_per_mib, both, _parse_size(chunk) if chunk else None, depth)
        except (RuntimeError, ValueError) as exc:  # no root / netns, a bad rate
            raise click.ClickException(str(exc)) from exc
    else:
        rep = run(_parse_size(size), rounds, copy_ns_per_mib, both, _parse_size(chunk) if chunk else None, depth)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    over = f"wire {rep['wire']['rate_gbit']:g} Gbit/s (netns veth, {rep['wire']['shaper']})" if "wire" in rep else "loopback"
    click.echo(f"target-staged path over {over}, {rep['size'] >> 20} MiB x {rounds} rounds, chunk {rep['chunk'] >> 20} MiB, "
               f"depth {depth}, copy +{copy_ns_per_mib} ns/MiB (path: {rep['paths']['staged_write']})")
    for op, e in rep["ops"].items():
        cols = "  ".join(f"{k} {v['median_GBps']:.2f} GB/s [{v['min']:.2f}..{v['max']:.2f}]"
                         for k, v in e.items() if isinstance(v, dict) and "median_GBps" in v)
        r = e["ratio_staged_vs_slower_stage"]
        line = f"{op:5}  {cols}  staged/{e['slower_stage']} = {r['median']:.2f} [{r['min']:.2f}..{r['max']:.2f}]"
        if "ratio_both_vs_slower_stage" in e:
            b = e["ratio_both_vs_slower_stage"]
            line += f"  both/{e['slower_stage']} = {b['median']:.2f} [{b['min']:.2f}..{b['max']:.2f}]"
        click.echo(line)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--target":
        _target_main(int(sys.argv[2]), json.loads(sys.argv[3]) if len(sys.argv) > 3 else {},
                     sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1")
    elif len(sys.argv) > 2 and sys.argv[1] == "--initiator":  # run_wire's side in the first namespace
        print(json.dumps(run(**json.loads(sys.argv[2]))), flush=True)
    else:
        main()
