"""Real multi-process tests: a reference server process and worker processes moving bytes with tent_core."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import msgpack
import pytest
import zmq

pytest.importorskip("tent_core.engine")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "e2e_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args: list[str]) -> None:
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait(timeout=10)


class Worker(Proc):
    def __init__(self, server: str, replica: str, *extra: str) -> None:
        super().__init__([sys.executable, WORKER, "--server", server, "--replica", replica, *extra])
        first = self.read(30)
        assert first.get("ready"), first

    def read(self, timeout: float = 60) -> dict:
        import select

        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "worker did not answer in time"
        line = self.p.stdout.readline()
        assert line, "worker exited"
        return json.loads(line)

    def send(self, line: str) -> None:
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()

    def cmd(self, line: str, timeout: float = 60) -> dict:
        self.send(line)
        return self.read(timeout)

    def exit(self) -> None:
        if self.p.poll() is None:
            try:
                self.cmd("exit", 20)
            except Exception:
                pass
            self.kill()


# Tests where no process dies: a heartbeat gap under a loaded machine (the suite runs next to other jobs)
# must not make the server drop a live publisher, after which replicate waits for a version nobody holds.
LIVE_HB_TIMEOUT = 6.0


def start_server(hb_timeout: float = 1.5) -> tuple[Proc, str]:
    addr = f"tcp://127.0.0.1:{_free_port()}"
    p = Proc([sys.executable, "-m", "refhub.cli", "serve", "--bind", addr, "--hb-timeout", str(hb_timeout)])
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    for _ in range(100):
        s.send(msgpack.packb({"op": "stats", "rid": 1}))
        if s.poll(200):
            s.recv()
            break
    s.close()
    return p, addr


@pytest.fixture
def procs():
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        if isinstance(p, Worker):
            p.kill()
        else:
            p.kill()


def test_publish_replicate_update_unpublish(procs) -> None:
    srv, addr = start_server(hb_timeout=LIVE_HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer")
    procs.append(t)
    r = Worker(addr, "rollout")
    procs.append(r)
    assert t.cmd("fill 1")["ok"]
    assert t.cmd("publish 1")["ok"]
    rep = r.cmd("replicate latest")
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    assert r.cmd("update")["v"] is None  # nothing newer: immediate no-op
    assert t.cmd("unpublish")["ok"]
    assert t.cmd("fill 2")["ok"] and t.cmd("publish 2")["ok"]
    rep = r.cmd("update")
    assert rep["ok"] and rep["v"] == 2 and rep["data_ok"], rep
    # replicate blocks until the version exists
    r2 = Worker(addr, "rollout2")
    procs.append(r2)
    r2.send("replicate 3")
    # no answer while version 3 does not exist (an immediate reply, error or not, fails here)
    assert select.select([r2.p.stdout], [], [], 1.0)[0] == [], "replicate 3 returned before version 3 existed"
    assert r2.p.poll() is None
    assert t.cmd("unpublish")["ok"] and t.cmd("fill 3")["ok"] and t.cmd("publish 3")["ok"]
    rep = r2.read()
    assert rep["ok"] and rep["v"] == 3 and rep["data_ok"], rep
    lst = r.cmd("list")["list"]
    assert lst["latest"] == 3
    for w in (t, r, r2):
        assert w.cmd("exit")["ok"]


def test_retention_offload(procs) -> None:
    srv, addr = start_server(hb_timeout=LIVE_HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer", "--retain", "1")
    procs.append(t)
    t.cmd("fill 1")
    t.cmd("publish 1")
    rep = t.cmd("unpublish")  # last copy of a retained version: offloaded to CPU first
    assert rep["ok"] and rep["offloads"] == 1, rep
    t.cmd("fill 99")  # the trainer mutates its weights
    r = Worker(addr, "rollout")
    procs.append(r)
    rep = r.cmd("replicate 1")
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    assert "offload" in rep["stats"]["sources"][0][0]
    # A newer version makes v1 unretained; once the rollout holds v1 the offload copy is released.
    t.cmd("fill 2")
    t.cmd("publish 2")
    assert r.cmd('wait {"replicas_at_least": [1, 1]} 5')["met"]
    lst = r.cmd("list")["list"]
    assert 2 in lst["versions"] or "2" in lst["versions"]


def _replicate_chain(procs) -> tuple[list[dict], list[Worker]]:
    """A trainer's 32 MB published once, three throttled rollouts replicating it 50 ms apart (so later
    ones can read an earlier one's partial copy); each verified every byte. Their replies, and them."""
    srv, addr = start_server(hb_timeout=LIVE_HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer", "--size-mb", "32")
    procs.append(t)
    t.cmd("fill 1")
    t.cmd("publish 1")
    rs = [Worker(addr, f"rollout{i}", "--size-mb", "32", "--throttle-mbps", "150") for i in range(3)]
    procs.extend(rs)
    for r in rs:
        r.send("replicate latest")
        time.sleep(0.05)
    reps = [r.read() for r in rs]
    for rep in reps:
        assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    return reps, rs


def test_pipeline_replication_chain(procs) -> None:
    reps, _ = _replicate_chain(procs)
    firsts = [rep["stats"]["sources"][0] for rep in reps]
    assert any(partial for _, partial in firsts), firsts  # a still-receiving replica served a prefix
    assert sum(1 for name, _ in firsts if name == "trainer") == 1, firsts  # the trainer served one reader
    # a reader of a partial copy at its source's pace catches up with it and then reads the source's
    # progress word alone (PROGRESS_PROBE) instead of waiting for its oldest batch only
    # (readers whose READs wait at the source, REFHUB_WAIT_READ where every transport can, need no probe)
    # (at least one of them: a reader whose source finishes before it catches up never needs to probe)
    probes = [rep["stats"]["probes"] for rep in reps if rep["stats"]["sources"][0][1] and not rep["stats"]["wait_read"][0]]
    assert probes and any(p[0] >= 1 for p in probes), probes


@pytest.mark.parametrize("wait_read,wait_full", [("1", "auto"), ("0", "auto"), ("1", "0")])
def test_pipeline_chain_over_tcp_with_and_without_waiting_reads(procs, monkeypatch, wait_read, wait_full) -> None:
    """Every reader of a partial copy posts READs its source does not hold yet, each waiting at the
    source for the source's progress word (REFHUB_WAIT_READ, engine.submit_when; tcp only, so every
    transport to the source can wait); every byte is verified; and the same chain without it. The
    complete copy's reader, throttled to 150 Mbit/s, sends its READs in order as waiting ones too
    (REFHUB_WAIT_FULL "auto": at that rate spread READs would make its progress word lag), unless
    that is off."""
    monkeypatch.setenv("TENT_PLUGINS", "tcp")
    monkeypatch.setenv("REFHUB_WAIT_READ", wait_read)
    monkeypatch.setenv("REFHUB_WAIT_FULL", wait_full)
    reps, rs = _replicate_chain(procs)
    partial = [rep["stats"] for rep in reps if rep["stats"]["sources"][0][1]]
    assert partial, [rep["stats"]["sources"] for rep in reps]  # a still-receiving replica served a prefix
    for st in partial:
        used, batches, _ = st["wait_read"]
        assert used == (wait_read == "1") and (batches > 0) == used, st["wait_read"]
    full = [rep["stats"] for rep in reps if not rep["stats"]["sources"][0][1]]
    assert full, [rep["stats"]["sources"] for rep in reps]
    for st in full:
        used, batches, _ = st["wait_read"]
        in_order = wait_read == "1" and wait_full == "auto"
        assert used == in_order and (batches > 0) == in_order, st["wait_read"]
    # the same reader receiving the same version again, alone: nobody waits on its copy (the server
    # routed no reader to it this time), so it reads in the spread form
    first = next(r for r, rep in zip(rs, reps, strict=True) if not rep["stats"]["sources"][0][1])
    for r in rs:
        assert r.cmd("unpublish")["ok"]
    again = first.cmd("replicate latest", 60)
    assert again["ok"] and again["data_ok"] and again["stats"]["sources"][0] == ["trainer", False], again
    assert not again["stats"]["wait_read"][0], again["stats"]["wait_read"]


def test_waiting_reads_that_time_out_are_reissued(procs, monkeypatch) -> None:
    """A reader far ahead of a slow partial source: its READs wait out REFHUB_WAIT_TIMEOUT_S at the
    source (NotReady), the pull re-issues them from what landed, and every byte is still verified."""
    monkeypatch.setenv("TENT_PLUGINS", "tcp")
    monkeypatch.setenv("REFHUB_WAIT_READ", "1")
    monkeypatch.setenv("REFHUB_WAIT_TIMEOUT_S", "0.01")
    srv, addr = start_server(hb_timeout=LIVE_HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer", "--size-mb", "16")
    procs.append(t)
    t.cmd("fill 1")
    t.cmd("publish 1")
    slow = Worker(addr, "rollout0", "--size-mb", "16", "--throttle-mbps", "8")
    fast = Worker(addr, "rollout1", "--size-mb", "16")
    procs.extend([slow, fast])
    slow.send("replicate latest")
    time.sleep(0.3)
    fast.send("replicate latest")
    reps = [slow.read(), fast.read()]
    for rep in reps:
        assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    st = reps[1]["stats"]
    if st["sources"][0] != ["rollout0", True]:
        pytest.skip(f"the server gave the second reader {st['sources'][0]}, not the slow partial copy")
    used, batches, reissued = st["wait_read"]
    assert used and batches > 0 and reissued > 0, st["wait_read"]


def test_source_death_mid_transfer(procs) -> None:
    srv, addr = start_server()
    procs.append(srv)
    t = Worker(addr, "trainer", "--size-mb", "64")
    procs.append(t)
    t.cmd("fill 1")
    t.cmd("publish 1")
    a = Worker(addr, "rolloutA", "--size-mb", "64", "--throttle-mbps", "60")
    procs.append(a)
    b = Worker(addr, "rolloutB", "--size-mb", "64")
    procs.append(b)
    a.send("replicate latest")
    time.sleep(0.3)
    b.send("replicate latest")  # least-loaded source: A, still receiving (pipeline)
    time.sleep(0.3)
    a.kill()  # SIGKILL the partial source mid-transfer
    rep = b.read(60)
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    srcs = rep["stats"]["sources"]
    assert srcs[0] == ["rolloutA", True], srcs
    assert ["trainer", False] in srcs[1:], srcs
    # the trainer can still unpublish (the dead reader's reservation is released by its heartbeat timeout)
    t0 = time.monotonic()
    assert t.cmd("unpublish", 30)["ok"]
    assert time.monotonic() - t0 < 10


def test_server_death_with_backup(procs) -> None:
    srv, addr = start_server()
    procs.append(srv)
    bsrv, baddr = start_server()
    procs.append(bsrv)
    t = Worker(addr, "trainer", "--backup", baddr)
    procs.append(t)
    r = Worker(addr, "rollout", "--backup", baddr)
    procs.append(r)
    t.cmd("fill 1")
    t.cmd("publish 1")
    assert r.cmd("replicate latest")["v"] == 1
    srv.kill()
    time.sleep(2.5)  # clients notice (failover_after=1s) and re-register with the backup
    st = r.cmd("state")
    assert st["server"] == baddr and st["state"] == "idle", st  # reset to unpublished
    assert r.cmd("check 1")["data_ok"]  # still holds its weights for inference
    t.cmd("fill 2")
    assert t.cmd("publish 2")["ok"]
    rep = r.cmd("update")
    assert rep["ok"] and rep["v"] == 2 and rep["data_ok"], rep


def test_bad_messages_server_keeps_serving(procs) -> None:
    srv, addr = start_server(hb_timeout=LIVE_HB_TIMEOUT)
    procs.append(srv)
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(addr)
    bad = [b"\xc1\xff garbage", msgpack.packb([1, 2, 3]), msgpack.packb({"op": "nope", "rid": 5}),
           msgpack.packb({"op": "publish", "rid": 6, "h": "x", "version": 1}), msgpack.packb("str"),
           msgpack.packb({"op": "open", "rid": 7, "model": "m", "replica": "r", "shard": 3, "num_shards": 2})]
    for b in bad:
        s.send(b)
        assert s.poll(2000)
        rep = msgpack.unpackb(s.recv(), strict_map_key=False)
        reps = rep if isinstance(rep, list) else [rep]
        assert all(x["ok"] is False and x["err"] == "bad_message" for x in reps), reps
    s.send(msgpack.packb({"op": "stats", "rid": 9}))
    assert s.poll(2000)
    rep = msgpack.unpackb(s.recv(), strict_map_key=False)
    assert rep["ok"] and rep["errors"] >= len(bad)
    s.close()


def test_copy_mode_staging_across_processes(procs) -> None:
    """Copy-mode tensors are served through the holder's staging slots; every combination of
    copy/direct on either side lands the right bytes, and a reallocated tensor needs no engine
    registration before it is published again."""
    srv, addr = start_server(hb_timeout=LIVE_HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer", "--mode", "copy", "--size-mb", "12")
    procs.append(t)
    r = Worker(addr, "rollout", "--size-mb", "12")  # direct mode, reading from a copy-mode source
    procs.append(r)
    t.cmd("fill 1")
    assert t.cmd("publish 1")["ok"]
    rep = r.cmd("replicate latest")
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    assert rep["stats"]["staged_slices"] >= 3 and rep["stats"]["verified"], rep["stats"]
    # a copy-mode receiver, first from the copy-mode trainer, then (trainer gone) from the direct rollout
    c = Worker(addr, "rollout-copy", "--mode", "copy", "--size-mb", "12")
    procs.append(c)
    rep = c.cmd("replicate 1")
    assert rep["ok"] and rep["data_ok"], rep
    assert c.cmd("unpublish")["ok"]
    assert t.cmd("unpublish")["ok"]
    rep = c.cmd("replicate 1")
    assert rep["ok"] and rep["data_ok"] and rep["stats"]["sources"][0][0] == "rollout", rep
    # the trainer reallocates its tensors: re-registering in copy mode touches no engine memory
    rep = t.cmd("realloc")
    assert rep["ok"] and rep["register_s"] < 0.05, rep
    t.cmd("fill 2")
    assert t.cmd("publish 2")["ok"]
    rep = r.cmd("update")
    assert rep["ok"] and rep["v"] == 2 and rep["data_ok"], rep


def test_copy_mode_source_death_reroutes(procs) -> None:
    """A copy-mode pipeline source killed mid-transfer: the reader's stage requests go unanswered,
    it reports the source failed and finishes from the trainer with correct checksums."""
    srv, addr = start_server()
    procs.append(srv)
    t = Worker(addr, "trainer", "--size-mb", "48")
    procs.append(t)
    t.cmd("fill 1")
    t.cmd("publish 1")
    a = Worker(addr, "rolloutA", "--mode", "copy", "--size-mb", "48", "--throttle-mbps", "60")
    procs.append(a)
    b = Worker(addr, "rolloutB", "--size-mb", "48")
    procs.append(b)
    a.send("replicate latest")
    time.sleep(0.3)
    b.send("replicate latest")  # served by A (partial, copy mode)
    time.sleep(0.3)
    a.kill()
    rep = b.read(60)
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"], rep
    srcs = rep["stats"]["sources"]
    assert srcs[0] == ["rolloutA", True] and ["trainer", False] in srcs[1:], srcs


def test_torch_cpu_tensors(procs) -> None:
    pytest.importorskip("torch")
    srv, addr = start_server(hb_timeout=LIVE_HB_TIMEOUT)
    procs.append(srv)
    t = Worker(addr, "trainer", "--torch")
    procs.append(t)
    r = Worker(addr, "rollout", "--torch")
    procs.append(r)
    rc = Worker(addr, "rollout-copy", "--torch", "--mode", "copy")
    procs.append(rc)
    t.cmd("fill 1")
    assert t.cmd("publish 1")["ok"]
    rep = r.cmd("replicate latest")
    assert rep["ok"] and rep["v"] == 1 and rep["data_ok"] and rep["stats"]["verified"], rep
    rep = rc.cmd("replicate 1")
    assert rep["ok"] and rep["data_ok"], rep
    assert t.cmd("unpublish")["ok"] and t.cmd("realloc")["ok"] and t.cmd("fill 2")["ok"]
    assert t.cmd("publish 2")["ok"]
    rep = rc.cmd("update")
    assert rep["ok"] and rep["v"] == 2 and rep["data_ok"], rep
