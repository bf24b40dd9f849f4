"""The initiator of tests/test_fast_mice.py's real-rail test, run inside node 0 of a Fabric.

argv: target segment, pattern seed, size, host, engine config (JSON). Loads 64 KiB READ mice over
both rails, prints {"phase": "ready", ...}, waits for a line on stdin (the parent has taken rail 1
down meanwhile), keeps loading until rail 1 is paused (every mouse checked against the pattern),
loads again, and prints what it saw as one JSON line."""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from tent_core import READ, Engine, Request
from tent_core.rail_monitor import RailState
from tent_core.testing import pattern

MOUSE = 64 << 10


def main() -> int:
    segment, seed, size, host, cfg = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
    src = pattern(size, seed)
    slots = size // MOUSE
    with Engine(cfg, host=host, transports=["tcp"]) as eng:
        local = eng.allocate(size)
        eng.read(local, segment, size)  # connects both rails
        fast = eng._fast
        rails = {r.info.index: r for p in eng.peers.peers() for rt in p.routes.values() for r in rt.rails}

        def rail_bytes() -> dict[int, int]:
            return {r["index"]: r["bytes"] for r in eng.rail_stats()}

        def load(batches: int, start: int) -> None:
            hs = []
            for b in range(batches):
                reqs = [Request(READ, local, o, segment, o, MOUSE)
                        for o in (((start + b) * 16 + i) % slots * MOUSE for i in range(16))]
                hs.append(eng.submit(reqs, deadline=30))
                if len(hs) >= 4:
                    assert hs.pop(0).wait(timeout=40)
            for h in hs:
                assert h.wait(timeout=40)

        load(1, 0)
        time.sleep(0.05)
        b0, m0 = rail_bytes(), fast.mice
        load(32, 0)
        before = {i: v - b0[i] for i, v in rail_bytes().items()}
        print(json.dumps({"phase": "ready", "by_rail": before, "mice": fast.mice - m0}), flush=True)
        sys.stdin.readline()  # rail 1 is down now
        local.array[:] = 0
        t0 = time.monotonic()
        paused_after = None
        n = 0
        while time.monotonic() - t0 < 20:
            load(8, n)
            n += 8
            if eng.monitor.state(rails[1].slot, time.monotonic()) == RailState.PAUSED:
                paused_after = time.monotonic() - t0
                break
        covered = min(n * 16, slots) * MOUSE
        intact = bool(np.array_equal(local.array[:covered], src[:covered]))
        m1, frozen = fast.mice, rail_bytes()[1]
        errs = next(r["errors"] for r in eng.rail_stats() if r["index"] == 1)
        load(32, n)
        row1 = next(r for r in eng.rail_stats() if r["index"] == 1)
        print(json.dumps({"phase": "done", "by_rail": before, "paused_after_s": paused_after, "intact": intact,
                          "mice_after": fast.mice - m1, "rail1_after": rail_bytes()[1] - frozen,
                          "rail1_errors_after": row1["errors"] - errs, "rail1_inflight": row1["inflight_slices"],
                          "rail1_inflight_bytes": row1["inflight_bytes"],
                          "paused_now": eng.monitor.state(rails[1].slot, time.monotonic()) == RailState.PAUSED}),
              flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
