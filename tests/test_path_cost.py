"""The planner's choice between direct and staged paths, from plain data (no sockets), and
`tent explain` against a real peer process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tent_core.config import PathCostConfig
from tent_core.errors import NoPathError, PolicyRejectedError
from tent_core.policy_rules import RequestTraits, parse_rules
from tent_core.routing import Decision, Router, StagedPath, TargetStagedPath, path_cost, path_kind
from tent_core.types import CapabilityProfile, MemoryKind, OpCode, Priority

H, C, S = MemoryKind.HOST, MemoryKind.CUDA, MemoryKind.SIM
MiB = 1 << 20


def prof(pairs, same=True, cross=True, rank=100, gbps=0.0):
    return CapabilityProfile(frozenset(pairs), same, cross, rank, gbps)


def traits(lk, rk, same=False, size=64 * MiB, tag=None):
    return RequestTraits(Priority.MID, size, lk, rk, same, tag)


def test_path_cost_is_a_pipeline():
    # one stage: plain time
    assert path_cost(100 * MiB, 100 * MiB, [(1e9, 0.0)]) == pytest.approx(100 * MiB / 1e9)
    # two equal stages, many chunks: about one stage's time plus one chunk
    t = path_cost(100 * MiB, MiB, [(1e9, 0.0), (1e9, 0.0)])
    assert t == pytest.approx(101 * MiB / 1e9)
    # the slowest stage bounds it
    assert path_cost(100 * MiB, MiB, [(1e9, 0.0), (4e9, 0.0)]) == pytest.approx((100 * MiB + MiB / 4) / 1e9)
    # per-chunk overhead counts per chunk
    assert path_cost(10 * MiB, MiB, [(1e12, 1e-3)]) == pytest.approx(10e-3, rel=1e-2)
    assert path_cost(0, MiB, []) == 0.0


TCP = prof({(H, H)}, rank=50, gbps=1.25)
GPUDIRECT = prof({(H, C), (C, H), (C, C), (H, H)}, gbps=0.5)  # a slow NIC that can reach GPU memory
NVLINK = prof({(H, C), (C, H), (C, C)}, cross=False, rank=5, gbps=50)
STAGING = {"kinds": ["cuda"], "chunk": 4 * MiB, "gbps": {"cuda": 25.0}}


def test_target_staging_makes_a_remote_gpu_reachable_over_tcp():
    r = Router({"tcp": TCP, "nvlink": NVLINK})
    p = r.plan(traits(H, C), ["tcp"], (), OpCode.WRITE, remote_staging=STAGING)
    assert isinstance(p, TargetStagedPath) and path_kind(p) == "target-staged"
    assert p.wire_leg.transports == ("tcp",) and p.wire_kind == H and p.chunk == 4 * MiB
    # device here too: both sides stage
    p = r.plan(traits(C, C), ["tcp"], ["nvlink"], OpCode.READ, remote_staging=STAGING)
    assert path_kind(p) == "both-staged" and p.local_leg.transports == ("nvlink",)
    assert "target staging" in p.describe()
    # without the target's offer there is no path, and the error says why for each kind of path
    with pytest.raises(NoPathError, match="target-staged: the peer offers no staging"):
        r.plan(traits(H, C), ["tcp"], (), OpCode.WRITE)
    with pytest.raises(NoPathError, match="does not stage cuda"):
        r.plan(traits(H, C), ["tcp"], (), OpCode.WRITE, remote_staging={"kinds": ["npu"], "chunk": MiB})


def test_the_cheaper_of_direct_and_staged_wins():
    slow = Router({"tcp": TCP, "gdr": GPUDIRECT})
    # GPUDirect at 0.5 GB/s vs TCP at 1.25 GB/s plus a 25 GB/s target copy: staging wins
    p = slow.plan(traits(H, C), ["tcp", "gdr"], (), OpCode.WRITE, remote_staging=STAGING)
    assert path_kind(p) == "target-staged"
    fast = Router({"tcp": TCP, "gdr": prof({(H, C), (C, H), (C, C), (H, H)}, gbps=12.5)})
    p = fast.plan(traits(H, C), ["tcp", "gdr"], (), OpCode.WRITE, remote_staging=STAGING)
    assert isinstance(p, Decision) and p.transports[0] == "gdr"
    # equal rates: direct (fewer stages, less overhead)
    even = Router({"tcp": TCP, "gdr": prof({(H, C), (C, H)}, gbps=1.25)})
    assert isinstance(even.plan(traits(H, C), ["tcp", "gdr"], (), OpCode.WRITE, remote_staging=STAGING), Decision)
    # the candidates are priced for the request's own size
    cands = slow.candidates(traits(H, C), ["tcp", "gdr"], (), OpCode.WRITE, remote_staging=STAGING, nbytes=256 * MiB)
    by = {c.kind: c for c in cands}
    assert by["direct"].viable and by["target-staged"].viable and not by["both-staged"].viable
    assert by["direct"].cost_s == pytest.approx(256 * MiB / 0.5e9 + 20e-6, rel=1e-6)
    assert by["target-staged"].cost_s < by["direct"].cost_s


def test_initiator_staging_still_serves_local_device_memory():
    r = Router({"tcp": TCP, "nvlink": NVLINK})
    p = r.plan(traits(C, H), ["tcp"], ["nvlink"], OpCode.WRITE)
    assert isinstance(p, StagedPath) and path_kind(p) == "initiator-staged"


def test_rules_apply_to_every_leg_of_a_target_staged_path():
    rules = parse_rules([{"name": "no-tcp", "match": {"remote_kind": "cuda"}, "deny_transports": ["tcp"]}])
    r = Router({"tcp": TCP, "nvlink": NVLINK}, rules)
    with pytest.raises(PolicyRejectedError, match="no-tcp"):
        r.plan(traits(H, C), ["tcp"], (), OpCode.WRITE, remote_staging=STAGING)


def test_cost_model_defaults_come_from_config():
    r = Router({"tcp": prof({(H, H)})}, cost=PathCostConfig(cross_host_gbps=2.0, same_host_gbps=20.0))
    c = r.candidates(traits(H, H), ["tcp"], (), OpCode.WRITE, nbytes=2 * 10**9)[0]
    assert c.cost_s == pytest.approx(1.0, rel=1e-3)
    c = r.candidates(traits(H, H, same=True), ["tcp"], (), OpCode.WRITE, nbytes=2 * 10**9)[0]
    assert c.cost_s == pytest.approx(0.1, rel=1e-3)


def test_tent_explain_cli_against_a_peer_process():
    from sim_peers import SimPeer

    p = SimPeer(size=8 * MiB, config={"transports": {"simdev": {"ipc": False}}}, transports=["tcp", "simdev"])
    try:
        tent = [sys.executable, "-m", "tent_core.cli"]
        out = subprocess.run([*tent, "explain", p.seg("dev"), "--op", "write", "--length", str(4 * MiB),
                              "--transports", "tcp", "--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        ex = json.loads(out.stdout)
        assert ex["chosen"] == "target-staged" and ex["remote_kind"] == "sim" and ex["length"] == 4 * MiB
        kinds = {c["kind"]: c for c in ex["candidates"]}
        assert not kinds["direct"]["viable"] and "tcp" in kinds["direct"]["reason"]
        assert kinds["target-staged"]["viable"] and kinds["target-staged"]["cost_ms"] > 0
        text = subprocess.run([*tent, "explain", p.seg("dev"), "--local-kind", "sim", "--simdev",
                               "--transports", "tcp,simdev", "--config", "/dev/null"],
                              capture_output=True, text=True, timeout=120)
        assert text.returncode == 0, text.stderr
        assert "chosen: both-staged" in text.stdout and "candidates:" in text.stdout
        bad = subprocess.run([*tent, "explain", p.seg("nope")], capture_output=True, text=True, timeout=120)
        assert bad.returncode != 0 and "nope" in bad.stderr
    finally:
        p.close()
