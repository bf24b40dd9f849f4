"""`tent demo`: the first thing a user runs. A small model, end to end, as a user would."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from tent_bench.demo import ModelSpec, as_bytes, digest, fill, make_state_dict


def test_model_is_llm_like_and_its_pattern_never_repeats():
    spec = ModelSpec()
    shapes = spec.shapes()
    assert 250 <= len(shapes) <= 400 and 0.9 * 2**30 <= spec.nbytes() <= 1.2 * 2**30
    small = ModelSpec(layers=1, hidden=64, intermediate=128, vocab=256)
    sd = make_state_dict(small)
    fill(sd, 1)
    words = np.concatenate([as_bytes(t).view(np.uint64) for t in sd.values()])  # torch bf16 or numpy
    assert len(np.unique(words)) == len(words)  # no 8-byte word twice in the whole state dict
    d1 = digest(sd)
    fill(sd, 2)
    assert digest(sd) != d1
    fill(sd, 1)
    assert digest(sd) == d1


def test_demo_runs_end_to_end():
    r = subprocess.run([sys.executable, "-m", "tent_core.cli", "demo", "--rollouts", "2", "--layers", "1", "--no-bench"],
                       capture_output=True, text=True, timeout=240)  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    for text in ("refhub server", "1. One rollout at a time", "2. The trainer publishes v2", "Summary", "rollout-0",
                 "rollout-1", "engine chose", "retries", "verified", "whole-state digest"):  # fmt: skip
        assert text in out, out
    assert "Traceback" not in r.stderr, r.stderr
    try:
        import tent_shm  # noqa: F401
    except ImportError:
        return
    # every process shares this host and the weights live in engine memory: the same-host transport
    # carries every byte (register()'d numpy/torch memory went over tcp: shm's default memfd mode cannot map it)
    assert "shm for 100% of the bytes" in " ".join(out.split()), out
