"""Deterministic simulated concurrency against the pure ServerState (FoundationDB-style).

One process plays every client. Each client is a generator script (trainer, rollout, offload
replica) that talks to the server through FIFO channels; a seeded scheduler interleaves message
delivery, reply delivery, client steps and clock ticks, and injects failures by halting clients.

Buffers are modelled chunk by chunk (each chunk holds the version last written into it), with a
version-tagged progress counter for pipeline replication. Invariants checked on every step:

- a read of chunk i from a source always finds the version it expects (no read ever sees a buffer
  that is being mutated: the server never lets a holder mutate while it is a source);
- a completed replica holds the version it was told in every chunk (end-to-end checksum);
- all shards of a replica get the same answer to their k-th transactional call;
- retained versions always have a non-spot copy of every shard (unless a non-spot holder failed);
- the server's own structural invariants.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from refhub.protocol import E_UNAVAILABLE
from refhub.state import PUBLISHED, ServerState

CHUNKS = 4
HB_EVERY = 0.3
HB_TIMEOUT = 2.0


class Halted(Exception):
    pass


class SimClient:
    def __init__(self, sim: Sim, name: str, replica: str, shard: int, num_shards: int, *, dc: str = "A",
                 spot: bool = False, kind: str = "normal", retain: int = 0, model: str = "m") -> None:
        self.sim = sim
        self.name = name
        self.replica = replica
        self.shard = shard
        self.num_shards = num_shards
        self.dc = dc
        self.spot = spot
        self.kind = kind
        self.retain = retain
        self.model = model
        self.buf: list[int | None] = [None] * CHUNKS
        self.counter: tuple[int | None, int] = (None, 0)  # (version tag, chunks available)
        self.outbox: deque = deque()
        self.inbox: deque = deque()
        self.events: deque = deque()
        self.waiting: int | None = None  # rid awaited
        self.reply: dict | None = None
        self.gen = None
        self.halted = False
        self.done = False
        self.h: int | None = None
        self.last_hb = 0.0
        self.rid = 0
        self.txn_seq = 0
        self.completed = 0

    # -- script helpers (generators)
    def call(self, op: str, **fields):
        self.rid += 1
        msg = {"op": op, "rid": self.rid, **fields}
        if self.h is not None and op not in ("open", "hb"):
            msg["h"] = self.h
        self.outbox.append(msg)
        self.waiting = self.rid
        yield ("wait",)
        rep = self.reply
        self.reply = None
        if rep.get("err") == "unknown_handle":
            raise Halted(self.name)  # our replica was declared failed: this worker restarts (ends here)
        if op in ("replicate", "update", "list", "wait"):
            k = fields.get("txn", self.txn_seq)
            if "txn" not in fields:
                self.txn_seq += 1
            if not rep.get("offload"):
                self.sim.record_txn(self, k, op, rep)
        return rep

    def offload(self, v: int):
        """Offload the last copy of a retained version to "CPU" and publish it as an offload replica."""
        off = self.sim.spawn(f"{self.name}~off{v}", f"{self.replica}~off{v}", self.shard, self.num_shards, dc=self.dc,
                             kind="offload", retain=self.retain, script=offload_script)
        off.buf = list(self.buf)
        off.counter = (v, CHUNKS)
        off.offload_version = v
        while not getattr(off, "published", False):
            if off.halted:
                break
            yield from self.step()

    def txn_call(self, op: str, **fields):
        r = yield from self.call(op, **fields)
        while r.get("offload"):
            yield from self.offload(r["version"])
            r = yield from self.call(op, txn=r["txn"], **fields)
        return r

    def step(self):
        yield ("step",)

    def open(self):
        rep = yield from self.call("open", model=self.model, replica=self.replica, shard=self.shard,
                                   num_shards=self.num_shards, datacenter=self.dc, spot=self.spot,
                                   kind=self.kind, retain={"keep_latest": self.retain})
        assert rep["ok"], rep
        self.h = rep["h"]
        self.sim.by_hid[self.h] = self

    def transfer(self, rep: dict):
        """Pull rep['version'] chunk by chunk from rep['src'] (pipeline-aware, re-routes on failure)."""
        v = rep["version"]
        src = self.sim.by_hid[rep["src"]["h"]]
        partial = rep["src"]["partial"]
        self.counter = (v, 0)
        i = 0
        stalls = 0
        while i < CHUNKS:
            yield from self.step()
            failed = src.halted
            if not failed:
                tag, avail = src.counter
                if not partial or src.buf_complete(v):
                    avail = CHUNKS  # a complete source is read directly, without looking at its counter
                elif tag != v:
                    avail = 0
                if i < avail:
                    got = src.buf[i]
                    assert got == v, f"{self.name} read chunk {i} of v{v} from {src.name} and found v{got} (mutated source!)"
                    self.buf[i] = v
                    i += 1
                    self.counter = (v, i)
                    stalls = 0
                    continue
                stalls += 1
                if stalls % 3:
                    continue
            r = yield from self.call("progress", done=i, failed=failed)
            if not r["ok"]:
                assert r["err"] == E_UNAVAILABLE, r
                self.counter = (None, 0)
                return False
            if "src" in r:
                src = self.sim.by_hid[r["src"]["h"]]
                partial = r["src"]["partial"]
        assert all(c == v for c in self.buf), f"{self.name}: checksum mismatch {self.buf} != v{v}"
        r = yield from self.call("replicate_done", ok=True)
        assert r["ok"], r
        self.completed += 1
        return True

    def buf_complete(self, v: int) -> bool:
        return self.counter == (v, CHUNKS) or (self.counter[0] is None and all(c == v for c in self.buf))


def trainer_script(c: SimClient, rounds: int):
    yield from c.open()
    v = 1
    c.buf = [v] * CHUNKS
    c.counter = (v, CHUNKS)
    for _ in range(rounds):
        r = yield from c.call("publish", version=v)
        assert r["ok"], r
        c.sim.published_pairs.add((v, c.shard))
        for _ in range(c.sim.rng.randint(0, 6)):
            yield from c.step()
        if c.sim.trainer_waits:
            r = yield from c.txn_call("wait", pred={"replicas_at_least": [v, 2]}, timeout=1.0)
            assert r["ok"], r
        while True:
            r = yield from c.call("unpublish")
            assert r["ok"], r
            if not r.get("offload"):
                break
            yield from c.offload(v)
        # Mutate the weights (training), chunk by chunk.
        c.counter = (None, 0)
        for i in range(CHUNKS):
            c.buf[i] = v + 1
            yield from c.step()
        v += 1
        c.counter = (v, CHUNKS)
    c.done = True


def offload_script(c: SimClient):
    yield from c.open()
    r = yield from c.call("publish", version=c.offload_version)
    assert r["ok"], r
    c.published = True
    while True:
        while not c.events:
            yield from c.step()
        ev = c.events.popleft()
        assert ev["ev"] == "release"
        r = yield from c.call("unpublish")
        if r["ok"]:
            break
        assert r.get("keep"), r
    r = yield from c.call("close")
    assert r["ok"], r
    c.done = True


def rollout_script(c: SimClient, rounds: int, use_replicate: bool):
    yield from c.open()
    if use_replicate:
        r = yield from c.txn_call("replicate", version="latest", ref={})
        if r["ok"] and "src" in r:
            yield from c.transfer(r)
    for _ in range(rounds):
        r = yield from c.txn_call("update", ref={})
        if r["ok"] and "src" in r:
            yield from c.transfer(r)
        else:
            for _ in range(c.sim.rng.randint(1, 5)):
                yield from c.step()
    c.done = True


class Sim:
    def __init__(self, seed: int, *, num_shards: int, trainers: int, rollouts: int, retain: int,
                 fail_spot_only: bool, dcs: tuple[str, ...] = ("A",), rounds: int = 4) -> None:
        self.rng = random.Random(seed)
        self.server = ServerState(hb_timeout=HB_TIMEOUT, barrier_timeout=30.0)
        self.now = 0.0
        self.clients: list[SimClient] = []
        self.by_hid: dict[int, SimClient] = {}
        self.txn_answers: dict[tuple[str, int], tuple] = {}
        self.nonspot_failed = False
        self.fail_spot_only = fail_spot_only
        self.retain = retain
        self.trainer_waits = self.rng.random() < 0.5
        self.published_pairs: set[tuple[int, int]] = set()
        self.trainer_waits = self.rng.random() < 0.5
        self.published_pairs: set[tuple[int, int]] = set()
        for t in range(trainers):
            for s in range(num_shards):
                self.spawn(f"t{t}s{s}", f"trainer{t}", s, num_shards, dc=dcs[0], retain=retain,
                           script=lambda c: trainer_script(c, rounds))
        for r in range(rollouts):
            spot = self.rng.random() < 0.5
            dc = self.rng.choice(dcs)
            use_rep = self.rng.random() < 0.5
            for s in range(num_shards):
                self.spawn(f"r{r}s{s}", f"rollout{r}", s, num_shards, dc=dc, spot=spot, retain=retain,
                           script=lambda c, u=use_rep: rollout_script(c, rounds * 2, u))

    def spawn(self, name, replica, shard, num_shards, *, script, **kw) -> SimClient:
        c = SimClient(self, name, replica, shard, num_shards, **kw)
        c.gen = script(c)
        c.last_hb = self.now
        self.clients.append(c)
        return c

    def record_txn(self, c: SimClient, k: int, op: str, rep: dict) -> None:
        sig = (op, rep.get("ok"), rep.get("err"), rep.get("version"), bool(rep.get("noop")), rep.get("met"))
        if rep.get("err") == "bad_state":
            return
        key = (c.replica, k)
        prev = self.txn_answers.setdefault(key, sig)
        if sig[2] == E_UNAVAILABLE or prev[2] == E_UNAVAILABLE:
            return  # a follower may find its reserved source gone after a failure: graceful error, no divergence in version
        assert prev[:4] == sig[:4] and prev[4] == sig[4], f"replica {c.replica} call {k}: {prev} vs {sig}"

    def deliver(self, replies) -> None:
        for client_name, rep in replies:
            c = self.named[client_name]
            if c.halted:
                continue
            if "ev" in rep:
                c.events.append(rep)
            else:
                c.inbox.append(rep)

    def run(self, steps: int) -> None:
        self.named = {c.name: c for c in self.clients}
        for _ in range(steps):
            self.named = {c.name: c for c in self.clients}
            live = [c for c in self.clients if not c.halted and not c.done]
            actions = []
            senders = [c for c in self.clients if c.outbox and not c.halted]
            if senders:
                actions.append(("send", 5))
            recv = [c for c in live if c.inbox and c.waiting is not None]
            if recv:
                actions.append(("recv", 5))
            runnable = [c for c in live if c.waiting is None]
            if runnable:
                actions.append(("run", 5))
            actions.append(("tick", 1))
            if self.rng.random() < 0.004:
                actions.append(("halt", 1))
            kinds = [a for a, _ in actions]
            weights = [w for _, w in actions]
            act = self.rng.choices(kinds, weights)[0]
            if act == "send":
                c = self.rng.choice(senders)
                msg = c.outbox.popleft()
                self.deliver(self.server.handle(c.name, msg, self.now))
            elif act == "recv":
                c = self.rng.choice(recv)
                rep = c.inbox.popleft()
                if rep.get("rid") == c.waiting:
                    c.waiting = None
                    c.reply = rep
                    self.resume(c)
            elif act == "run":
                self.resume(self.rng.choice(runnable))
            elif act == "tick":
                self.now += 0.05
                for c in self.clients:
                    if c.h is not None and not c.halted and self.now - c.last_hb > HB_EVERY:
                        c.last_hb = self.now
                        c.outbox.append({"op": "hb", "rid": 0, "hs": [c.h]})
                self.deliver(self.server.tick(self.now))
            elif act == "halt":
                cands = [c for c in live if c.kind == "normal" and (c.spot or not self.fail_spot_only)]
                if cands:
                    victim = self.rng.choice(cands)
                    victim.halted = True
                    victim.outbox.clear()
                    if not victim.spot:
                        self.nonspot_failed = True
            self.server.check_invariants()
            self.check_retention()

    def resume(self, c: SimClient) -> None:
        try:
            c.gen.send(None)
        except StopIteration:
            c.done = True
        except Halted:
            c.done = True
            c.h = None

    def check_retention(self) -> None:
        if self.nonspot_failed or self.retain == 0:
            return
        for model in self.server.models.values():
            for v in self.server._retained(model):
                per = model.holders.get(v)
                assert per is not None, f"retained version {v} lost"
                for s, hs in enumerate(per):
                    if (v, s) not in self.published_pairs:
                        continue
                    assert any(h.state == PUBLISHED and not h.replica.spot for h in hs) or any(
                        h.replica.spot is False and h.complete for h in hs
                    ), f"retained version {v} shard {s} has no non-spot copy"


CONFIGS = [
    dict(num_shards=1, trainers=1, rollouts=3, retain=1, fail_spot_only=True),
    dict(num_shards=2, trainers=1, rollouts=3, retain=1, fail_spot_only=True),
    dict(num_shards=2, trainers=2, rollouts=4, retain=2, fail_spot_only=False),
    dict(num_shards=3, trainers=1, rollouts=4, retain=0, fail_spot_only=False),
    dict(num_shards=2, trainers=1, rollouts=4, retain=1, fail_spot_only=True, dcs=("A", "B")),
]


@pytest.mark.parametrize("seed", range(200))
def test_random_interleavings(seed: int) -> None:
    cfg = CONFIGS[seed % len(CONFIGS)]
    sim = Sim(seed, **cfg)
    sim.run(2500)
    # Liveness: somebody replicated something unless every rollout was halted early.
    if cfg["retain"] and any(not c.halted for c in sim.clients if c.name.startswith("r")):
        assert sum(c.completed for c in sim.clients) > 0


def test_halted_reader_releases_source() -> None:
    """A reader that dies mid-transfer must not block the source's unpublish forever."""
    s = ServerState(hb_timeout=1.0)
    out = s.handle("T", {"op": "open", "rid": 1, "model": "m", "replica": "t", "shard": 0, "num_shards": 1}, 0.0)
    th = out[0][1]["h"]
    out = s.handle("R", {"op": "open", "rid": 1, "model": "m", "replica": "r", "shard": 0, "num_shards": 1}, 0.0)
    rh = out[0][1]["h"]
    s.handle("T", {"op": "publish", "rid": 2, "h": th, "version": 1}, 0.0)
    out = s.handle("R", {"op": "replicate", "rid": 2, "h": rh, "version": "latest"}, 0.0)
    assert out[0][1]["src"]["h"] == th
    assert s.handle("T", {"op": "unpublish", "rid": 3, "h": th}, 0.1) == []  # waits for the read
    s.handle("T", {"op": "hb", "rid": 0, "hs": [th]}, 1.0)
    out = s.tick(1.5)  # reader silent past the timeout: removed, the drain completes
    assert out == [("T", {"rid": 3, "ok": True})]


