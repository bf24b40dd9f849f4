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
# The namespaces' TCP congestion control; "" keeps the host's default (each namespace starts with
# it). Only the host's allowed ones can be set in a namespace (net.ipv4.tcp_allowed_congestion_control,
# e.g. "reno bbr"); the host itself is never touched. An A/B of the testbed, for every system alike.
TCP_CC = os.environ.get("REFHUB_BENCH_TCP_CC", "")


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
        cc = os.environ.get("REFHUB_BENCH_TCP_CC", TCP_CC)  # see TCP_CC
        for j in range(1, self.count):
            gw = fab.link(0, peer=j).addr0
            fab.run(j, ["ip", "route", "add", "198.18.0.0/15", "via", gw])
            if cc:
                fab.run(j, ["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={cc}"])

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
        keep = os.environ.get("REFHUB_BENCH_KEEP_LOGS")  # a folder: the nodes' logs are copied there
        if keep:
            shutil.copytree(self.logdir, os.path.join(keep, os.path.basename(self.logdir)), dirs_exist_ok=True)
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


def _stall(res: list[dict]) -> dict:
    secs = [r["secs"] for r in res]
    return {"total_s": sum(secs), "mean_s": statistics.mean(secs), "max_s": max(secs)}


class _RefhubSystem:
    """A reference server, a publisher and `nmax` receivers (pipeline replication on or off)."""

    def __init__(self, nodes: Nodes, nmax: int, sizes: list[int], pipeline: bool) -> None:
        self.nodes, self.nmax, self.sizes, self.pipeline = nodes, nmax, sizes, pipeline
        self.name = "pipeline" if pipeline else "no_pipeline"
        self.procs: list[subprocess.Popen] = []
        self.rcv: list[subprocess.Popen] = []

    def start(self) -> None:
        nodes, tag = self.nodes, "pipe" if self.pipeline else "nopipe"
        srv, addr = _server(nodes, self.pipeline, f"server-{tag}")
        self.procs.append(srv)
        base = {"server": addr, "sizes": self.sizes, "seed": 7}
        pub = _node(nodes, 1, "publisher", {**base, "name": "publisher", "host": nodes.ip(1) if nodes.shaped else None},
                    f"publisher-{tag}")
        self.procs.append(pub)
        _read(pub, 120, "publisher")
        for i in range(self.nmax):
            j = 2 + i
            self.rcv.append(_node(nodes, j, "receiver",
                                  {**base, "name": f"rollout{i}", "host": nodes.ip(j) if nodes.shaped else None},
                                  f"rollout{i}-{tag}"))
        self.procs += self.rcv
        for i, p in enumerate(self.rcv):
            _read(p, 120, f"rollout{i}")

    def round(self, n: int, rnd: int) -> dict:
        rcv = self.rcv[:n]
        for p in rcv:
            _send(p, {"cmd": "replicate"})
        res = [_read(p, 900, f"rollout{i} replicate") for i, p in enumerate(rcv)]
        bad = [r for r in res if not r.get("ok") or not r.get("data_ok")]
        if bad:
            raise RuntimeError(f"{self.name} n={n}: {bad}")
        for p in rcv:  # unpublish, and junk over every byte before the next round
            _send(p, {"cmd": "drop", "junk": 1000 * (rnd + 1) + n})
        for i, p in enumerate(rcv):
            _read(p, 60, f"rollout{i} drop")
        # how far each receiver finished behind its first source (the nodes share one monotonic clock):
        # in a pipeline chain, what every hop adds
        ends = {f"rollout{i}": r.get("t_end") for i, r in enumerate(res)}

        def lag(r: dict) -> float | None:
            src = ends.get(r["sources"][0][0])
            return round(r["t_end"] - src, 3) if src is not None and r.get("t_end") is not None else None
        return {**_stall(res), "from_publisher": sum(1 for r in res if r["sources"][0][0] == "publisher"),
                "receivers": [{"secs": round(r["secs"], 3), "sources": r["sources"], "starved_s": r.get("starved_s"),
                               "first_s": r.get("first_s"), "lag_behind_source_s": lag(r),
                               "batches": r.get("batches"), "rail_errors": r.get("rail_errors"),
                               # waiting READs (REFHUB_WAIT_READ): used, batches, re-issues after NotReady
                               "wait_read": r.get("wait_read")} for r in res]}

    def close(self) -> None:
        for p in self.procs[1:]:
            try:
                _send(p, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            self.nodes.stop(p)


class _GlooSystem:
    """A torch.distributed gloo world: rank 0 in the publisher's node, rank r in receiver node r."""

    def __init__(self, nodes: Nodes, nmax: int, sizes: list[int], form: str) -> None:
        self.nodes, self.nmax, self.sizes, self.form = nodes, nmax, sizes, form
        self.name = f"gloo_{form}"
        self.ranks: list[subprocess.Popen] = []

    def start(self) -> None:
        nodes = self.nodes
        init = f"tcp://{nodes.ip(1)}:{_free_port()}"
        for r in range(self.nmax + 1):
            j = 1 + r
            self.ranks.append(_node(nodes, j, "gloo", {"rank": r, "world": self.nmax + 1, "init": init, "sizes": self.sizes,
                                                       "seed": 7, "ifname": nodes.ifname(j) if nodes.shaped else "lo"},
                                    f"{self.name}{r}"))
        for r, p in enumerate(self.ranks):
            _read(p, 300, f"gloo rank {r}")

    def round(self, n: int, rnd: int) -> dict:
        for p in self.ranks:
            _send(p, {"cmd": "bcast", "n": n, "form": self.form, "junk": 1000 * (rnd + 1) + n})
        res = [_read(p, 900, f"gloo rank {r}") for r, p in enumerate(self.ranks)]
        rows = res[1:n + 1]
        if not all(x.get("ok") and x.get("data_ok") for x in rows):
            raise RuntimeError(f"{self.name} n={n}: {rows}")
        return _stall(rows)

    def close(self) -> None:
        for p in self.ranks:
            try:
                _send(p, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
        for p in self.ranks:
            self.nodes.stop(p)


class _RaySystem:
    """Ray object store: a head node in the publisher's namespace, one Ray node per receiver namespace
    (started one at a time as N grows, each with its own temp dir), a driver that puts the tensors and
    actors pinned to the receiver nodes that get them at once."""

    name = "ray"

    def __init__(self, nodes: Nodes, nmax: int, sizes: list[int], store_mb: int) -> None:
        self.nodes, self.nmax, self.sizes, self.store_mb = nodes, nmax, sizes, store_mb
        self.ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
        self.port = _free_port()
        self.head = f"{nodes.ip(1)}:{self.port}"
        self.common = ["--block", "--num-cpus", "1", "--object-store-memory", str(store_mb * MB), "--disable-usage-stats"]
        self.tmp = tempfile.mkdtemp(prefix="rhray", dir="/tmp")  # one temp dir per node: several nodes share this host
        self.starters: list[subprocess.Popen] = []
        self.drv: subprocess.Popen | None = None
        self.up = 0

    def start(self) -> None:
        nodes = self.nodes
        self.starters.append(nodes.popen(
            1, [self.ray_bin, "start", "--head", "--node-ip-address", nodes.ip(1), "--port", str(self.port),
                "--temp-dir", f"{self.tmp}/n1", "--include-dashboard", "false", "--resources", json.dumps({"pnode": 1}),
                *self.common], "ray-head", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL))
        _wait_port(nodes, 1, nodes.ip(1), self.port, 90)

    def _start_node(self, i: int) -> None:
        j = 2 + i
        for attempt in range(3):
            p = self.nodes.popen(j, [self.ray_bin, "start", "--address", self.head, "--node-ip-address", self.nodes.ip(j),
                                     "--temp-dir", f"{self.tmp}/n{j}-{attempt}",
                                     "--resources", json.dumps({f"rnode{i + 1}": 1}), *self.common],
                                 f"ray-node{j}-{attempt}", stdin=subprocess.DEVNULL)
            self.starters.append(p)
            end = time.monotonic() + 75
            try:
                while True:
                    line = _read_plain(p, max(0.1, end - time.monotonic()), f"ray node {j}")
                    if not line:
                        raise RuntimeError(f"ray start on node {j} exited ({p.poll()})")
                    if "Ray runtime started" in line:
                        return
            except (TimeoutError, RuntimeError):
                self.nodes.stop(p, wait=30)
                if attempt == 2:
                    raise

    def round(self, n: int, rnd: int) -> dict:
        while self.up < n:  # one at a time: several raylets starting together on one host time out
            self._start_node(self.up)
            self.up += 1
        if self.drv is None:
            self.drv = _node(self.nodes, 1, "ray", {"address": self.head, "receivers": self.nmax, "sizes": self.sizes,
                                                    "seed": 7, "temp_dir": f"{self.tmp}/n1"}, "ray-driver")
            _read(self.drv, 300, "ray driver")
        _send(self.drv, {"cmd": "ray", "n": n})
        res = _read(self.drv, 900, "ray round")
        if not res.get("ok") or not all(r["data_ok"] for r in res["rows"]):
            raise RuntimeError(f"ray n={n}: {res}")
        return {**_stall(res["rows"]), "put_s": res["put_s"]}

    def close(self) -> None:
        if self.drv is not None:
            try:
                _send(self.drv, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
            self.nodes.stop(self.drv, wait=20)
        for p in reversed(self.starters):  # `ray start --block` stops its node's processes on SIGTERM
            self.nodes.stop(p, wait=30)
        shutil.rmtree(self.tmp, ignore_errors=True)


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


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:600]


def burst(ns: list[int], size_mb: float = 128, tensors: int = 32, rate: str = "1gbit",
          peers: tuple[str, ...] = ("gloo", "ray"), force_loopback: bool = False, store_mb: int = 512,
          rounds: int = 3, gloo_forms: tuple[str, ...] = ("chain", "async")) -> dict:
    """N receivers replicate at once, for every N in `ns`: refhub with and without pipeline replication
    and the peers, all started up front and run interleaved (per round and N, every system once, the
    order rotating), `rounds` times; medians and spread of the total stall per row."""
    from .rounds import summary

    sizes = _sizes(size_mb, tensors)
    nmax = max(ns)
    t0 = time.monotonic()
    notes: dict[str, str] = {}
    samples: dict[str, dict[int, list[dict]]] = {}
    with Nodes(nmax + 2, rate, force_loopback) as nodes:
        systems: list[Any] = [_RefhubSystem(nodes, nmax, sizes, True), _RefhubSystem(nodes, nmax, sizes, False)]
        if "gloo" in peers:
            try:
                import torch  # noqa: F401

                systems += [_GlooSystem(nodes, nmax, sizes, f) for f in gloo_forms]
            except ImportError:
                notes["gloo"] = "torch is not installed (pip install 'tent-bench[refhub-peers]'): gloo not measured"
        else:
            notes["gloo"] = "not requested"
        if "ray" in peers:
            if shutil.which("ray", path=os.path.dirname(sys.executable)) is None:
                notes["ray"] = "ray is not installed (pip install 'tent-bench[refhub-peers]'): not measured"
            else:
                systems.append(_RaySystem(nodes, nmax, sizes, store_mb))
        else:
            notes["ray"] = "not requested"
        live: list[Any] = []
        try:
            for sysm in systems:
                try:
                    sysm.start()
                    live.append(sysm)
                except Exception as exc:
                    sysm.close()
                    if sysm.name.startswith("pipeline") or sysm.name.startswith("no_pipeline"):
                        raise
                    notes[sysm.name] = "did not start: " + _err(exc)
            for s_ in live:
                samples[s_.name] = {n: [] for n in ns}
            k = 0
            for rnd in range(rounds):
                for n in ns:
                    order = live[k % len(live):] + live[:k % len(live)]
                    k += 1
                    for sysm in order:
                        if sysm.name in notes:
                            continue  # a peer that failed earlier in this run
                        try:
                            samples[sysm.name][n].append(sysm.round(n, rnd))
                        except Exception as exc:
                            if not sysm.name.startswith("gloo") and sysm.name != "ray":
                                raise
                            notes[sysm.name] = f"stopped at n={n}, round {rnd}: " + _err(exc)
        finally:
            for sysm in reversed(live):
                sysm.close()
        shaped, note = nodes.shaped, nodes.note
    rows = []
    for n in ns:
        row: dict[str, Any] = {"n": n}
        for name, per_n in samples.items():
            got = per_n.get(n) or []
            if not got:
                row[f"{name}_s"] = None
                continue
            tot = summary([g["total_s"] for g in got])
            row[f"{name}_s"] = tot["median"]
            row[f"{name}_per_receiver_s"] = round(tot["median"] / n, 3)
            row[f"{name}_spread"] = tot["spread"]
            # per receiver, the fastest and slowest round: the table's "median (min-max)"
            row[f"{name}_per_receiver_range_s"] = [round(tot["min"] / n, 3), round(tot["max"] / n, 3)]
            if name == "pipeline":
                row["pipeline_from_publisher"] = got[-1]["from_publisher"]
                row["pipeline_receivers"] = got[-1]["receivers"]
            if name == "ray":
                row["ray_put_s"] = round(statistics.median(g["put_s"] for g in got), 3)
        gl = [row[f"gloo_{f}_s"] for f in gloo_forms if row.get(f"gloo_{f}_s") is not None]
        row["gloo_s"] = min(gl) if gl else None  # gloo's best form at this N
        rows.append(row)
    one = sum(sizes) / (parse_rate_Bps(rate) * 0.95) if shaped else None
    flat = {}
    base = next((r for r in rows if r["n"] == 1), None)
    if base and base.get("pipeline_per_receiver_s"):
        flat = {f"n{r['n']}": round(r["pipeline_per_receiver_s"] / base["pipeline_per_receiver_s"], 3) for r in rows}
    return {
        "bench": "burst", "size_MB": size_mb, "tensors": len(sizes), "bytes": sum(sizes),
        "links": f"star, 1 link per node, {rate} each way (TBF)" if shaped else "loopback",
        "ideal_one_transfer_s": round(one, 3) if one else None,
        "metric": "total stall = sum over receivers of the time from the common start to its verified copy "
                  "(median over rounds; spread = (max - min) / median)",
        "rounds": rounds, "systems_interleaved": list(samples),
        "pipeline_per_receiver_vs_n1": flat,
        "rows": rows, "notes": notes | ({"setup": note} if note else {}),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def parse_rate_Bps(rate: str) -> float:
    from tent_bench.testbed.fabric import parse_rate

    return parse_rate(rate) / 8


FAILURES = ("kill", "stop", "cut")


def _silence(nodes: Nodes, j: int, proc: subprocess.Popen, how: str) -> None:
    """Fail node j's process: `kill` (SIGKILL: the kernel resets its sockets at once, peers see RST),
    `stop` (SIGSTOP: the process goes silent, its sockets stay open and the kernel keeps ACKing
    what fits in the buffers), `cut` (its link goes down at its end: the switch sees no carrier and
    what it forwards to the node vanishes, with static neighbours no ARP fails either: no RST, no
    ICMP, nothing; needs namespaces)."""
    if how == "kill":
        proc.send_signal(signal.SIGKILL)
    elif how == "stop":
        proc.send_signal(signal.SIGSTOP)
    elif how == "cut":
        if nodes.fabric is None:
            raise RuntimeError("a link cut needs network namespaces (root)")
        nodes.fabric.down(0, node_pair=(0, j))
    else:
        raise ValueError(f"failure must be one of {FAILURES}")


def _heal(nodes: Nodes, j: int, proc: subprocess.Popen, how: str) -> None:
    if how == "stop" and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)  # never resumed: a stopped process that wakes up would rejoin
    elif how == "cut" and nodes.fabric is not None:
        nodes.fabric.up(0, node_pair=(0, j))
        nodes.fabric.run(j, ["ip", "route", "replace", "198.18.0.0/15", "via", nodes.fabric.link(0, peer=j).addr0])


ATTEMPTS = 3  # setups per case and round where B must land on A's partial copy (a slow host can miss it)


def _failover_case(nodes: Nodes, sizes: list[int], case: str, rnd: int, attempt: int, expected: float | None,
                   kill_at: float, lead_s: float) -> dict | None:
    """One publisher -> A -> B run, A failing as `case` says; None when B was not scheduled on A's
    partial copy (A finished first, or B never saw A receiving): then the run says nothing."""
    tag = f"{case}{rnd}-{attempt}"
    srv, addr = _server(nodes, True, f"server-{tag}")
    base = {"server": addr, "sizes": sizes, "seed": 7 + rnd}
    procs = [srv]
    a = None
    try:
        pub = _node(nodes, 1, "publisher",
                    {**base, "name": "publisher", "host": nodes.ip(1) if nodes.shaped else None}, f"pub-{tag}")
        procs.append(pub)
        _read(pub, 120, "publisher")
        a = _node(nodes, 2, "receiver", {**base, "name": "A", "host": nodes.ip(2) if nodes.shaped else None}, f"A-{tag}")
        b = _node(nodes, 3, "receiver", {**base, "name": "B", "host": nodes.ip(3) if nodes.shaped else None}, f"B-{tag}")
        procs += [a, b]
        _read(a, 120, "A")
        _read(b, 120, "B")
        _send(a, {"cmd": "replicate"})
        # B starts once A is receiving: it is scheduled on A's partial copy (pipeline)
        _send(b, {"cmd": "replicate", "once_receiving": True, "lead": lead_s, "timeout": 10 + 2 * (expected or 1)})
        started = _read(b, 60, f"B start ({case}, round {rnd})")
        if started.get("event") != "started":
            if "TimeoutError" in str(started.get("error")):
                return None  # B never saw A receiving
            raise RuntimeError(f"B did not start: {started}")
        t_a = time.monotonic() - lead_s  # about when A began receiving
        if case != "none":
            time.sleep(max(0.0, t_a + (expected or 0.5) * kill_at - time.monotonic()))
            _silence(nodes, 2, a, case)
            failed_after = time.monotonic() - t_a
        res = _read(b, 600, "B")
        if not res.get("ok") or not res.get("data_ok"):
            raise RuntimeError(f"B failed ({case}): {res}")
        if res["sources"][0] != ["A", True]:
            return None
        row = {"B_seconds": res["secs"], "B_sources": res["sources"], "B_data_ok": res["data_ok"], "B_started_on_A": True}
        if case != "none":
            row["A_failed_after_s"] = round(failed_after, 3)  # after A began receiving
        return row
    finally:
        if a is not None and case != "none":
            _heal(nodes, 2, a, case)
        for p in procs[1:]:
            try:
                _send(p, {"cmd": "exit"})
            except (BrokenPipeError, OSError):
                pass
        for p in reversed(procs):
            nodes.stop(p)


def failover(size_mb: float = 64, tensors: int = 32, rate: str = "500mbit", kill_at: float = 0.5,
             force_loopback: bool = False, lead_s: float = 0.25, failures: tuple[str, ...] = FAILURES,
             rounds: int = 1) -> dict:
    """publisher -> A -> B over shaped links: A starts, B starts `lead_s` after the server sees A
    receiving (so it reads A's partial copy), A fails at `kill_at` of one transfer time after it
    began receiving, in each way of `failures` (SIGKILL; SIGSTOP; link cut); B must finish from the
    publisher with correct checksums. Reported: B's time with no failure and with each failure,
    `rounds` times interleaved (median and spread). Both starts wait on events, not on fixed sleeps,
    so a slow machine shifts the timeline instead of changing the scenario."""
    from .rounds import summary

    sizes = _sizes(size_mb, tensors)
    cases = ["none", *failures]
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    with Nodes(4, rate, force_loopback) as nodes:
        if not nodes.shaped:
            cases = [c for c in cases if c != "cut"]
            runs.pop("cut", None)
        expected = sum(sizes) / (parse_rate_Bps(rate) * 0.95) if nodes.shaped else None
        retried = 0
        for rnd in range(rounds):
            for case in cases:
                for attempt in range(ATTEMPTS):
                    row = _failover_case(nodes, sizes, case, rnd, attempt, expected, kill_at, lead_s)
                    if row is not None:
                        runs[case].append(row)
                        break
                    retried += 1  # A finished before B was scheduled on its partial copy: not the scenario
                else:
                    raise RuntimeError(f"failover {case}: B was never scheduled on A's partial copy in {ATTEMPTS} tries")
        shaped, note = nodes.shaped, nodes.note
    out: dict[str, Any] = {}
    for case, rs in runs.items():
        secs = [r["B_seconds"] for r in rs]
        row = dict(rs[-1])
        row["B_seconds"] = round(statistics.median(secs), 3)
        row["B_seconds_rounds"] = summary(secs)
        row["B_data_ok"] = all(r["B_data_ok"] for r in rs)
        row["B_started_on_A"] = all(r["B_started_on_A"] for r in rs)
        out[case] = row
    base_s = out["none"]["B_seconds"]
    res = {"bench": "failover", "size_MB": size_mb, "tensors": len(sizes),
           "links": f"star, 1 link per node, {rate} each way (TBF)" if shaped else "loopback",
           "kill_at_fraction": kill_at, "B_starts_after_A_s": lead_s, "rounds": rounds, "retried_setups": retried,
           "one_transfer_s": round(expected, 3) if expected else None,
           "no_failure": out["none"],
           "with_failure": out.get("kill"),  # the SIGKILL case, under its earlier name
           "failures": {c: out[c] for c in out if c != "none"},
           "extra_s": {c: round(out[c]["B_seconds"] - base_s, 3) for c in out if c != "none"}}
    if note:
        res["note"] = note
    return res
