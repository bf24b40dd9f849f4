"""Burst and failure-masking benchmarks over real shaped links (paper §5.1.2, §5.1.3).

As root, every "node" is a network namespace of a `tent_bench.testbed.Fabric` star: node 0 is the
switch (it forwards between the others and runs the reference server), node 1 the publisher, nodes
2.. the receivers. Each node's single link to the switch is shaped in both directions (TBF, `rate`),
so, as on a real cluster, the publisher's uplink carries everything that is read from it and each
receiver's downlink bounds what it can receive. Engines use the TCP transport only (namespaces share
one kernel; the same-host shm transport would bypass the links). Without root, everything runs on
loopback (unshaped) and the result says so: then the numbers show nothing about scaling.

burst: for N = 1..max, N receivers call replicate at once; total stall time (the sum of the
receivers' replicate times), refhub with and without pipeline replication, against a torch.distributed
gloo broadcast of the same tensors and the Ray object store (put, then N gets at once), same run,
same links. failover: publisher -> A -> B, A SIGKILLed part way; B's time with and without it.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

MB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nodes:
    """Benchmark nodes: namespaces of a shaped star Fabric (root) or plain loopback processes."""

    def __init__(self, count: int, rate: str, force_loopback: bool = False) -> None:
        self.count = count
        self.rate = rate
        self.fabric = None
        self.note = ""
        self.procs: list[subprocess.Popen] = []
        self.logdir = tempfile.mkdtemp(prefix="refhub-bench-")
        if not force_loopback:
            from tent_bench.testbed import Fabric

            ok, why = Fabric.available()
            if ok:
                self.fabric = Fabric(nodes=count, rails=1, rate=rate).up_all()
                try:
                    self._route()
                except BaseException:
                    self.fabric.close()
                    raise
            else:
                self.note = f"no network namespaces ({why}): loopback, unshaped; scaling numbers are not meaningful"
        else:
            self.note = "loopback requested: unshaped; scaling numbers are not meaningful"

    def _route(self) -> None:
        fab = self.fabric
        fab.run(0, ["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        for j in range(1, self.count):
            gw = fab.link(0, peer=j).addr0
            fab.run(j, ["ip", "route", "add", "198.18.0.0/15", "via", gw])

    @property
    def shaped(self) -> bool:
        return self.fabric is not None

    def ip(self, j: int) -> str:
        if self.fabric is None:
            return "127.0.0.1"
        return self.fabric.link(0, peer=max(1, j)).addr0 if j == 0 else self.fabric.addrs(j)[0]

    def ifname(self, j: int) -> str | None:
        if self.fabric is None or j == 0:
            return None
        return self.fabric.link(0, peer=j).if1

    def popen(self, j: int, argv: list[str], name: str, **kw: Any) -> subprocess.Popen:
        err = open(os.path.join(self.logdir, f"{name}.log"), "w")  # noqa: SIM115 - closed with the process
        kw.setdefault("stdin", subprocess.PIPE)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("text", True)
        kw.setdefault("cwd", self.logdir)  # never import the source tree's refhub/ folder as a namespace package
        kw.setdefault("stderr", err)
        if self.fabric is not None:
            p = self.fabric.popen(j, argv, **kw)
        else:
            p = subprocess.Popen(argv, **kw)
        p._log = err  # type: ignore[attr-defined]
        self.procs.append(p)
        return p

    def stop(self, p: subprocess.Popen, sig: int = signal.SIGTERM, wait: float = 10.0) -> None:
        if p.poll() is None:
            try:
                p.send_signal(sig)
                p.wait(timeout=wait)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                p.kill()
                p.wait(timeout=10)
        log = getattr(p, "_log", None)
        if log is not None:
            log.close()

    def close(self) -> None:
        for p in reversed(self.procs):
            self.stop(p)
        self.procs.clear()
        if self.fabric is not None:
            self.fabric.close()
        shutil.rmtree(self.logdir, ignore_errors=True)

    def tail(self, name: str, n: int = 600) -> str:
        try:
            with open(os.path.join(self.logdir, f"{name}.log")) as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(p: subprocess.Popen, timeout: float, what: str) -> dict:
    end = time.monotonic() + timeout
    while True:
        left = end - time.monotonic()
        r, _, _ = select.select([p.stdout], [], [], max(0.0, left))
        if not r:
            raise TimeoutError(f"{what}: no answer within {timeout:.0f}s")
        line = p.stdout.readline()
        if not line:
            raise RuntimeError(f"{what}: process exited ({p.poll()})")
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)


def _send(p: subprocess.Popen, msg: dict) -> None:
    p.stdin.write(json.dumps(msg) + "\n")
    p.stdin.flush()


def _node(nodes: Nodes, j: int, role: str, spec: dict, name: str) -> subprocess.Popen:
    return nodes.popen(j, [sys.executable, "-m", "tent_bench.refhub.node", role, "--spec", json.dumps(spec)], name)


def _server(nodes: Nodes, pipeline: bool, name: str) -> tuple[subprocess.Popen, str]:
    port = _free_port() if not nodes.shaped else 5555 + (0 if pipeline else 1)
    bind = f"tcp://{nodes.ip(0)}:{port}"
    argv = [sys.executable, "-m", "refhub.cli", "serve", "--bind", bind, "--hb-timeout", "3"]
    if not pipeline:
        argv.append("--no-pipeline")
    p = nodes.popen(0, argv, name, stdin=subprocess.DEVNULL)
    line = _read_plain(p, 60, name)
    if "listening" not in line:
        raise RuntimeError(f"{name}: {line} {nodes.tail(name)}")
    return p, bind


def _read_plain(p: subprocess.Popen, timeout: float, what: str) -> str:
    r, _, _ = select.select([p.stdout], [], [], timeout)
    if not r:
        raise TimeoutError(f"{what}: not up within {timeout:.0f}s")
    return p.stdout.readline()


def _sizes(size_mb: float, tensors: int) -> list[int]:
    from .data import shard_sizes

    return shard_sizes(size_mb, tensors)


def _refhub_rounds(nodes: Nodes, ns: list[int], sizes: list[int], pipeline: bool) -> dict[int, dict]:
    tag = "pipe" if pipeline else "nopipe"
    srv, addr = _server(nodes, pipeline, f"server-{tag}")
    nmax = max(ns)
    base = {"server": addr, "sizes": sizes, "seed": 7}
    pub = _node(nodes, 1, "publisher", {**base, "name": "publisher", "host": nodes.ip(1) if nodes.shaped else None},
                f"publisher-{tag}")
    _read(pub, 120, "publisher")
    rcv = []
    for i in range(nmax):
        j = 2 + i
        rcv.append(_node(nodes, j, "receiver", {**base, "name": f"rollout{i}", "host": nodes.ip(j) if nodes.shaped else None},
                         f"rollout{i}-{tag}"))
    for i, p in enumerate(rcv):
        _read(p, 120, f"rollout{i}")
    out: dict[int, dict] = {}
    try:
        for n in ns:
            for p in rcv[:n]:
                _send(p, {"cmd": "replicate"})
            res = [_read(p, 900, f"rollout{i} replicate") for i, p in enumerate(rcv[:n])]
            bad = [r for r in res if not r.get("ok") or not r.get("data_ok")]
            if bad:
                raise RuntimeError(f"{tag} n={n}: {bad}")
            secs = [r["secs"] for r in res]
            out[n] = {"total_s": sum(secs), "mean_s": statistics.mean(secs), "max_s": max(secs),
                      "from_publisher": sum(1 for r in res if r["sources"][0][0] == "publisher")}
            for p in rcv[:n]:
                _send(p, {"cmd": "drop"})
            for i, p in enumerate(rcv[:n]):
                _read(p, 60, f"rollout{i} drop")
    finally:
        for p in [*rcv, pub]:
            try:
                _send(p, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
        for p in [*rcv, pub, srv]:
            nodes.stop(p)
    return out


def _gloo_rounds(nodes: Nodes, ns: list[int], sizes: list[int]) -> dict[int, dict]:
    nmax = max(ns)
    port = _free_port()
    init = f"tcp://{nodes.ip(1)}:{port}"
    ranks = []
    for r in range(nmax + 1):
        j = 1 + r
        ranks.append(_node(nodes, j, "gloo", {"rank": r, "world": nmax + 1, "init": init, "sizes": sizes, "seed": 7,
                                              "ifname": nodes.ifname(j) if nodes.shaped else "lo"}, f"gloo{r}"))
    out: dict[int, dict] = {}
    try:
        for r, p in enumerate(ranks):
            _read(p, 300, f"gloo rank {r}")
        for n in ns:
            for p in ranks:
                _send(p, {"cmd": "bcast", "n": n})
            res = [_read(p, 900, f"gloo rank {r}") for r, p in enumerate(ranks)]
            rows = [x for x in res[1:n + 1]]
            if not all(x.get("ok") and x.get("data_ok") for x in rows):
                raise RuntimeError(f"gloo n={n}: {rows}")
            secs = [x["secs"] for x in rows]
            out[n] = {"total_s": sum(secs), "mean_s": statistics.mean(secs), "max_s": max(secs)}
    finally:
        for p in ranks:
            try:
                _send(p, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
        for p in ranks:
            nodes.stop(p)
    return out


def _ray_rounds(nodes: Nodes, ns: list[int], sizes: list[int], store_mb: int) -> tuple[dict[int, dict], str | None]:
    """Ray object store: a head node in the publisher's namespace, one Ray node per receiver namespace
    (started one at a time, each with its own temp dir), a driver that puts the tensors and actors
    pinned to the receiver nodes that get them at once. Returns the rows it managed and, if it had
    to stop early, why."""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    nmax = max(ns)
    port = _free_port()
    head = f"{nodes.ip(1)}:{port}"
    common = ["--block", "--num-cpus", "1", "--object-store-memory", str(store_mb * MB), "--disable-usage-stats"]
    tmp = tempfile.mkdtemp(prefix="rhray", dir="/tmp")  # one temp dir per node: several nodes share this host
    starters = [nodes.popen(1, [ray_bin, "start", "--head", "--node-ip-address", nodes.ip(1), "--port", str(port),
                                "--temp-dir", f"{tmp}/n1", "--include-dashboard", "false",
                                "--resources", json.dumps({"pnode": 1}), *common],
                            "ray-head", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)]
    drv = None
    out: dict[int, dict] = {}

    def start_node(i: int) -> None:
        j = 2 + i
        for attempt in range(3):
            p = nodes.popen(j, [ray_bin, "start", "--address", head, "--node-ip-address", nodes.ip(j),
                                "--temp-dir", f"{tmp}/n{j}-{attempt}", "--resources", json.dumps({f"rnode{i + 1}": 1}),
                                *common], f"ray-node{j}-{attempt}", stdin=subprocess.DEVNULL)
            starters.append(p)
            end = time.monotonic() + 75
            try:
                while True:
                    line = _read_plain(p, max(0.1, end - time.monotonic()), f"ray node {j}")
                    if not line:
                        raise RuntimeError(f"ray start on node {j} exited ({p.poll()})")
                    if "Ray runtime started" in line:
                        return
            except (TimeoutError, RuntimeError):
                nodes.stop(p, wait=30)
                if attempt == 2:
                    raise

    up = 0
    try:
        _wait_port(nodes, 1, nodes.ip(1), port, 90)
        for n in ns:
            while up < n:  # one at a time: several raylets starting together on one host time out
                start_node(up)
                up += 1
            if drv is None:
                drv = _node(nodes, 1, "ray", {"address": head, "receivers": nmax, "sizes": sizes, "seed": 7,
                                              "temp_dir": f"{tmp}/n1"}, "ray-driver")
                _read(drv, 300, "ray driver")
            _send(drv, {"cmd": "ray", "n": n})
            res = _read(drv, 900, "ray round")
            if not res.get("ok") or not all(r["data_ok"] for r in res["rows"]):
                raise RuntimeError(f"ray n={n}: {res}")
            secs = [r["secs"] for r in res["rows"]]
            out[n] = {"total_s": sum(secs), "mean_s": statistics.mean(secs), "max_s": max(secs), "put_s": res["put_s"]}
        return out, None
    except Exception as exc:
        return out, f"stopped after n={max(out) if out else 0}: {type(exc).__name__}: {exc}"[:600]
    finally:
        if drv is not None:
            try:
                _send(drv, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
            nodes.stop(drv, wait=20)
        for p in reversed(starters):  # `ray start --block` stops its node's processes on SIGTERM
            nodes.stop(p, wait=30)
        shutil.rmtree(tmp, ignore_errors=True)


def _wait_port(nodes: Nodes, j: int, host: str, port: int, timeout: float) -> None:
    end = time.monotonic() + timeout
    probe = [sys.executable, "-c", f"import socket; socket.create_connection(({host!r}, {port}), timeout=1).close()"]
    while time.monotonic() < end:
        if nodes.fabric is not None:
            ok = nodes.fabric.run(j, probe, check=False).returncode == 0
        else:
            ok = subprocess.run(probe, capture_output=True).returncode == 0
        if ok:
            return
        time.sleep(0.5)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout:.0f}s")


def _peer(fn: Any, *args: Any) -> tuple[dict[int, dict] | None, str | None]:
    try:
        return fn(*args), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"[:800]


def burst(ns: list[int], size_mb: float = 128, tensors: int = 32, rate: str = "1gbit", peers: tuple[str, ...] = ("gloo", "ray"),
          force_loopback: bool = False, store_mb: int = 512) -> dict:
    sizes = _sizes(size_mb, tensors)
    nmax = max(ns)
    t0 = time.monotonic()
    with Nodes(nmax + 2, rate, force_loopback) as nodes:
        pipe = _refhub_rounds(nodes, ns, sizes, True)
        nopipe = _refhub_rounds(nodes, ns, sizes, False)
        notes = {}
        gloo = ray = None
        if "gloo" in peers:
            try:
                import torch  # noqa: F401

                gloo, err = _peer(_gloo_rounds, nodes, ns, sizes)
                if err:
                    notes["gloo"] = err + " | " + nodes.tail("gloo0", 300)
            except ImportError:
                notes["gloo"] = "torch is not installed (pip install torch): gloo not measured"
        else:
            notes["gloo"] = "not requested"
        if "ray" in peers:
            if shutil.which("ray", path=os.path.dirname(sys.executable)) is None:
                notes["ray"] = "ray is not installed (pip install ray): not measured"
            else:
                ray, err = _ray_rounds(nodes, ns, sizes, store_mb)
                if err:
                    notes["ray"] = err + " | " + nodes.tail("ray-driver", 300)
        else:
            notes["ray"] = "not requested"
        shaped, note = nodes.shaped, nodes.note
    rows = []
    for n in ns:
        row: dict[str, Any] = {"n": n, "pipeline_s": round(pipe[n]["total_s"], 3), "no_pipeline_s": round(nopipe[n]["total_s"], 3),
                               "gloo_s": round(gloo[n]["total_s"], 3) if gloo else None,
                               "ray_s": round(ray[n]["total_s"], 3) if ray and n in ray else None,
                               "pipeline_per_receiver_s": round(pipe[n]["mean_s"], 3),
                               "no_pipeline_per_receiver_s": round(nopipe[n]["mean_s"], 3),
                               "pipeline_from_publisher": pipe[n]["from_publisher"]}
        if gloo:
            row["gloo_per_receiver_s"] = round(gloo[n]["mean_s"], 3)
        if ray and n in ray:
            row["ray_per_receiver_s"] = round(ray[n]["mean_s"], 3)
            row["ray_put_s"] = round(ray[n]["put_s"], 3)
        rows.append(row)
    one = sum(sizes) / (parse_rate_Bps(rate) * 0.95) if shaped else None
    return {
        "bench": "burst", "size_MB": size_mb, "tensors": len(sizes), "bytes": sum(sizes),
        "links": f"star, 1 link per node, {rate} each way (TBF)" if shaped else "loopback",
        "ideal_one_transfer_s": round(one, 3) if one else None,
        "metric": "total stall = sum over receivers of the time from the common start to its verified copy",
        "rows": rows, "notes": notes | ({"setup": note} if note else {}),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def parse_rate_Bps(rate: str) -> float:
    from tent_bench.testbed.fabric import parse_rate

    return parse_rate(rate) / 8


def failover(size_mb: float = 64, tensors: int = 32, rate: str = "500mbit", kill_at: float = 0.5,
             force_loopback: bool = False, lead_s: float = 0.25) -> dict:
    """publisher -> A -> B over shaped links: A starts, B starts `lead_s` after the server sees A
    receiving (so it reads A's partial copy), A is SIGKILLed at `kill_at` of one transfer time after
    it began receiving; B must finish from the publisher with correct checksums. Reported: B's time
    with and without the kill. Both starts wait on events, not on fixed sleeps, so a slow machine
    shifts the timeline instead of changing the scenario."""
    sizes = _sizes(size_mb, tensors)
    out: dict[str, Any] = {}
    with Nodes(4, rate, force_loopback) as nodes:
        expected = sum(sizes) / (parse_rate_Bps(rate) * 0.95) if nodes.shaped else None
        for inject in (False, True):
            tag = "fail" if inject else "nofail"
            srv, addr = _server(nodes, True, f"server-{tag}")
            base = {"server": addr, "sizes": sizes, "seed": 7}
            procs = [srv]
            try:
                pub = _node(nodes, 1, "publisher", {**base, "name": "publisher", "host": nodes.ip(1) if nodes.shaped else None},
                            f"pub-{tag}")
                procs.append(pub)
                _read(pub, 120, "publisher")
                a = _node(nodes, 2, "receiver", {**base, "name": "A", "host": nodes.ip(2) if nodes.shaped else None}, f"A-{tag}")
                b = _node(nodes, 3, "receiver", {**base, "name": "B", "host": nodes.ip(3) if nodes.shaped else None}, f"B-{tag}")
                procs += [a, b]
                _read(a, 120, "A")
                _read(b, 120, "B")
                _send(a, {"cmd": "replicate"})
                # B starts once A is receiving: it is scheduled on A's partial copy (pipeline)
                _send(b, {"cmd": "replicate", "once_receiving": True, "lead": lead_s})
                started = _read(b, 60, "B start")
                if started.get("event") != "started":
                    raise RuntimeError(f"B did not start: {started}")
                t_a = time.monotonic() - lead_s  # about when A began receiving
                if inject:
                    time.sleep(max(0.0, t_a + (expected or 0.5) * kill_at - time.monotonic()))
                    a.send_signal(signal.SIGKILL)
                    killed_after = time.monotonic() - t_a
                res = _read(b, 600, "B")
                if not res.get("ok") or not res.get("data_ok"):
                    raise RuntimeError(f"B failed: {res}")
                row = {"B_seconds": round(res["secs"], 3), "B_sources": res["sources"], "B_data_ok": res["data_ok"],
                       "B_started_on_A": res["sources"][0] == ["A", True]}
                if inject:
                    row["A_killed_after_s"] = round(killed_after, 3)  # after A began receiving
                out["with_failure" if inject else "no_failure"] = row
            finally:
                for p in procs[1:]:
                    try:
                        _send(p, {"cmd": "exit"})
                    except (BrokenPipeError, OSError):
                        pass
                for p in reversed(procs):
                    nodes.stop(p)
        shaped, note = nodes.shaped, nodes.note
    res = {"bench": "failover", "size_MB": size_mb, "tensors": len(sizes),
           "links": f"star, 1 link per node, {rate} each way (TBF)" if shaped else "loopback",
           "kill_at_fraction": kill_at, "B_starts_after_A_s": lead_s,
           "one_transfer_s": round(expected, 3) if expected else None, **out,
           "extra_s": round(out["with_failure"]["B_seconds"] - out["no_failure"]["B_seconds"], 3)}
    if note:
        res["note"] = note
    return res
