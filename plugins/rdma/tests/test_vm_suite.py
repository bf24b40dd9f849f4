"""The RDMA device suites, run from the host inside Soft-RoCE guests (scripts/rdma-vm.sh).

- `make test` (TENT_RDMA_VM unset): test_make_test_subset boots ONE guest and runs the part of
  test_rdma_device.py that shows the issue's must-haves cheaply: byte-exact READ/WRITE across
  processes, many concurrent requests, unaligned and zero-length requests, bounds refusal, a WRITE
  to a read-only buffer refused by the NIC with the target still serving, a killed peer ending in a
  typed error before the deadline. Everything, installing the testbed included, runs under one hard
  cap (TENT_RDMA_VM_CI_BUDGET seconds, default 480). A testbed that cannot be set up (not root, no
  apt mirror, no QEMU, a guest that does not boot) or that runs past the cap (TCG on a slow or
  busy host) SKIPS with the reason; a test that ran inside the guest and failed FAILS.
- `make test-rdma` (TENT_RDMA_VM=1): the full suites, one guest (test_rdma_device.py) and two
  guests with two NICs each (test_rdma_two_vm.py: rails across hosts, a NIC taken down); there an
  unavailable testbed is a failure. TENT_RDMA_VM=auto runs the full suites where the testbed can be
  set up and skips otherwise; TENT_RDMA_VM=0 skips everything here.

Results come back as JUnit XML through the shared folder; the guest's pytest output (tee'd there
line by line) says which tests had finished when a run is cut short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "rdma-vm.sh"
PY = str(Path(sys.executable))
MODE = os.environ.get("TENT_RDMA_VM", "ci")
# `make test-rdma` needs the testbed: there an unavailable or too slow one is a failure
STRICT = MODE == "1"
VM_TIMEOUT_S = int(os.environ.get("TENT_RDMA_VM_TIMEOUT", "900"))
# make test's VM part, everything included (installing the testbed, the KVM probe, the squashfs
# images, the boot, the tests): the issue gives it ten minutes, this keeps two in reserve
CI_BUDGET_S = int(os.environ.get("TENT_RDMA_VM_CI_BUDGET", "480"))
# the tests make test runs in the guest (test_rdma_device.py; the rest is make test-rdma's)
CI_TESTS = [
    "test_probe_names_the_device",
    "test_read_and_write_are_byte_exact",
    "test_many_concurrent_requests",
    "test_unaligned_and_zero_length_requests",
    "test_bounds_refused",
    "test_write_to_readonly_buffer_is_refused_by_the_nic",
    "test_killed_peer_ends_in_a_typed_error_before_the_deadline",
    "test_target_keeps_serving_after_a_peer_died",
]

pytestmark = [
    pytest.mark.skipif(MODE == "0", reason="TENT_RDMA_VM=0: the Soft-RoCE VM tests are switched off"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the testbed needs Linux"),
]
full_suite = pytest.mark.skipif(
    MODE not in ("0", "1", "auto"),  # "0": the module's own reason
    reason="the full Soft-RoCE suites take 10-40 min each under TCG: make test-rdma (make test runs a subset)",
)


# pytest inside a guest: no cache writes (the checkout is read-only there), native tracebacks (pytest's
# own walk the filesystem, slow over 9p), each test named as it runs with its duration at the end (a
# run cut short by the limit still says where it was; a test running past 5 minutes dumps every
# thread's stack to the console), each test bounded by the run's own limit
def _guest_pytest(timeout_s: int, faulthandler_s: int = 300) -> list[str]:
    return [PY, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-v", "--durations=0",
            "-o", "addopts=", "--tb=native", "-o", f"timeout={timeout_s}", "-o",
            f"faulthandler_timeout={faulthandler_s}"]  # fmt: skip


def _testbed_or_skip() -> None:
    if os.geteuid() != 0 and not STRICT:
        pytest.skip("the Soft-RoCE testbed needs root (apt, /lib/modules, rdma link)")
    if not (ROOT / ".venv" / "bin" / "python").exists() and not STRICT:
        pytest.skip("no .venv in the checkout (run make install)")


def _run(out: Path, vm_args: list[str], cmd: list[str]) -> subprocess.CompletedProcess[str]:
    argv = ["bash", str(SCRIPT), "--out", str(out), "--timeout", str(VM_TIMEOUT_S), *vm_args, "--", *cmd]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=VM_TIMEOUT_S + 900, cwd=ROOT)
    if r.returncode == 3:  # the testbed could not be set up: skip (or fail when asked for it)
        reason = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "rdma-vm.sh: testbed unavailable"
        if STRICT:
            pytest.fail(reason)
        pytest.skip(reason)
    if r.returncode == 124 and not STRICT:
        tail = r.stderr.strip().splitlines()[-3:]
        pytest.skip(f"the guests ran past {VM_TIMEOUT_S}s (emulated CPUs on a busy host): {' / '.join(tail)}")
    return r


def _junit(path: Path, r: subprocess.CompletedProcess[str], out: Path) -> tuple[int, list[str], list[str]]:
    if not path.exists():
        logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted(out.glob("console.*.log")))
        pytest.fail(f"no results (rc {r.returncode})\n{r.stderr[-3000:]}\n{logs}")
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failed = [
        f"{c.get('name')}: {(c.find('failure') or c.find('error')).get('message', '')[:300]}"  # type: ignore[union-attr]
        for c in cases
        if c.find("failure") is not None or c.find("error") is not None
    ]
    skipped = [c.get("name", "") for c in cases if c.find("skipped") is not None]
    return len(cases), failed, skipped


def _check(out: Path, xml: str, r: subprocess.CompletedProcess[str]) -> None:
    n, failed, skipped = _junit(out / xml, r, out)
    bed = json.loads((out / "testbed.json").read_text()) if (out / "testbed.json").exists() else {}
    print(f"{xml}: {n} tests, {len(failed)} failed, {len(skipped)} skipped, testbed {bed}")
    assert not failed, "\n".join(failed)
    assert n > len(skipped), f"every test skipped: {skipped}"
    assert r.returncode == 0, r.stderr[-3000:]


@full_suite
@pytest.mark.timeout(VM_TIMEOUT_S + 1000)
def test_single_guest_suite(tmp_path: Path) -> None:
    _testbed_or_skip()
    out = tmp_path / "single"
    cmd = [*_guest_pytest(VM_TIMEOUT_S), f"--junitxml={out}/single.xml", "plugins/rdma/tests/test_rdma_device.py"]
    _check(out, "single.xml", _run(out, [], cmd))


@full_suite
@pytest.mark.timeout(VM_TIMEOUT_S + 1000)
def test_two_guest_suite(tmp_path: Path) -> None:
    _testbed_or_skip()
    out = tmp_path / "two"
    inner = [*_guest_pytest(VM_TIMEOUT_S), f"--junitxml={out}/two.xml", "plugins/rdma/tests/test_rdma_two_vm.py"]
    cmd = [PY, "-m", "tent_rdma.testbed", "--limit", str(VM_TIMEOUT_S), "--", *inner]
    _check(out, "two.xml", _run(out, ["--vms", "2", "--nics", "2", "--rates", "40mbit,40mbit"], cmd))


def _bounded(argv: list[str], limit_s: float) -> tuple[int | None, str, str]:
    """Run argv in its own process group for at most limit_s; on the limit the group gets SIGTERM
    (rdma-vm.sh then stops its guests), SIGKILL 20 s later. (rc or None on the limit, out, err)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=max(1.0, limit_s))
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                out, err = proc.communicate(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                out, err = "", ""
        return None, out or "", err or ""


def _last_line(text: str, default: str, prefix: str = "rdma-vm:") -> str:
    """The script's own last word (its lines start with prefix; the guest's output follows them)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    own = [ln for ln in lines if ln.startswith(prefix)]
    return (own or lines or [default])[-1]


def _guest_progress(out: Path) -> tuple[list[str], list[str], str]:
    """From the guest pytest's -v output (tee'd into the shared folder as it runs): the tests that
    failed, the tests that passed, and the one in progress ("" when none)."""
    path = out / "stdout.single"
    text = path.read_text(errors="replace") if path.exists() else ""
    failed, passed, current = [], [], ""
    for ln in text.splitlines():
        for part in ln.split("plugins/rdma/tests/test_rdma_device.py::")[1:]:
            name, _, verdict = part.strip().partition(" ")
            if "FAILED" in verdict or "ERROR" in verdict:
                failed.append(name)
            elif "PASSED" in verdict:
                passed.append(name)
            current = "" if verdict.strip() else name
    return failed, passed, current


@pytest.mark.skipif(MODE in ("1", "auto"), reason="TENT_RDMA_VM=1/auto: the full single-guest suite runs instead")
@pytest.mark.timeout(CI_BUDGET_S + 120)
def test_make_test_subset(tmp_path: Path) -> None:
    """One guest, the cheap must-shows of the issue, under one hard cap (install and boot included)."""
    t0 = time.monotonic()
    _testbed_or_skip()

    def left() -> float:
        return CI_BUDGET_S - (time.monotonic() - t0)

    # 1. install what the testbed needs (packages, kernel, virtme-ng, images): bounded like the rest
    rc, _, err = _bounded(["bash", str(SCRIPT), "--install-only"], left())
    if rc is None:
        pytest.skip(
            f"installing the Soft-RoCE testbed ran past make test's {CI_BUDGET_S}s budget for it "
            f"(slow mirror?): {_last_line(err, '')}"
        )
    if rc != 0:
        pytest.skip(_last_line(err, f"rdma-vm.sh --install-only failed (rc {rc})"))
    # 2. boot one guest and run the subset; rdma-vm.sh stops the guest at its --timeout (rc 124)
    run_s = int(left()) - 30
    if run_s < 120:
        pytest.skip(f"installing the testbed left {run_s}s of make test's {CI_BUDGET_S}s budget: too little to boot")
    out = tmp_path / "ci"
    # per test: the run's own limit (a guest too slow for the budget is cut by rdma-vm.sh and skips)
    guest = [
        *_guest_pytest(run_s, 240),
        f"--junitxml={out}/single.xml",
        *[f"plugins/rdma/tests/test_rdma_device.py::{t}" for t in CI_TESTS],
    ]
    argv = ["bash", str(SCRIPT), "--no-install", "--out", str(out), "--timeout", str(run_s), "--", *guest]
    rc, _, err = _bounded(argv, run_s + 60)
    failed, passed, current = _guest_progress(out)
    took = f"{time.monotonic() - t0:.0f}s"
    if rc == 3:
        pytest.skip(_last_line(err, "rdma-vm.sh: testbed unavailable"))
    if rc is None or rc == 124:
        # the testbed (boot, emulated CPU) was too slow for the budget; tests that ran and failed still fail
        assert not failed, f"failed in the guest before the {CI_BUDGET_S}s budget ran out: {failed}\n{err[-3000:]}"
        pytest.skip(
            f"the Soft-RoCE guest ran past make test's {CI_BUDGET_S}s budget after {len(passed)} "
            f"passed test(s){f', in {current}' if current else ''} (TCG on a slow or busy host): "
            f"{_last_line(err, '')}"
        )
    n, failed_xml, skipped = _junit(out / "single.xml", subprocess.CompletedProcess(argv, rc, "", err), out)
    bed = json.loads((out / "testbed.json").read_text()) if (out / "testbed.json").exists() else {}
    print(f"make-test subset: {n} tests, {len(failed_xml)} failed, {len(skipped)} skipped in {took}, testbed {bed}")
    assert not failed_xml, "\n".join(failed_xml)
    assert n == len(CI_TESTS), f"ran {n} of the {len(CI_TESTS)} chosen tests"
    assert not skipped, f"skipped inside the guest: {skipped}"
    assert rc == 0, err[-3000:]