def test_update_noop_and_relative_versions() -> None:
    s = ServerState()
    th = s.handle("T", {"op": "open", "rid": 1, "model": "m", "replica": "t", "shard": 0, "num_shards": 1}, 0)[0][1]["h"]
    rh = s.handle("R", {"op": "open", "rid": 1, "model": "m", "replica": "r", "shard": 0, "num_shards": 1}, 0)[0][1]["h"]
    assert s.handle("R", {"op": "update", "rid": 2, "h": rh}, 0)[0][1]["noop"]
    # replicate blocks until the version exists; publish releases it
    assert s.handle("R", {"op": "replicate", "rid": 3, "h": rh, "version": 2}, 0) == []
    s.handle("T", {"op": "publish", "rid": 2, "h": th, "version": 1}, 0)
    out = s.handle("T", {"op": "unpublish", "rid": 3, "h": th}, 0)
    assert out[0][1]["ok"]
    out = s.handle("T", {"op": "publish", "rid": 4, "h": th, "version": 2}, 0)
    assert [r for c, r in out if c == "R"][0]["version"] == 2
    out = s.handle("R", {"op": "replicate", "rid": 4, "h": rh, "version": "latest-1"}, 0)
    assert out[0][1]["err"] == E_UNAVAILABLE  # replica is receiving -> bad_state or unavailable


