"""The conformance kit in memfd mode: what CMA cannot refuse (bounds, permission, revocation) the
memfd links refuse themselves (the default mode runs in the suite-wide conformance test)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_memfd_mode_enforces_what_cma_cannot() -> None:
    proc = subprocess.run([sys.executable, "-m", "tent_core.conformance", "shm", "--json", "--config", '{"mode": "memfd"}'],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    report = json.loads(proc.stdout)
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert proc.returncode == 0 and report["failed"] == 0, report
    assert all(status[c] == "passed" for c in ("bounds", "permission", "release_buffer")), status
