"""RDMA benchmarks next to the physical limit (perftest) and a peer (Mooncake TE), on real verbs.

Run inside the Soft-RoCE testbed (see docs/benchmarks.md for the exact commands):

    scripts/rdma-vm.sh -- .venv/bin/python -m tent_rdma.bench single --json OUT
    scripts/rdma-vm.sh --vms 2 --nics 2 --rates 3mbit,3mbit -- \\
        .venv/bin/python -m tent_rdma.testbed -- .venv/bin/python -m tent_rdma.bench two-vm --json OUT

single: one device, two processes (loopback RC QPs). For each size and op, rounds interleave the
engine (one batch of `bytes / size` requests of `size`), `ib_write_bw`/`ib_read_bw` with the same
size, bytes and QP count, and (--mooncake) Mooncake TE's RDMA transport with the same batch.

two-vm: guest a against guest b over N shaped NICs. Per NIC alone, perftest gives the limit; the
engine writes with policy "spray" and with "round_robin"; first all NICs at --rates, then the last
NIC at half its rate. Rows carry every round, the median and the spread (max - min).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from . import testbed, topology

log = logging.getLogger("tent_rdma.bench")
MiB = 1 << 20
PERFTEST_PORT = 18515


def parse_size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def parse_perftest(output: str, size: int, mib_per_s: bool = False) -> float:
    """BW average from perftest's result line ('#bytes #iterations BW peak BW average ...'), in
    Gbit/s: as printed with --report_gbits, or converted from MB/sec (perftest's MB is 2^20 bytes)
    when mib_per_s (--report_gbits prints two decimals: a NIC shaped to 8 Mbit/s reads 0.00)."""
    for line in output.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == str(size):
            return float(f[3]) * (1 << 20) * 8 / 1e9 if mib_per_s else float(f[3])
    raise RuntimeError(f"no perftest result line for size {size} in:\n{output[-2000:]}")


def summarize(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "spread": max(values) - min(values)} if values else {}


@functools.cache
def _gid_index(dev: str) -> int:
    # once per device: reading the GID tables from sysfs took 2.5-6 minutes per call in a guest under
    # TCG on a loaded host, longer than the perftest run it set up
    chosen, _ = topology.choose_devices(topology.list_devices(), [dev])
    if not chosen:
        raise RuntimeError(f"no usable GID on {dev}")
    return chosen[0].gid.index


def _wait_listen(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
        if out.strip():
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on port {port}")


def perftest_local(op: str, dev: str, size: int, iters: int, qps: int, timeout: float = 600) -> float:
    """Both perftest sides on this host (loopback QPs on one device): Gbit/s."""
    tool = "ib_write_bw" if op == "WRITE" else "ib_read_bw"
    args = [tool, "-d", dev, "-x", str(_gid_index(dev)), "-s", str(size), "-n", str(iters), "-q", str(qps),
            "--report_gbits", "-F", "-p", str(PERFTEST_PORT)]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_listen(PERFTEST_PORT)
        client = subprocess.run([*args, "127.0.0.1"], capture_output=True, text=True, timeout=timeout)
        if client.returncode != 0:
            raise RuntimeError(f"{tool} failed: {client.stdout[-2000:]}{client.stderr[-1000:]}")
        return parse_perftest(client.stdout, size)
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def engine_round(eng: Any, local: Any, remote: str, remote_len: int, op: str, size: int, total: int) -> float:
    from tent_core.engine import Request
    from tent_core.types import OpCode

    n = max(1, total // size)
    opc = OpCode.READ if op == "READ" else OpCode.WRITE
    reqs = [Request(opc, local, (i * size) % (local.length - size + 1), remote, (i * size) % (remote_len - size + 1), size)
            for i in range(n)]
    t0 = time.perf_counter()
    eng.submit(reqs, deadline=900).wait()
    return n * size * 8 / (time.perf_counter() - t0) / 1e9


class MooncakePeer:
    """Mooncake TE (mooncake-transfer-engine-non-cuda) over RDMA: a target process and this initiator."""

    TARGET = (
        "import json, sys, time\n"
        "from mooncake.engine import TransferEngine\n"
        "ip, dev, size = sys.argv[1], sys.argv[2], int(sys.argv[3])\n"
        "te = TransferEngine()\n"
        "assert te.initialize(ip, 'P2PHANDSHAKE', 'rdma', dev) == 0\n"
        "addr = te.allocate_managed_buffer(size)\n"
        "print(json.dumps({'name': f'{ip}:{te.get_rpc_port()}', 'addr': addr}), flush=True)\n"
        "sys.stdin.read()\n"
    )

    def __init__(self, ip: str, dev: str, size: int) -> None:
        from mooncake.engine import TransferEngine  # type: ignore[import-not-found]

        self.proc = subprocess.Popen([sys.executable, "-c", self.TARGET, ip, dev, str(size)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise RuntimeError(f"mooncake target exited (rc={self.proc.wait(timeout=30)})")
        info = json.loads(line)
        self.target, self.remote = info["name"], int(info["addr"])
        self.te = TransferEngine()
        if self.te.initialize(ip, "P2PHANDSHAKE", "rdma", dev) != 0:
            raise RuntimeError("mooncake initiator failed to initialize")
        self.local = self.te.allocate_managed_buffer(size)
        self.size = size

    def round(self, op: str, size: int, total: int) -> float:
        n = max(1, total // size)
        locs = [self.local + (i * size) % (self.size - size + 1) for i in range(n)]
        rems = [self.remote + (i * size) % (self.size - size + 1) for i in range(n)]
        fn = self.te.batch_transfer_sync_read if op == "READ" else self.te.batch_transfer_sync_write
        t0 = time.perf_counter()
        rc = fn(self.target, locs, rems, [size] * n)
        dt = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"mooncake batch {op} returned {rc}")
        return n * size * 8 / dt / 1e9

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_single(args: argparse.Namespace) -> dict[str, Any]:
    from tent_core.engine import Engine

    devs = [d for d in os.environ.get("TENT_RDMA_DEVS", "").split(",") if d] or [
        c.name for c in topology.choose_devices(topology.list_devices())[0]
    ]
    dev = devs[0]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ops = [o.strip().upper() for o in args.ops.split(",")]
    total = parse_size(args.bytes)
    buf_len = max(64 * MiB, max(sizes))
    cfg = json.loads(json.dumps(testbed.VM_ENGINE_CONFIG))
    cfg["transports"]["rdma"]["qps_per_rail"] = args.qps
    target = subprocess.Popen(
        [sys.executable, "-c",
         "import json, sys\nfrom tent_core.engine import Engine\n"
         "with Engine(json.loads(sys.argv[1]), transports=['rdma']) as e:\n"
         "    b = e.allocate(int(sys.argv[2]), segment='bench')\n"
         "    print(e.segment_name('bench'), flush=True)\n    sys.stdin.read()\n",
         json.dumps(cfg), str(buf_len)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    rows: dict[tuple[str, int], dict[str, list[float]]] = {}
    mooncake: MooncakePeer | None = None
    mooncake_error = ""
    try:
        remote = target.stdout.readline().strip() if target.stdout else ""
        if not remote:
            raise RuntimeError("bench target did not start")
        if args.mooncake:
            try:
                mooncake = MooncakePeer(os.environ.get("TENT_VM_IP", "127.0.0.1"), dev, buf_len)
            except Exception as exc:
                mooncake_error = f"{type(exc).__name__}: {exc}"
                log.warning("mooncake unavailable: %s", mooncake_error)
        with Engine(cfg, transports=["rdma"]) as eng:
            local = eng.allocate(buf_len)
            engine_round(eng, local, remote, buf_len, "WRITE", 1 * MiB, 8 * MiB)  # connect + warm up
            for r in range(args.rounds):
                for size in sizes:
                    for op in ops:
                        cell = rows.setdefault((op, size), {"engine": [], "perftest": [], "mooncake": []})
                        order = ["engine", "perftest", "mooncake"] if r % 2 == 0 else ["mooncake", "perftest", "engine"]
                        for who in order:
                            if who == "engine":
                                cell["engine"].append(engine_round(eng, local, remote, buf_len, op, size, total))
                            elif who == "perftest":
                                cell["perftest"].append(perftest_local(op, dev, size, max(1, total // size), args.qps))
                            elif mooncake is not None:
                                try:
                                    cell["mooncake"].append(mooncake.round(op, size, total))
                                except Exception as exc:
                                    mooncake_error = f"{type(exc).__name__}: {exc}"
                                    mooncake.close()
                                    mooncake = None
                        log.info("round %d %s %d: %s", r, op, size, {k: v[-1] for k, v in cell.items() if v})
    finally:
        if mooncake is not None:
            mooncake.close()
        if target.stdin:
            target.stdin.close()
        try:
            target.wait(timeout=60)
        except subprocess.TimeoutExpired:
            target.kill()
    out_rows = []
    for (op, size), cell in rows.items():
        row: dict[str, Any] = {"op": op, "size": size, "bytes_per_round": total, "qps": args.qps}
        for who, vals in cell.items():
            if vals:
                row[who] = {"rounds": vals, **summarize(vals)}
        if "engine" in row and "perftest" in row:
            row["engine_vs_perftest"] = row["engine"]["median"] / row["perftest"]["median"]
        if "engine" in row and "mooncake" in row:
            row["engine_vs_mooncake"] = row["engine"]["median"] / row["mooncake"]["median"]
        out_rows.append(row)
    return {"test": "single", "device": dev, "rows": out_rows, "mooncake_error": mooncake_error}


# QP ACK timeout exponent on shaped NICs (4.096 us * 2^19 = 2.1 s), the engine's and perftest's.
# rxe's responder ACKs every 64 packets of a QP (64 KiB at MTU 1024), and its requester retransmits
# when no ACK came for one timeout: with two QPs sharing a NIC at 4 Mbit/s, 64 KiB of one QP take
# 260 ms, the testbed's 268 ms (16) and far more than perftest's 67 ms (14): both retransmitted
# (perftest read 0 Mbit/s on the half-rate NIC), and at 1.5 Mbit/s 700 ms.
SHAPED_QP_TIMEOUT = 19


def _set_rate(nic: str, rate: str, remote: bool) -> None:
    argv = ["tc", "qdisc", "replace", "dev", nic, "root", *testbed.tbf_args(rate)]
    if remote:
        res = testbed.remote_job(argv, timeout=30)
        if not res or res["rc"] != 0:
            raise RuntimeError(f"guest b: {' '.join(argv)} failed: {res}")
    else:
        subprocess.run(argv, check=True, timeout=30)


def perftest_pair(dev: str, peer_ip: str, seconds: int, qps: int, size: int = 128 * 1024) -> float:
    """WRITE from here over one NIC to guest b (server there): Gbit/s."""
    gid = str(_gid_index(dev))
    args = ["ib_write_bw", "-d", dev, "-x", gid, "-s", str(size), "-D", str(seconds), "-q", str(qps), "-F", "-p",
            str(PERFTEST_PORT), "-u", str(SHAPED_QP_TIMEOUT)]  # MB/sec: shaped NICs are far below --report_gbits' 0.01 resolution
    testbed.remote_job(args, timeout=seconds + 120, background=True, wait_result=False)
    time.sleep(2.0)  # the server listens once started
    last = ""
    for _ in range(10):
        r = subprocess.run([*args, peer_ip], capture_output=True, text=True, timeout=seconds + 120)
        if r.returncode == 0:
            testbed.remote_result(seconds + 120)
            return parse_perftest(r.stdout, size, mib_per_s=True)
        last = r.stdout[-1000:] + r.stderr[-1000:]
        time.sleep(1.0)
    raise RuntimeError(f"ib_write_bw to {peer_ip} over {dev} failed: {last}")


def run_two_vm(args: argparse.Namespace) -> dict[str, Any]:
    from tent_core.config import SchedulerConfig
    from tent_core.engine import Engine
    from tent_core.slice_scheduler import SliceScheduler

    target = os.environ["TENT_TWO_VM_TARGET"]
    peer_ip = os.environ["TENT_VM_PEER_IP"]
    nics = os.environ["TENT_VM_NICS"].split(",")
    devs = os.environ["TENT_RDMA_DEVS"].split(",")
    rates = args.rates.split(",")
    if len(rates) != len(nics):
        raise SystemExit(f"--rates needs one rate per NIC ({len(nics)})")
    total = parse_size(args.bytes)
    phases = [("equal", rates)]
    half = list(rates)
    num = "".join(ch for ch in rates[-1] if ch.isdigit() or ch == ".")
    half[-1] = f"{float(num) / 2:g}{rates[-1][len(num):]}"
    phases.append(("half", half))

    def cfg(policy: str) -> dict[str, Any]:
        c = json.loads(json.dumps(testbed.VM_ENGINE_CONFIG))
        c["scheduler"] = {"policy": policy}
        c["transports"]["rdma"]["qps_per_rail"] = args.qps
        c["transports"]["rdma"]["qp_timeout"] = SHAPED_QP_TIMEOUT
        return c

    size = min(8 * MiB, total)
    # perftest writes messages of the size of the engine's slices (one work request each)
    slice_size = SliceScheduler(SchedulerConfig()).slice_sizes(size)[1]

    def spray_round() -> float:
        return engine_round(spray, bufs[id(spray)], remote, total, "WRITE", size, total)

    def rail_bytes() -> dict[str, int]:
        return {r["rail"]: r["bytes"] for r in spray.rail_stats() if r["transport"] == "rdma"}

    results: list[dict[str, Any]] = []
    host = os.environ.get("TENT_VM_IP", "127.0.0.1")
    with Engine(cfg("spray"), host=host, transports=["rdma"]) as spray, \
            Engine(cfg("round_robin"), host=host, transports=["rdma"]) as rr:
        bufs = {id(e): e.allocate(total) for e in (spray, rr)}
        remote = f"{target}/sink"
        for e in (spray, rr):  # connect, let the estimator see every rail
            engine_round(e, bufs[id(e)], remote, total, "WRITE", size, total)
        for name, phase_rates in phases:
            for nic, rate in zip(nics, phase_rates, strict=True):
                _set_rate(nic, rate, remote=False)
                _set_rate(nic, rate, remote=True)
            cell: dict[str, list[float]] = {"spray": [], "round_robin": [], **{f"perftest_{d}": [] for d in devs}}
            spray_round()  # adapt to the new rates
            shares = {k: 0 for k in rail_bytes()}
            for r in range(args.rounds):
                order = ["spray", "round_robin", *[f"perftest_{d}" for d in devs]]
                if r % 2:
                    order.reverse()
                for who in order:
                    if who == "spray":
                        before = rail_bytes()
                        cell[who].append(spray_round())
                        for k, v in rail_bytes().items():
                            shares[k] = shares.get(k, 0) + v - before.get(k, 0)
                    elif who == "round_robin":
                        cell[who].append(engine_round(rr, bufs[id(rr)], remote, total, "WRITE", size, total))
                    else:
                        cell[who].append(perftest_pair(who.removeprefix("perftest_"), peer_ip, args.seconds, args.qps,
                                                       slice_size))
                    log.info("%s round %d %s: %.4f Gbit/s", name, r, who, cell[who][-1])
            row: dict[str, Any] = {"phase": name, "rates": phase_rates, "bytes_per_round": total, "qps": args.qps}
            # how spray split its rounds over the rails, and the rate it estimated for each
            moved = sum(shares.values()) or 1
            row["spray_share"] = {k: v / moved for k, v in shares.items()}
            row["spray_estimate_gbps"] = {r["rail"]: r["bandwidth_GBps"] * 8 for r in spray.rail_stats()
                                          if r["transport"] == "rdma"}
            for who, vals in cell.items():
                row[who] = {"rounds": vals, **summarize(vals)}
            limit = sum(row[f"perftest_{d}"]["median"] for d in devs)
            row["sum_of_nics"] = limit
            row["spray_vs_sum"] = row["spray"]["median"] / limit
            row["round_robin_vs_sum"] = row["round_robin"]["median"] / limit
            row["spray_vs_round_robin"] = row["spray"]["median"] / row["round_robin"]["median"]
            results.append(row)
        stats = [r for r in spray.rail_stats() if r["transport"] == "rdma"]
    return {"test": "two-vm", "nics": nics, "rows": results, "rails": stats}


def _mmm(vals: list[float], digits: int = 3) -> str:
    """median (min-max), the documents' format for a cell over rounds."""
    if not vals:
        return ""
    f = f"{{:.{digits}g}}"
    return f"{f.format(statistics.median(vals))} ({f.format(min(vals))}-{f.format(max(vals))})"


def _per_round(num: list[float], den: list[float]) -> list[float]:
    """Ratios taken within each round (the same index is the same round)."""
    return [a / b for a, b in zip(num, den, strict=False) if b > 0]


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= MiB and n % MiB == 0 else f"{n >> 10} KiB"


def markdown(res: dict[str, Any]) -> str:
    """The result as docs/benchmarks.md tables: Gbit/s median (min-max) over the rounds, ratios per round."""
    lines: list[str] = []
    if res["test"] == "single":
        lines += [f"Device {res['device']} (one guest, loopback RC QPs). Gbit/s, median (min-max) of the rounds; "
                  "ratios taken within each round.", "",
                  "| op | size | bytes/round | QPs | tent | ib_*_bw | x perftest | Mooncake TE | x Mooncake | rounds |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            eng = r.get("engine", {}).get("rounds", [])
            pt = r.get("perftest", {}).get("rounds", [])
            mc = r.get("mooncake", {}).get("rounds", [])
            lines.append(f"| {r['op']} | {_size(r['size'])} | {_size(r['bytes_per_round'])} | {r['qps']} | {_mmm(eng)} | "
                         f"{_mmm(pt)} | {_mmm(_per_round(eng, pt))} | {_mmm(mc)} | {_mmm(_per_round(eng, mc))} | {len(eng)} |")
        if res.get("mooncake_error"):
            lines += ["", f"Mooncake TE: {res['mooncake_error']}"]
    else:
        lines += [f"NICs {', '.join(res['nics'])} (guest a -> guest b, WRITE). Gbit/s, median (min-max) of the rounds; "
                  "the NICs' sum is perftest's ib_write_bw on each NIC alone, ratios taken within each round.", "",
                  "| phase | rates | spray | round robin | sum of NICs | spray x sum | spray x round robin | spray's split | rounds |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in res["rows"]:
            sp, rr = r["spray"]["rounds"], r["round_robin"]["rounds"]
            nics = [v["rounds"] for k, v in r.items() if k.startswith("perftest_")]
            total = [sum(x) for x in zip(*nics, strict=True)]
            split = " / ".join(f"{100 * v:.0f}%" for v in r.get("spray_share", {}).values())
            lines.append(f"| {r['phase']} | {','.join(r['rates'])} | {_mmm(sp)} | {_mmm(rr)} | {_mmm(total)} | "
                         f"{_mmm(_per_round(sp, total))} | {_mmm(_per_round(sp, rr))} | {split} | {len(sp)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_rdma.bench")
    sub = ap.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("single", help="one device, two processes: engine vs perftest (vs Mooncake)")
    s.add_argument("--sizes", default="64K,1M,4M")
    s.add_argument("--ops", default="WRITE,READ")
    s.add_argument("--bytes", default="64M", help="bytes per round and point")
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--qps", type=int, default=2, help="QPs per rail for the engine and -q for perftest")
    s.add_argument("--mooncake", action="store_true", help="also Mooncake TE's RDMA transport (needs ~8 GiB guest memory)")
    t = sub.add_parser("two-vm", help="guest a -> guest b over shaped NICs: spray vs round robin vs the NICs' sum")
    t.add_argument("--rates", required=True, help="tc rate per NIC, e.g. 16mbit,16mbit (the last is halved later)")
    t.add_argument("--bytes", default="32M")
    t.add_argument("--rounds", type=int, default=3)
    t.add_argument("--seconds", type=int, default=15, help="perftest duration per NIC")
    t.add_argument("--qps", type=int, default=2)
    for p in (s, t):
        p.add_argument("--json", default=None, help="write the result here")
        p.add_argument("--markdown", action="store_true", help="print docs/benchmarks.md tables after the JSON")
    args = ap.parse_args(argv)
    # only the rdma plugin is imported (and by the processes started here): under an emulated CPU
    # the other plugins' imports (CUDA bindings, cuFile) take minutes
    os.environ.setdefault("TENT_PLUGINS", "rdma")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    res = run_single(args) if args.mode == "single" else run_two_vm(args)
    text = json.dumps(res, indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    if args.markdown:
        print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
