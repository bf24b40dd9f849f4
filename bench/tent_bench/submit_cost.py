"""Instructions per submit(): the cost of the submit path counted by valgrind (callgrind), which a
loaded machine cannot distort the way it distorts time.

    python -m tent_bench.submit_cost [--transport tcp] [--variant fast|planner] [--block 64K]
        [--form submit|wait|run|queued]

runs the driver twice under ``valgrind --tool=callgrind --separate-threads=yes`` (N1 and N2
submissions of one request from a dedicated thread, handles kept, waited for afterwards) and
prints, as JSON, (instructions of that thread with N2 - with N1) / (N2 - N1): everything the
submitting thread executes per submit() in user space (Python and C; the executor's work on that
thread included, the kernel's not). Needs valgrind. ``--driver N`` is the driver itself.

``--form wait`` / ``--form run``: one request at a time instead, each ``submit(req).wait()`` or
``run(req)`` on that thread (the issue-17 loop): the instructions per round trip in user space, the
waiter's receive of the answer and its completion included. tcp's busy polling is off for these
forms (``busy_poll_us`` 0), so that a spin whose length depends on timing does not enter the count;
shm copies a request of up to one chunk on the submitting thread and never polls for it.

``--form queued``: the loop `tent bench --submit-cost` times for its queued figure (issue 14's
target): groups of QUEUED_GROUP submits back to back, then their waits, the handles dropped before
the next group (so that the engine reuses what they held), N1 = 400 and N2 = 2400 submits.
Only the instructions inside the submit call are counted (``--toggle-collect`` of the fast path's
entry, FastPath_vectorcall; the fast path only): the waits, whose polling depends on timing, and
the loop around the call are not.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

THREAD_MARK = "exec_submit"  # the native call every submit makes, on the submitting thread only
QUEUED_GROUP = 200  # submits queued before their waits in runner.submit_cost_us (--form queued)
QUEUED_ENTRY = "FastPath_vectorcall"  # the fast path's submit() (_native/native.c)


def driver(transport: str, variant: str, block: int, n: int, form: str = "submit") -> None:
    from tent_core import Engine, OpCode, Request

    from .runner import target_process

    cfg: dict = {"fast_path": variant == "fast"}
    if form != "submit" and transport == "tcp":  # no spin of timing-dependent length in a round trip's count
        cfg["transports"] = {transport: {"busy_poll_us": 0}}  # (shm copies on this thread: it never polls)
    with target_process(block, pattern_fill=False) as target, Engine(cfg, transports=[transport]) as eng:
        local = eng.allocate(block, segment="cost-local")
        req = [Request(OpCode.WRITE, local, 0, target["segment"], 0, block)]
        for _ in range(50):
            eng.submit(req).wait()
        handles: list = []

        def submitter() -> None:
            if form == "wait":
                for _ in range(n):
                    eng.submit(req).wait()
            elif form == "run":
                for _ in range(n):
                    eng.run(req)
            elif form == "queued":
                for start in range(0, n, QUEUED_GROUP):
                    group = [eng.submit(req) for _ in range(min(QUEUED_GROUP, n - start))]
                    for h in group:
                        h.wait()
                    del group  # dropped before the next group queues, as the timed loop drops them
            else:
                for _ in range(n):
                    handles.append(eng.submit(req))

        t = threading.Thread(target=submitter, name="submitter")
        t.start()
        t.join()
        for h in handles:
            h.wait()


def _thread_instructions(out_prefix: str) -> int:
    """Instructions of the one thread whose profile holds THREAD_MARK (the submitter)."""
    best = None
    for path in glob.glob(out_prefix + "*-*"):
        if path.endswith("-01"):
            continue  # the main thread (start-up, warm-up submits, waits)
        with open(path, errors="replace") as f:
            text = f.read()
        if THREAD_MARK not in text:
            continue
        m = re.search(r"^totals:\s+(\d+)", text, re.M)
        if m and "start_thread" in text and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), path)
    if best is None:
        raise RuntimeError("no thread profile shows the submit path")
    return best[0]


def count(transport: str, variant: str, block: int, n1: int = 200, n2: int = 1200, form: str = "submit") -> dict:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    toggle: list[str] = []
    if form == "queued":
        if variant != "fast":
            raise SystemExit("--form queued counts inside the fast path's submit(): --variant fast only")
        toggle = [f"--toggle-collect={QUEUED_ENTRY}"]
        n1, n2 = 2 * QUEUED_GROUP, 12 * QUEUED_GROUP
    totals = {}
    with tempfile.TemporaryDirectory(prefix="tent-cg-") as tmp:
        for n in (n1, n2):
            prefix = os.path.join(tmp, f"cg.{n}")
            cmd = ["valgrind", "--tool=callgrind", "--separate-threads=yes", "--dump-instr=no", *toggle,
                   f"--callgrind-out-file={prefix}.%p", sys.executable, "-m", "tent_bench.submit_cost",
                   "--driver", str(n), "--transport", transport, "--variant", variant, "--block", str(block), "--form", form]  # fmt: skip
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if res.returncode != 0:
                raise RuntimeError(f"driver failed under valgrind:\n{res.stderr[-2000:]}")
            totals[n] = _thread_instructions(prefix + ".")
    per = (totals[n2] - totals[n1]) / (n2 - n1)
    out = {"transport": transport, "variant": variant, "block": block, "form": form}
    out["instructions_per_submit" if form in ("submit", "queued") else "instructions_per_round_trip"] = per
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tent_bench.submit_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--variant", choices=("fast", "planner"), default="fast")
    ap.add_argument("--block", type=int, default=64 * 1024)
    ap.add_argument(
        "--form",
        choices=("submit", "wait", "run", "queued"),
        default="submit",
        help="submit: N submits queued, waited for afterwards; wait / run: one request at a time; "
        "queued: the timed --submit-cost loop (groups of 200), counted inside submit() only",
    )
    ap.add_argument("--driver", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.driver:
        driver(args.transport, args.variant, args.block, args.driver, args.form)
        return 0
    print(json.dumps(count(args.transport, args.variant, args.block, form=args.form)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