def test_a_partial_copy_is_told_when_a_reader_is_routed_to_it() -> None:
    """Pipeline replication: the server routes a second reader to the first one's still-receiving copy
    and tells that copy's handle ("serving"), so its pull keeps the progress word close behind its
    landed bytes; a complete copy gets no such event, nor does a copy once it is complete."""
    s = ServerState()

    def opened(client: str, replica: str) -> int:
        return s.handle(client, {"op": "open", "rid": 1, "model": "m", "replica": replica, "shard": 0,
                                 "num_shards": 1}, 0)[0][1]["h"]

    th, r1, r2, r3 = opened("T", "t"), opened("R1", "r1"), opened("R2", "r2"), opened("R3", "r3")
    s.handle("T", {"op": "publish", "rid": 2, "h": th, "version": 1}, 0)
    out = s.handle("R1", {"op": "replicate", "rid": 2, "h": r1, "version": "latest", "ref": {}}, 0)
    assert [rep["src"]["h"] for c, rep in out if c == "R1"] == [th]
    assert not [rep for _, rep in out if "ev" in rep]  # the publisher's copy is complete
    out = s.handle("R2", {"op": "replicate", "rid": 2, "h": r2, "version": "latest", "ref": {}}, 0)
    reply = [rep for c, rep in out if c == "R2"][0]
    assert reply["src"]["h"] == r1 and reply["src"]["partial"], reply
    assert ("R1", {"ev": "serving", "h": r1, "version": 1}) in out
    s.handle("R1", {"op": "replicate_done", "rid": 3, "h": r1, "ok": True}, 0)
    out = s.handle("R3", {"op": "replicate", "rid": 2, "h": r3, "version": "latest", "ref": {}}, 0)
    reply = [rep for c, rep in out if c == "R3"][0]
    assert not reply["src"]["partial"], reply
    assert not [rep for _, rep in out if "ev" in rep]
    s.check_invariants()
