"""`tent doctor`: inspection on a fake /sys + /proc tree, the pure findings, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tent_core import doctor
from tent_core.cli import main


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_host(root: Path) -> Path:
    pci0, pci1 = root / "sys/devices/pci0000:00/0000:00:01.0", root / "sys/devices/pci0000:80/0000:80:02.0"
    _w(pci0 / "numa_node", "0\n")
    _w(pci1 / "numa_node", "1\n")
    for n, cpus in ((0, "0-7"), (1, "8-15")):
        _w(root / f"sys/devices/system/node/node{n}/cpulist", cpus)
        _w(root / f"sys/devices/system/node/node{n}/meminfo", f"Node {n} MemTotal:       1048576 kB\n")
    net = root / "sys/class/net"
    net.mkdir(parents=True)
    for name, pci, speed in (("ens1", pci0, "100000"), ("ens2", pci1, "-1")):
        (pci / "net" / name).mkdir(parents=True)
        d = pci / "net" / name
        _w(d / "operstate", "up")
        _w(d / "speed", speed)
        _w(d / "mtu", "9000")
        (d / "device").symlink_to(pci)
        (net / name).symlink_to(d)
    lo = root / "sys/devices/virtual/net/lo"
    _w(lo / "operstate", "unknown")
    _w(lo / "mtu", "65536")
    (net / "lo").symlink_to(lo)
    for name, pci, state, gid in (("mlx5_0", pci0, "4: ACTIVE", "fe80:0000:0000:0000:0000:0000:0000:0001"), ("mlx5_1", pci1, "1: DOWN", "")):
        d = root / "sys/class/infiniband" / name
        _w(d / "ports/1/state", state)
        _w(d / "ports/1/link_layer", "Ethernet")
        _w(d / "ports/1/rate", "100 Gb/sec (4X EDR)")
        _w(d / "ports/1/gids/0", gid or "0000:0000:0000:0000:0000:0000:0000:0000")
        _w(d / "node_type", "1: CA")
        (d / "device").symlink_to(pci)
    gpu = root / "proc/driver/nvidia/gpus/0000:80:02.0"
    _w(gpu / "information", "Model: \t NVIDIA H100\nIRQ: 1\n")
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    (root / "sys/bus/pci/devices/0000:80:02.0").symlink_to(pci1)
    _w(root / "proc/meminfo", "MemTotal: 1 kB\nHugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n")
    _w(root / "proc/sys/kernel/yama/ptrace_scope", "1\n")
    _w(root / "proc/self/status", "Name: x\nCapEff:\t0000000000000000\n")
    _w(root / "sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n")
    return root


def test_inspection_of_a_fake_host(tmp_path: Path) -> None:
    root = fake_host(tmp_path)
    assert [n["node"] for n in doctor.numa_nodes(root)] == [0, 1]
    nics = {n["name"]: n for n in doctor.nics(root)}
    assert nics["ens1"]["numa_node"] == 0 and nics["ens1"]["speed_mbps"] == 100000
    assert nics["ens2"]["numa_node"] == 1 and nics["ens2"]["speed_mbps"] is None
    assert nics["lo"]["virtual"] and nics["lo"]["numa_node"] == -1
    rdma = {d["name"]: d for d in doctor.rdma_devices(root)}
    assert rdma["mlx5_0"]["numa_node"] == 0 and rdma["mlx5_0"]["ports"][0]["state"] == "ACTIVE"
    assert rdma["mlx5_0"]["ports"][0]["gids"] == 1 and rdma["mlx5_1"]["ports"][0]["gids"] == 0
    gpus = doctor.gpus(root)
    assert gpus == [{"index": 0, "vendor": "nvidia", "model": "NVIDIA H100", "pci": "0000:80:02.0", "numa_node": 1}]
    topo = doctor.mooncake_topology(root=root)
    assert topo["cpu:0"] == {"preferred_hca": ["mlx5_0"], "avail_hca": ["mlx5_1"]}
    assert topo["cuda:0"] == {"preferred_hca": ["mlx5_1"], "avail_hca": ["mlx5_0"]}
    assert doctor.mooncake_topology(["mlx5_1"], root=root)["cpu:0"]["preferred_hca"] == ["mlx5_1"]
    assert doctor.mooncake_topology(root=tmp_path / "empty") == {}, "no RDMA device: Mooncake reports {}"


def test_findings_say_what_to_fix(tmp_path: Path) -> None:
    root = fake_host(tmp_path)
    rep = doctor.Report(
        transports=[{"name": "tcp", "distribution": "tent-tcp", "version": "0", "available": True, "reason": ""},
                    {"name": "nvlink", "distribution": "tent-nvlink", "version": "0", "available": False, "reason": "no CUDA device"}],
        numa=doctor.numa_nodes(root),
        nics=doctor.nics(root),
        rdma=doctor.rdma_devices(root),
        gpus=doctor.gpus(root),
        limits={**doctor.limits(root), "memlock_soft_bytes": 8 << 20, "libcuda": "cannot open", "libibverbs": "loads"},
    )
    areas = {f.area: f for f in doctor.findings(rep)}
    assert "memlock" in areas and "ulimit -l unlimited" in areas["memlock"].fix
    assert "rdma mlx5_1 port 1" in areas and "DOWN" in areas["rdma mlx5_1 port 1"].problem
    assert "ptrace" in areas and "ptrace_scope=1" in areas["ptrace"].problem
    assert "transport nvlink" in areas and "transport rdma" in areas
    assert "cuda" in areas and "hugepages" in areas
    rep.limits["memlock_soft_bytes"] = None
    rep.limits["ptrace_scope"] = 0
    areas = {f.area for f in doctor.findings(rep)}
    assert "memlock" not in areas and "ptrace" not in areas


def test_cli_table_and_json() -> None:
    runner = CliRunner()
    res = runner.invoke(main, ["doctor", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert {"host", "transports", "nics", "rdma", "gpus", "limits", "fixes"} <= set(data)
    assert any(t["name"] == "tcp" and t["available"] for t in data["transports"])
    assert any(n["name"] == "lo" for n in data["nics"])
    res = runner.invoke(main, ["doctor"])
    assert res.exit_code == 0, res.output
    for title in ("transports", "NICs", "RDMA devices", "limits and kernel settings", "what to fix"):
        assert title in res.output
