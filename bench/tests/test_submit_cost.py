"""tent_bench.submit_cost's driver, run for real without valgrind: every form on each same-host
transport it is pointed at (the one-at-a-time forms once refused shm: they turned off a tcp-only
knob for every transport)."""

from __future__ import annotations

import pytest
from tent_bench import submit_cost


@pytest.mark.parametrize("transport", ["shm", "tcp"])
@pytest.mark.parametrize("form", ["submit", "wait", "run", "queued"])
def test_driver_runs_every_form(transport: str, form: str) -> None:
    submit_cost.driver(transport, "fast", 4096, 5, form)  # raises (ConfigError, a failed wait) if not
