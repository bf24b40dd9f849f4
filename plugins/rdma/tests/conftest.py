"""Inside the Soft-RoCE guests a failure's traceback is printed as it happens: a run there is slow,
and one that hits the testbed's time limit must still say what failed."""

from __future__ import annotations

import os
import sys
from typing import Any


def pytest_runtest_logreport(report: Any) -> None:
    if report.failed and os.environ.get("TENT_VM_ROLE"):
        sys.stderr.write(f"\n---- {report.nodeid} ({report.when}) failed ----\n{report.longreprtext[-6000:]}\n")
        sys.stderr.flush()
