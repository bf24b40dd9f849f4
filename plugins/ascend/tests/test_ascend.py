"""ascend transport: import, probe and CLI everywhere; the executor's data path against a CANN
stand-in (acl_double.c) in a child process; real NPUs need an Ascend machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tent_ascend.plugin import KIND_PAIRS, AscendTransport, get_lib

from tent_core.types import MemoryKind, PeerInfo

HERE = Path(__file__).parent


def _has_cann() -> bool:
    from tent_ascend.acl import status

    return status()[0] > 0


def test_import_does_not_load_cann() -> None:
    code = "import tent_ascend.plugin; print(any('ascendcl' in l for l in open('/proc/self/maps')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"


def test_executor_library_loads_without_cann() -> None:
    assert get_lib().library.name == "ascend"
    from tent_core.errors import PluginABIError

    if not _has_cann():
        with pytest.raises(PluginABIError, match="libascendcl"):
            get_lib().library.create({"acl_lib": "/nonexistent/libascendcl.so"})


@pytest.mark.skipif(_has_cann(), reason="CANN with an NPU is present")
def test_unavailable_with_its_reason_and_listed_by_tent_plugins() -> None:
    av = AscendTransport().probe()
    assert not av.available and av.reason.startswith("no Ascend NPU: ") and "libascendcl" in av.reason
    out = subprocess.run([sys.executable, "-m", "tent_core.cli", "plugins", "--json"], capture_output=True, text=True,
                         timeout=120, env={k: v for k, v in os.environ.items() if k != "TENT_ASCENDCL"})
    assert out.returncode == 0, out.stderr
    row = next(r for r in json.loads(out.stdout) if r["name"] == "ascend")
    assert row["distribution"] == "tent-ascend" and row["status"] == "unavailable"
    assert row["reason"].startswith("no Ascend NPU: ") and "libascendcl" in row["reason"]
    assert set(row["config_keys"]) >= {"threads", "chunk", "bandwidth_gbps"}
    kit = subprocess.run([sys.executable, "-m", "tent_core.conformance", "ascend", "--json"], capture_output=True,
                         text=True, timeout=120)
    assert kit.returncode == 0, kit.stderr
    rep = json.loads(kit.stdout)
    assert rep["checks"] and all(c["status"] == "skipped" and "libascendcl" in c["detail"] for c in rep["checks"])


def test_capabilities_and_reach() -> None:
    t = AscendTransport()
    cap = t.capabilities()
    assert cap.kind_pairs == KIND_PAIRS and cap.same_host and not cap.cross_host
    assert cap.serves(MemoryKind.HOST, MemoryKind.NPU, True) and not cap.serves(MemoryKind.NPU, MemoryKind.NPU, False)
    t._host_id = "h"
    assert t.can_reach(PeerInfo("p", "h", os.getpid(), {"ascend": {"pid": os.getpid()}})) is None
    assert "staging" in (t.can_reach(PeerInfo("p", "h", 1, {"ascend": {"pid": 1}})) or "")


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the CANN stand-in")
    out = tmp_path_factory.mktemp("acl") / "libascendcl_standin.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter", "-pthread", "-o",
                    str(out), str(HERE / "acl_double.c")], check=True)
    return str(out)


def test_npu_copies_and_target_staging_against_the_cann_standin(standin: str) -> None:
    proc = subprocess.run([sys.executable, str(HERE / "acl_double_run.py"), standin], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TENT_ASCENDCL=standin))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["available"]
    assert r["h2d_ok"] and r["d2d_ok"] and r["d2h_ok"] and r["ro_refused"]
    c = r["counters"]
    assert c["bad_kind"] == 0 and c["bad_device"] == 0  # every copy named its direction and device right
    assert c["h2d"] >= 6 and c["d2d"] >= 6 and c["d2h"] >= 6  # chunked over the workers
    assert r["offer"]["kinds"] == ["npu"]  # the engine stages NPU memory for its peers
    assert r["explain"] == "target-staged" and r["staged_ok"] and r["staged_back_ok"]
