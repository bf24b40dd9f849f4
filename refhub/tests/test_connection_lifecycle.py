"""A client whose reference server went away: its handles' re-open retries never hold up a close()
nor the exit of the process (a test that failed before closing its handles used to hang the
interpreter's exit for the whole retry budget, 50 x the request timeout)."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
import time

import pytest

pytest.importorskip("tent_core.engine")

from refhub.server import start_embedded, stop_embedded  # noqa: E402

from refhub import client as C  # noqa: E402
from tent_core import Engine  # noqa: E402

# Waiting for the retries costs at least REOPEN_ATTEMPTS x REQUEST_TIMEOUT (100 s: FAILOVER_AFTER is
# longer than a request, so no failover cuts an attempt short); what is waited for here with the fix is
# at most one attempt and one close request (4 s): the bound sits far from both.
REQUEST_TIMEOUT = 2.0
FAILOVER_AFTER = 10.0
BOUND_S = 40.0


class _Seen(logging.Handler):
    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text = text
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


def test_close_does_not_wait_for_the_reopen_retries() -> None:
    addr = start_embedded(hb_timeout=3.0)
    seen = _Seen("re-open attempt")
    logging.getLogger("refhub.client").addHandler(seen)
    try:
        with Engine(transports=["tcp"]) as eng:
            h = C.open("lc", replica="r", server=addr, engine=eng, hb_interval=0.1, failover_after=FAILOVER_AFTER,
                       request_timeout=REQUEST_TIMEOUT)
            stop_embedded(addr)
            assert seen.event.wait(120), "the handle never tried to re-open after the server went away"
            t0 = time.monotonic()
            h.close()
            assert time.monotonic() - t0 < BOUND_S
    finally:
        logging.getLogger("refhub.client").removeHandler(seen)
        stop_embedded(addr)


def test_a_process_with_a_handle_left_open_exits() -> None:
    script = textwrap.dedent(f"""
        import logging, sys, threading
        from refhub import client as C
        from refhub.server import start_embedded, stop_embedded
        from tent_core import Engine

        retrying = threading.Event()

        class Seen(logging.Handler):
            def emit(self, record):
                if "re-open attempt" in record.getMessage():
                    retrying.set()

        logging.getLogger("refhub.client").addHandler(Seen(logging.WARNING))
        addr = start_embedded(hb_timeout=3.0)
        eng = Engine(transports=["tcp"])
        h = C.open("lc", replica="r", server=addr, engine=eng, hb_interval=0.1, failover_after={FAILOVER_AFTER},
                   request_timeout={REQUEST_TIMEOUT})
        stop_embedded(addr)
        if not retrying.wait(120):
            sys.exit(3)
        print("exiting", flush=True)  # the handle is left open, its re-open retries running
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]  # the script bounds its own wait (120 s)
        assert line.strip() == "exiting", (line, proc.poll())
        assert proc.wait(BOUND_S) == 0
    except (subprocess.TimeoutExpired, AssertionError) as exc:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"the process did not exit cleanly: {exc!r}; stderr: {err[-2000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
