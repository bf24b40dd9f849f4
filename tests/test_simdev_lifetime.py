"""A simulated event outlives its handle while queued work names it (as cudaEventDestroy allows).

The bug this guards against: the engine releases the event it recorded on an application's stream
once the batch is final, which at a deadline is before the stream reached that record. The event
was freed at once; the record ran later, locked the freed mutex and wrote the freed memory: glibc's
heap metadata, found minutes later as a "corrupted double-linked list" abort in unrelated code (a
tcp executor's malloc). Each scenario runs in a fresh interpreter so the live-event count is its
own (no other test's garbage is collected meanwhile) and a heap abort is a failed test, not a lost
run. Under the AddressSanitizer build (scripts/asan-test.sh) the old code fails here with
heap-use-after-free in event_reach."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import time
from tent_core.simdev import SimEvent, SimStream, lib, live_events

def held_stream():
    # a stream held at a gate until we open it: its later work is queued, not run (no timing)
    s = SimStream()
    g = int(lib().sim_gate_create())
    assert g and lib().sim_launch_gate(s.handle, g, 0) == 0
    return s, g

def settle(expected, what):
    end = time.monotonic() + 30
    while live_events() != expected:
        assert time.monotonic() < end, f"{what}: {live_events()} live events, expected {expected}"
        time.sleep(0.01)
"""

SCENARIOS = {
    "record": """
s, g = held_stream()
base = live_events()
ev = SimEvent()
seq = ev.record(s)
ev.close()  # the handle goes while its record is still queued
assert live_events() == base + 1, "freed while a queued record names it"
lib().sim_gate_open(g)
s.synchronize(30)
settle(base, "after the record ran")
s.close()
""",
    "wait_event": """
producer, g = held_stream()
consumer = SimStream()
base = live_events()
ev = SimEvent()
ev.record(producer)
consumer.wait_event(ev)
ev.close()
assert live_events() == base + 1, "freed while a queued record and wait name it"
lib().sim_gate_open(g)
consumer.synchronize(30)
producer.synchronize(30)
settle(base, "after the wait ran")
producer.close()
consumer.close()
""",
    "engine_deadline": """
# the engine's own sequence: a read that waits for a producer stream reaches its deadline, the batch
# is final and the engine lets go of the event it recorded on that stream; the stream runs on later
from tent_core import READ, DeadlineExceededError, Engine, Request
from tent_core.simdev import SimArray, SimDevicePlugin
N = 1 << 20
with Engine(transports=["tcp", "simdev"], plugins=[SimDevicePlugin()]) as eng:
    dev = SimArray(N)
    eng.register(dev, segment="dev")
    host = eng.allocate(N)
    s, g = held_stream()
    base = live_events()
    h = eng.submit([Request(READ, host, 0, eng.segment_name("dev"), 0, N, wait_stream=s)], deadline=0.3)
    try:
        h.wait()
        raise AssertionError("the held read finished")
    except DeadlineExceededError:
        pass
    end = time.monotonic() + 30
    while h._batch.remaining and time.monotonic() < end:
        time.sleep(0.01)
    assert h._batch.remaining == 0
    import gc
    gc.collect()
    assert live_events() >= base + 1, "the engine's mark event was freed while its record is queued"
    lib().sim_gate_open(g)
    s.synchronize(30)
    gc.collect()
    settle(base, "after the stream ran")
    s.close()
""",
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_an_event_outlives_its_handle_while_queued_work_names_it(name):
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(SCENARIOS[name]) + "\nprint('ok')\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), (p.returncode, p.stdout[-2000:], p.stderr[-4000:])
