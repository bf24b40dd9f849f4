"""The RDMA plugin's logic without an RDMA device: sysfs discovery and GID choice, rail pairing,
descriptor validation, key packing, work-completion mapping, chunk limits, unavailable reasons,
and the declared verbs ABI against rdma-core's real header."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from rdma_helpers import pattern64
from tent_rdma import gpu, native, protocol, topology
from tent_rdma.transport import RdmaTransport

from tent_core.abi import Status
from tent_core.errors import ProtocolError

PLUGIN = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- sysfs-like trees


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _fake_sysfs(root: Path) -> Path:
    """Two RoCE NICs (mlx5-like, on PCI, NUMA 0 and 1), an rxe on a virtio netdev, a down port."""
    ib = root / "class" / "infiniband"
    pci0 = root / "devices" / "pci0000:00" / "0000:3b:00.0"
    pci1 = root / "devices" / "pci0000:80" / "0000:af:00.0"
    virtio = root / "devices" / "pci0000:00" / "0000:00:04.0" / "virtio2"
    for d, node in ((pci0, 0), (pci1, 1)):
        _write(d / "numa_node", str(node))
    _write(root / "devices" / "pci0000:00" / "0000:00:04.0" / "numa_node", "-1")
    virtio.mkdir(parents=True)

    def port(dev: str, state: str, gids: list[tuple[str, str, str]], layer: str = "Ethernet") -> None:
        p = ib / dev / "ports" / "1"
        _write(p / "state", state)
        _write(p / "link_layer", layer)
        for i in range(8):  # unused slots read as zeros; their attrs fail
            g = gids[i] if i < len(gids) else ("0000:0000:0000:0000:0000:0000:0000:0000", "", "")
            _write(p / "gids" / str(i), g[0])
            if g[1]:
                _write(p / "gid_attrs" / "types" / str(i), g[1])
                _write(p / "gid_attrs" / "ndevs" / str(i), g[2])

    ll = "fe80:0000:0000:0000:0e42:a1ff:fe00:0001"
    port("mlx5_0", "4: ACTIVE", [(ll, "IB/RoCE v1", "ens1"), (ll, "RoCE v2", "ens1"),
                                  ("0000:0000:0000:0000:0000:ffff:c612:0a01", "IB/RoCE v1", "ens1"),
                                  ("0000:0000:0000:0000:0000:ffff:c612:0a01", "RoCE v2", "ens1")])
    (ib / "mlx5_0" / "device").symlink_to(pci0)
    port("mlx5_1", "4: ACTIVE", [(ll, "RoCE v2", "ens2"), ("2001:0db8:0000:0000:0000:0000:0000:0002", "RoCE v2", "ens2")])
    (ib / "mlx5_1" / "device").symlink_to(pci1)
    port("rxe0", "4: ACTIVE", [(ll, "RoCE v2", "eth1"), ("0000:0000:0000:0000:0000:ffff:c612:0b01", "RoCE v2", "eth1")])
    _write(ib / "rxe0" / "parent", "eth1")
    (root / "class" / "net").mkdir(parents=True, exist_ok=True)
    (root / "class" / "net" / "eth1").mkdir()
    (root / "class" / "net" / "eth1" / "device").symlink_to(virtio)
    port("mlx5_2", "1: DOWN", [(ll, "RoCE v2", "ens3")])
    port("ib0dev", "4: ACTIVE", [("fe80:0000:0000:0000:0002:c903:0000:1111", "IB/RoCE v1", "")], layer="InfiniBand")
    return root


def test_sysfs_discovery_topology_and_gid_choice(tmp_path: Path) -> None:
    root = _fake_sysfs(tmp_path)
    devs = {d.name: d for d in topology.list_devices(root)}
    assert set(devs) == {"mlx5_0", "mlx5_1", "mlx5_2", "rxe0", "ib0dev"}
    assert (devs["mlx5_0"].pci, devs["mlx5_0"].numa_node) == ("0000:3b:00.0", 0)
    assert (devs["mlx5_1"].pci, devs["mlx5_1"].numa_node) == ("0000:af:00.0", 1)
    # a software device: its netdev's PCI function (the virtio NIC), found by walking up
    assert (devs["rxe0"].netdev, devs["rxe0"].pci, devs["rxe0"].numa_node) == ("eth1", "0000:00:04.0", -1)
    p0 = devs["mlx5_0"].ports[0]
    assert p0.active and len([g for g in p0.gids if g.gid.strip("0:")]) == 4
    # RoCE v2 with an IPv4-mapped address wins over v1 and link-local
    assert topology.select_gid(p0.gids).index == 3
    assert topology.select_gid(p0.gids).ipv4 == "198.18.10.1"
    # no IPv4: a global IPv6 RoCE v2 GID beats link-local
    assert topology.select_gid(devs["mlx5_1"].ports[0].gids).index == 1
    # InfiniBand: the port GID (index 0)
    assert topology.select_gid(devs["ib0dev"].ports[0].gids, "InfiniBand").index == 0
    # a preferred address picks its entry
    assert topology.select_gid(devs["rxe0"].ports[0].gids, prefer_ipv4="198.18.11.1").index == 1
    assert topology.select_gid([]) is None


def test_choose_devices_defaults_and_explicit(tmp_path: Path) -> None:
    devs = topology.list_devices(_fake_sysfs(tmp_path))
    chosen, skipped = topology.choose_devices(devs)
    assert [c.name for c in chosen] == ["ib0dev", "mlx5_0", "mlx5_1", "rxe0"]
    assert any("mlx5_2/1: port DOWN" in s for s in skipped)
    chosen, skipped = topology.choose_devices(devs, ["mlx5_2", "nope", "mlx5_0:1"])
    assert [c.name for c in chosen] == ["mlx5_0", "mlx5_2"]  # a named device is opened even while down
    assert not chosen[1].active
    assert any("nope: no such RDMA device" in s for s in skipped)
    chosen, _ = topology.choose_devices(devs, ["mlx5_0"], gid_index=1)
    assert chosen[0].gid.index == 1


def test_affinity_tiers() -> None:
    assert topology.affinity_tier(0, 0) == 0
    assert topology.affinity_tier(-1, 1) == 0 and topology.affinity_tier(1, -1) == 0
    slit = {(0, 1): 21, (1, 0): 21, (0, 2): 12, (2, 0): 12}
    assert topology.affinity_tier(0, 2, slit) == 1
    assert topology.affinity_tier(0, 1, slit) == 2
    assert topology.affinity_tier(0, 1) == 1


def test_pair_devices_by_subnet_layer_and_index() -> None:
    eth = "Ethernet"
    # rail-optimized: NIC i meets NIC i, whatever the order
    assert protocol.pair_devices([("198.18.10.1", eth), ("198.18.11.1", eth)],
                                 [("198.18.11.2", eth), ("198.18.10.2", eth)]) == [(0, 1), (1, 0)]
    # more local NICs than remote ones in a subnet: they share
    assert protocol.pair_devices([("198.18.10.1", eth), ("198.18.10.3", eth)], [("198.18.10.2", eth)]) == [(0, 0), (1, 0)]
    # nothing shared: by index, wrapping
    assert protocol.pair_devices([("", eth), ("", eth), ("", eth)], [("", eth), ("", eth)]) == [(0, 0), (1, 1), (2, 0)]
    # link layers never mix
    assert protocol.pair_devices([("", "InfiniBand")], [("198.18.0.1", eth)]) == []


def _dev(**over: object) -> dict:
    d = {"name": "rxe0", "port": 1, "gid": ("00" * 10) + "ffff" + "c6120a01", "lid": 0, "mtu": 3,
         "link_layer": "Ethernet", "rd_atom": 128, "numa": -1, "pci": ""}
    d.update(over)
    return d


def test_descriptor_parsing_and_validation() -> None:
    devs = protocol.parse_devices({"devices": [_dev()]})
    assert devs[0].ipv4 == "198.18.10.1" and devs[0].mtu == 3
    bad = [None, {}, {"devices": []}, {"devices": [_dev(gid="zz" * 16)]}, {"devices": [_dev(mtu=9)]},
           {"devices": [_dev(port=True)]}, {"devices": [_dev(name=7)]}, {"devices": [_dev()] * 17}]
    for desc in bad:
        with pytest.raises(ProtocolError):
            protocol.parse_devices(desc)


def test_handshake_messages_are_validated() -> None:
    q = protocol.qp_entry(protocol.QpEnd(17, 0xABCDE, bytes(16), 0, 3, 16), dev="rxe0")
    req = protocol.parse_connect({"kind": "connect", "initiator": "h:1", "incarnation": "x", "qps": [q], "replace": [5]})
    assert req.qps[0][0] == "rxe0" and req.qps[0][1].qpn == 17 and req.replace == [5]
    for body in [
        [],
        {"initiator": "h:1", "incarnation": "x", "qps": []},
        {"initiator": "h:1", "incarnation": "x", "qps": [dict(q, qpn=0)]},
        {"initiator": "h:1", "incarnation": "x", "qps": [dict(q, psn=1 << 24)]},
        {"initiator": "h:1", "incarnation": "x", "qps": [q] * 257},
        {"initiator": 5, "incarnation": "x", "qps": [q]},
        {"initiator": "h:1", "incarnation": "x", "qps": [q], "replace": [-1]},
    ]:
        with pytest.raises(ProtocolError):
            protocol.parse_connect(body)
    assert protocol.parse_release({"initiator": "a", "incarnation": "b", "handles": [1, 2]}) == ("a", "b", [1, 2])
    with pytest.raises(ProtocolError):
        protocol.parse_release({"initiator": "a", "incarnation": "b", "handles": ["x"]})


def test_transport_refuses_unknown_control_messages() -> None:
    with pytest.raises(ProtocolError):
        RdmaTransport().handle_control({"kind": "format-disk"})
    with pytest.raises(ProtocolError):
        RdmaTransport().handle_control("not a map")


def test_pack_regions_keeps_only_buffers_with_valid_keys() -> None:
    bufs = [
        {"addr": 0x1000, "length": 4096, "perm": 3, "desc": {"rdma": {"rkeys": [7, 8]}}},
        {"addr": 0x9000, "length": 100, "perm": 1, "desc": {"rdma": {"rkeys": [9, 10]}}},
        {"addr": 0x20000, "length": 10, "perm": 3, "desc": {"rdma": {"rkeys": [1]}}},  # wrong count
        {"addr": 0x30000, "length": 10, "perm": 3, "desc": {"tcp": {}}},  # not exported here
        {"addr": 0x40000, "length": 0, "perm": 3, "desc": {"rdma": {"rkeys": [1, 2]}}},  # empty
        {"addr": 0x50000, "length": 8, "perm": 3, "desc": {"rdma": {"rkeys": [1, -2]}}},  # bad key
    ]
    addrs, lens, perms, rkeys = protocol.pack_regions(bufs, "rdma", 2)
    assert addrs.tolist() == [0x1000, 0x9000] and lens.tolist() == [4096, 100] and perms.tolist() == [3, 1]
    assert rkeys.tolist() == [[7, 8], [9, 10]] and rkeys.flags["C_CONTIGUOUS"]
    empty = protocol.pack_regions([], "rdma", 3)
    assert empty[3].shape == (0, 3)


# ---------------------------------------------------------------- compiled policies


def test_work_completion_statuses_map_to_retryable_or_final() -> None:
    wc = {name: i for i, name in enumerate(
        "SUCCESS LOC_LEN LOC_QP_OP LOC_EEC_OP LOC_PROT WR_FLUSH MW_BIND BAD_RESP LOC_ACCESS REM_INV_REQ REM_ACCESS "
        "REM_OP RETRY_EXC RNR_RETRY_EXC LOC_RDD_VIOL REM_INV_RD_REQ REM_ABORT INV_EECN INV_EEC_STATE FATAL "
        "RESP_TIMEOUT GENERAL".split())}
    m = native.map_wc_status
    assert m(wc["SUCCESS"], True) == Status.OK
    # the target NIC refused: permission (op not granted) or range (granted, yet refused) - final
    assert m(wc["REM_ACCESS"], False) == Status.E_PERMISSION
    assert m(wc["REM_ACCESS"], True) == Status.E_BOUNDS
    assert not Status(m(wc["REM_INV_REQ"], True)).retryable
    for name in ("LOC_LEN", "LOC_PROT", "LOC_ACCESS", "LOC_QP_OP"):
        assert Status(m(wc[name], True)) == Status.E_INTERNAL, name
    # the path failed: retryable on another rail
    assert m(wc["RETRY_EXC"], True) == Status.E_TIMEOUT
    assert m(wc["RNR_RETRY_EXC"], True) == Status.E_TIMEOUT
    for name in ("WR_FLUSH", "REM_OP", "REM_ABORT", "BAD_RESP", "FATAL", "GENERAL"):
        assert Status(m(wc[name], True)).retryable, name
    assert Status(m(999, True)).retryable  # unknown codes from newer providers: treated as path errors


def test_chunks_respect_device_limits() -> None:
    assert native.plan_chunks(10 << 20, 1 << 20, 8 << 20) == (10, 1 << 20)
    assert native.plan_chunks(10 << 20, 16 << 20, 4 << 20) == (3, 4 << 20)  # max message size caps it
    assert native.plan_chunks(3 << 30, 0, 0) == (3, 1 << 30)  # a work request carries < 4 GiB
    assert native.plan_chunks(1000, 1 << 20, 8 << 20) == (1, 1000)
    assert native.plan_chunks(0, 1 << 20, 8 << 20) == (1, 0)
    n, per = native.plan_chunks((1 << 20) + 1, 1 << 20, 0)
    assert (n, per) == (2, 1 << 20)


# ---------------------------------------------------------------- unavailable, never broken


def _run(code: str, **env: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, **env}).stdout


def test_without_libibverbs_the_plugin_says_why() -> None:
    out = _run("from tent_rdma.transport import RdmaTransport; print(RdmaTransport().probe())",
               TENT_RDMA_LIBIBVERBS="/nonexistent/libibverbs.so.1")
    assert "available=False" in out and "cannot load /nonexistent/libibverbs.so.1" in out, out


def test_engine_starts_whatever_rdma_says() -> None:
    code = (
        "from tent_core.engine import Engine\n"
        "with Engine() as e:\n"
        "    print(sorted(e.transports), e.availability['rdma'])\n"
    )
    out = _run(code, TENT_RDMA_LIBIBVERBS="/nonexistent/libibverbs.so.1")
    assert "'tcp'" in out and "available=False" in out, out


def test_tent_plugins_lists_rdma_with_a_reason() -> None:
    tent = Path(sys.executable).with_name("tent")
    out = subprocess.run([str(tent), "plugins", "--json"], capture_output=True, text=True, timeout=120, check=True,
                         env={**os.environ, "TENT_RDMA_LIBIBVERBS": "/nonexistent/libibverbs.so.1"}).stdout
    import json

    row = next(r for r in json.loads(out) if r["name"] == "rdma")
    assert row["distribution"] == "tent-rdma" and row["status"] == "unavailable" and row["reason"]


def test_probe_here_is_truthful() -> None:
    avail = RdmaTransport().probe()
    if not os.path.isdir("/sys/class/infiniband") or not os.listdir("/sys/class/infiniband"):
        assert not avail.available and avail.reason
    else:
        assert avail.reason  # available: the devices; unavailable: why


def test_gpu_direct_reports_why_it_is_off(tmp_path: Path) -> None:
    st = gpu.gpu_direct_status(True, peermem_path=str(tmp_path / "no-peermem"))
    if st.mode is None:
        assert st.reason.startswith("off: ") and "staged path" in st.reason
    else:  # a GPU machine with dma-buf or nvidia_peermem
        assert st.reason.startswith("on: ")
    assert gpu.dmabuf_range(0x10000 + 100, 50, page=4096) == (0x10000, 4096, 100)
    assert gpu.dmabuf_range(4096, 8192, page=4096) == (4096, 8192, 0)


def test_pattern_never_repeats_a_word() -> None:
    p = pattern64(1 << 20, 9)
    words = p.view(np.uint64)
    assert len(np.unique(words)) == len(words)
    assert not np.array_equal(pattern64(64, 1), pattern64(64, 2))
    assert np.array_equal(pattern64(13, 4), pattern64(64, 4)[:13])


# ---------------------------------------------------------------- the declared ABI vs rdma-core's header


@pytest.mark.skipif(not Path("/usr/include/infiniband/verbs.h").exists(), reason="libibverbs-dev not installed")
@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_declared_verbs_abi_matches_rdma_core(tmp_path: Path) -> None:
    checks = {
        "device_attr": ["max_qp_wr", "max_qp_rd_atom", "max_qp_init_rd_atom", "phys_port_cnt", "max_mr_size"],
        "wc": ["wr_id", "status", "opcode", "byte_len", "qp_num", "wc_flags", "sl"],
        "sge": ["addr", "length", "lkey"],
        "send_wr": ["wr_id", "next", "sg_list", "num_sge", "opcode", "send_flags", "wr.rdma.remote_addr", "wr.rdma.rkey"],
        "qp_cap": ["max_send_wr", "max_inline_data"],
        "global_route": ["dgid", "flow_label", "sgid_index", "hop_limit", "traffic_class"],
        "ah_attr": ["grh", "dlid", "sl", "is_global", "port_num"],
        "qp_attr": ["qp_state", "path_mtu", "rq_psn", "sq_psn", "dest_qp_num", "qp_access_flags", "cap", "ah_attr",
                    "pkey_index", "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer", "port_num", "timeout",
                    "retry_cnt", "rnr_retry", "rate_limit"],
        "qp_init_attr": ["send_cq", "recv_cq", "cap", "qp_type", "sq_sig_all"],
        "mr": ["addr", "length", "lkey", "rkey"],
        "cq": ["context", "channel", "cqe"],
        "qp": ["context", "qp_num", "state", "qp_type"],
        "comp_channel": ["fd"],
        "context": ["device", "ops", "cmd_fd", "async_fd", "num_comp_vectors"],
        "context_ops": ["poll_cq", "req_notify_cq", "post_send", "post_recv"],
        "async_event": ["element", "event_type"],
    }
    sized = ["device_attr", "wc", "sge", "send_wr", "qp_cap", "global_route", "ah_attr", "qp_attr", "qp_init_attr",
             "mr", "comp_channel", "context_ops", "async_event"]
    lines = []
    for s, fields in checks.items():
        for f in fields:
            lines.append(f'  CHECK(offsetof(struct ibv_{s}, {f}) == offsetof(struct tv_{s}, {f}), "{s}.{f}");')
    for s in sized:
        lines.append(f'  CHECK(sizeof(struct ibv_{s}) == sizeof(struct tv_{s}), "sizeof {s}");')
    # the port attributes libibverbs writes through ibv_query_port fit in our buffer, at the same offsets
    for f in ["state", "active_mtu", "gid_tbl_len", "max_msg_sz", "lid", "link_layer"]:
        lines.append(f'  CHECK(offsetof(struct ibv_port_attr, {f}) == offsetof(struct tv_port_attr, {f}), "port.{f}");')
    lines.append('  CHECK(sizeof(struct ibv_port_attr) <= sizeof(struct tv_port_attr), "port size");')
    for a, b in [("IBV_WC_REM_ACCESS_ERR", "TV_WC_REM_ACCESS_ERR"), ("IBV_WC_RETRY_EXC_ERR", "TV_WC_RETRY_EXC_ERR"),
                 ("IBV_WC_WR_FLUSH_ERR", "TV_WC_WR_FLUSH_ERR"), ("IBV_WC_GENERAL_ERR", "TV_WC_GENERAL_ERR"),
                 ("IBV_EVENT_PORT_ERR", "TV_EVENT_PORT_ERR"), ("IBV_EVENT_PORT_ACTIVE", "TV_EVENT_PORT_ACTIVE"),
                 ("IBV_QP_DEST_QPN", "TV_QP_DEST_QPN"), ("IBV_QP_MAX_DEST_RD_ATOMIC", "TV_QP_MAX_DEST_RD_ATOMIC"),
                 ("IBV_WR_RDMA_READ", "TV_WR_RDMA_READ"), ("IBV_ACCESS_REMOTE_READ", "TV_ACCESS_REMOTE_READ"),
                 ("IBV_QPS_ERR", "TV_QPS_ERR"), ("IBV_QPT_RC", "TV_QPT_RC"), ("IBV_MTU_4096", "TV_MTU_4096")]:
        lines.append(f'  CHECK((int){a} == (int){b}, "{a}");')
    src = tmp_path / "abi.c"
    src.write_text(textwrap.dedent("""\
        #include <stddef.h>
        #include <stdio.h>
        #include <infiniband/verbs.h>
        #include "verbs_abi.h"
        static int bad;
        #define CHECK(c, what) do { if (!(c)) { printf("mismatch: %s\\n", what); bad = 1; } } while (0)
        int main(void) {
        """) + "\n".join(lines) + "\n  return bad;\n}\n")
    exe = tmp_path / "abi"
    subprocess.run(["cc", "-std=gnu11", "-I", str(PLUGIN / "csrc"), str(src), "-o", str(exe)], check=True,
                   capture_output=True, timeout=120)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout


def test_library_has_no_link_time_dependency_on_libibverbs() -> None:
    lib = native.get_lib().library.path
    if shutil.which("ldd") is None:
        pytest.skip("no ldd")
    out = subprocess.run(["ldd", lib], capture_output=True, text=True, timeout=60).stdout
    assert "libibverbs" not in out, out


def test_bench_parsers() -> None:
    from tent_rdma import bench

    out = textwrap.dedent("""\
        ---------------------------------------------------------------------------------------
         #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
         1048576    32               0.47               0.45               0.000054
        ---------------------------------------------------------------------------------------
        """)
    assert bench.parse_perftest(out, 1 << 20) == 0.45
    assert bench.parse_perftest(out, 1 << 20, mib_per_s=True) == pytest.approx(0.45 * (1 << 20) * 8 / 1e9)
    with pytest.raises(RuntimeError):
        bench.parse_perftest(out, 65536)
    assert bench.parse_size("64K") == 65536 and bench.parse_size("4M") == 4 << 20 and bench.parse_size("512") == 512
    assert bench.summarize([3.0, 1.0, 2.0]) == {"median": 2.0, "spread": 2.0}


def test_config_keys_are_declared_and_checked() -> None:
    from tent_rdma.transport import RdmaTransport

    from tent_core.errors import ConfigError

    t = RdmaTransport()
    cfg = t.resolve_config({"qps_per_rail": "4", "devices": "rxe0,rxe1", "handshake_timeout_s": 2})
    assert cfg["qps_per_rail"] == 4 and cfg["devices"] == "rxe0,rxe1" and cfg["handshake_timeout_s"] == 2.0
    assert cfg["retry_cnt"] == 7 and cfg["slice_timeout_ms"] == 500  # defaults, the core's key included
    with pytest.raises(ConfigError, match="qp_per_rail"):
        t.resolve_config({"qp_per_rail": 4})
    with pytest.raises(ConfigError, match="chunk_bytes"):
        t.resolve_config({"chunk_bytes": "lots"})


def test_conformance_kit_reports_unavailable_here() -> None:
    """On a host without an RDMA device the kit skips every check with the probe's reason."""
    from tent_rdma.transport import RdmaTransport

    if RdmaTransport().probe().available:
        pytest.skip("an RDMA device is present: the device suite runs the kit")
    r = subprocess.run([sys.executable, "-m", "tent_core.conformance", "rdma", "--json"], capture_output=True,
                       text=True, timeout=300)
    import json

    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["failed"] == 0 and report["passed"] == 0, r.stdout
    assert report["reason"].startswith("unavailable here:"), report["reason"]
