"""tent_bench.call_forms, run for real, briefly: both call forms (and the bare Python copy, in
memfd mode) timed for every size, as many requests each as asked, and bad arguments refused (the
figures belong in docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tent_bench import call_forms


def test_both_forms_are_timed_per_size() -> None:
    rows = call_forms.compare("WRITE", [4096, 16384], blocks=3, per_block=4)
    assert [r["size"] for r in rows] == [4096, 16384]
    for r in rows:
        assert r["op"] == "WRITE" and r["requests"] == 3 * 4  # every alternation runs both forms
        assert r["submit_wait_ns"] > 0 and r["run_ns"] > 0
        assert r["diff_ns"] == pytest.approx(r["submit_wait_ns"] - r["run_ns"])
        # the bare Python copy beside them where the link maps the target's memory (memfd mode)
        assert ("python_ns" in r) == (r["shm_mode"] == "memfd")
        if "python_ns" in r:
            assert r["python_ns"] > 0
            assert r["run_over_python_ns"] == pytest.approx(r["run_ns"] - r["python_ns"])
            assert r["submit_wait_over_python_ns"] == pytest.approx(r["submit_wait_ns"] - r["python_ns"])


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        call_forms.compare("COPY", [4096], blocks=1)
    with pytest.raises(ValueError):
        call_forms.compare("READ", [4096], blocks=0)
    res = subprocess.run([sys.executable, "-m", "tent_bench.call_forms", "--sizes", "0"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert res.returncode == 2 and "size must be > 0" in res.stderr
