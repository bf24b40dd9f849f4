"""Weight sync for RL frameworks on refhub: trainer ranks publish a state dict, rollout workers receive
each version in place.

The shape follows verl's checkpoint-engine interface (``prepare``, ``build_topology``,
``init_process_group``, async ``send_weights(generator of (name, tensor))``, async
``receive_weights()`` yielding ``(name, tensor)``, ``finalize``), with what refhub adds:

- **every trainer rank sends**: the model is split into ``trainer_world_size`` shards by a fixed hash of
  the tensor name; trainer rank *r* publishes shard *r* (the tensors of its shard it sees in the
  generator) and skips the others, so no rank funnels the whole model;
- **versions**: ``send_weights`` publishes version ``v`` (default: the previous one + 1); a rollout
  receives a given version, or the next one after what it holds;
- **in place**: a rollout registers its preallocated tensors by name once
  (``register_receive_buffers``); CPU tensors are written directly by the data plane (no copy), CUDA
  tensors through one pinned host mirror each (one host-to-device copy after the bytes arrive);
- **no process group**: the reference server is the rendezvous, so rollouts can join, leave or die
  without rebuilding anything; a receiving rollout serves the bytes it has to the others (pipeline
  replication), and every byte is checksummed end to end.

By default (``copy=True``) a trainer rank copies its tensors into host snapshots it owns and publishes
those, so it may change its parameters as soon as ``send_weights`` returns; the previous version is
unpublished first (which waits until reads of it drain). ``copy=False`` publishes CPU tensors in
place instead: they must then stay unchanged until the next ``send_weights``.

Sync API for code without an event loop: ``publish(weights, version)``, ``receive(version)``,
``wait_received(version, replicas)``. torch tensors (CPU or CUDA) and numpy arrays both work.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import zlib
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from . import client as _client

log = logging.getLogger("refhub.checkpoint")

TRAINER = "trainer"
ROLLOUT = "rollout"


def shard_of(name: str, num_shards: int) -> int:
    """The trainer rank that publishes tensor `name` (a fixed hash: every process agrees without talking)."""
    return zlib.crc32(name.encode()) % num_shards if num_shards > 1 else 0


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch")


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size()) if _is_torch(t) else int(t.nbytes)


def _on_cuda(t: Any) -> bool:
    return _is_torch(t) and t.device.type != "cpu"


def _host_buffer(nbytes: int, pinned: bool) -> Any:
    """Host memory for a snapshot or a mirror: pinned torch memory when a GPU is involved."""
    if pinned:
        import torch

        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    return np.empty(nbytes, np.uint8)


def _bytes_view(t: Any) -> Any:
    """A flat uint8 view of a contiguous tensor/array (no copy)."""
    if _is_torch(t):
        import torch

        if not t.is_contiguous():
            raise ValueError("tensors must be contiguous")
        return t.detach().reshape(-1).view(torch.uint8)
    if not t.flags.c_contiguous:
        raise ValueError("arrays must be C-contiguous")
    return t.reshape(-1).view(np.uint8)


def _copy(dst: Any, src: Any) -> None:
    """dst <- src, both flat uint8 (numpy or torch, host or device)."""
    if _is_torch(dst) or _is_torch(src):
        import torch

        d = dst if _is_torch(dst) else torch.from_numpy(dst)
        s = src if _is_torch(src) else torch.from_numpy(src)
        d.copy_(s)
    else:
        np.copyto(dst, src)


class RefhubCheckpointEngine:
    """verl-style checkpoint engine on refhub. One instance per trainer rank or rollout worker."""

    def __init__(
        self,
        bucket_size: int = 0,
        *,
        server: str,
        model: str = "policy",
        copy: bool = True,
        engine: Any = None,
        timeout: float = 300.0,
        retain: dict | None = None,
        datacenter: str = "default",
    ) -> None:
        # bucket_size: verl passes it to every backend; refhub needs no buckets (large tensors are
        # served in place, tensors under 2 MB are packed into one buffer per shard by refhub itself)
        self.bucket_size = bucket_size
        self.server = server
        self.model = model
        self.copy = copy
        self.engine = engine
        self.timeout = timeout
        self.retain = retain
        self.datacenter = datacenter
        self.role: str | None = None
        self.rank = 0
        self.num_shards = 1
        self.version: int | None = None  # last version sent (trainer) or held (rollout)
        self._handles: list[Any] = []
        self._snap: dict[str, Any] = {}  # trainer, copy mode: name -> host snapshot
        self._targets: dict[str, Any] = {}  # rollout: name -> the caller's tensor
        self._mirrors: dict[str, Any] = {}  # rollout: name -> host mirror of a CUDA tensor
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ verl lifecycle
    def prepare(self) -> dict[str, Any]:
        """Nothing to allocate up front: the metadata only says where this worker runs."""
        return {"server": self.server, "model": self.model, "host": socket.gethostname(), "pid": os.getpid()}

    @classmethod
    def build_topology(
        cls, trainer_world_size: int, rollout_world_size: int, metadata: list[dict]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Trainer rank r publishes shard r of `trainer_world_size`; every rollout receives all shards."""
        if trainer_world_size < 1:
            raise ValueError("trainer_world_size must be >= 1")
        servers = {m.get("server") for m in metadata if m}
        if len(servers) > 1:
            raise ValueError(f"workers disagree on the refhub server: {sorted(map(str, servers))}")
        t, r = trainer_world_size, rollout_world_size
        trainer = {"role": [TRAINER] * t, "rank": list(range(t)), "world_size": [t] * t}
        rollout = {"role": [ROLLOUT] * r, "rank": list(range(r)), "world_size": [t] * r}
        return trainer, rollout

    def init_process_group(self, role: str, rank: int, world_size: int, **_: Any) -> None:
        """Open this worker's shard handle(s). Calling it again with the same topology keeps them."""
        if role not in (TRAINER, ROLLOUT):
            raise ValueError(f"role must be {TRAINER!r} or {ROLLOUT!r}, not {role!r}")
        if world_size < 1 or rank < 0 or (role == TRAINER and rank >= world_size):
            raise ValueError(f"rank {rank} does not fit trainer world size {world_size}")
        if self._handles and (self.role, self.rank, self.num_shards) == (role, rank, world_size):
            return
        self._close_handles()
        self.role, self.rank, self.num_shards = role, rank, world_size
        if role == TRAINER:
            self._handles = [self._open(TRAINER, rank)]
        else:
            self._handles = [self._open(f"{ROLLOUT}-{rank}", s) for s in range(world_size)]
            for name, t in list(self._targets.items()):
                self._register_target(name, t)

    def finalize(self) -> None:
        """Per-step cleanup: nothing (handles and snapshots are reused by the next step; close() frees them)."""

    async def send_weights(self, weights: Iterable[tuple[str, Any]], version: int | None = None) -> int:
        """Publish `weights` as `version` (default: the previous version + 1); returns the version."""
        staged = self._stage(weights)  # runs in the caller's thread: generators may need it (CUDA, collectives)
        return await asyncio.to_thread(self._publish, staged, version)

    async def receive_weights(self, version: int | None = None) -> AsyncIterator[tuple[str, Any]]:
        """Receive `version` (default: the next one after what this worker holds) into the registered
        tensors, then yield them by name."""
        await asyncio.to_thread(self.receive, version)
        for name, t in self._targets.items():
            yield name, t

    # ------------------------------------------------------------------ sync API
    def publish(self, weights: Iterable[tuple[str, Any]] | dict[str, Any], version: int | None = None) -> int:
        return self._publish(self._stage(weights), version)

    def register_receive_buffers(self, named: Iterable[tuple[str, Any]] | dict[str, Any]) -> None:
        """A rollout's preallocated tensors, by name: each received version lands in them."""
        items = named.items() if isinstance(named, dict) else named
        for name, t in items:
            self._targets[name] = t
            if self._handles:
                self._register_target(name, t)

    def receive(self, version: int | None = None, timeout: float | None = None) -> int:
        """Block until `version` (None: a version newer than the one held) arrived in place; returns it."""
        if self.role != ROLLOUT or not self._handles:
            raise RuntimeError("receive() needs init_process_group(role='rollout', ...) first")
        if not self._targets:
            raise RuntimeError("register_receive_buffers() first: refhub receives into preallocated tensors")
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        want: int | str = version if version is not None else "latest"
        if version is None and self.version is not None:
            # every shard handle takes part, so the replica's transactions stay aligned
            for h in self._handles:
                if not h.wait({"version_at_least": self.version + 1}, timeout=max(0.1, deadline - time.monotonic())):
                    raise TimeoutError(f"no version after {self.version} of {self.model!r} within {timeout:g}s")
        t0 = time.monotonic()
        got = self._each_handle(lambda h: h.replicate(want, timeout=max(0.1, deadline - time.monotonic())))
        if len(set(got)) != 1:
            raise RuntimeError(f"shards received different versions: {got}")
        for name, mirror in self._mirrors.items():
            _copy(_bytes_view(self._targets[name]), mirror)
        self.version = got[0]
        nbytes = sum(_nbytes(t) for t in self._targets.values())
        log.info("%s rank %d received %s v%d (%d bytes) in %.3fs", self.role, self.rank, self.model, self.version,
                 nbytes, time.monotonic() - t0)
        return self.version

    def wait_received(self, version: int, replicas: int, timeout: float | None = None) -> None:
        """Block until `replicas` rollout workers hold `version` completely (not a collective)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        need = replicas + (1 if self.role == TRAINER else 0)  # the trainer's own replica holds it too
        while True:
            info = _client.query(self.server, {"op": "list", "model": self.model}, timeout=5.0)
            have = info.get("versions", {}).get(version, {}).get("replicas", 0)
            if have >= need:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{have - (need - replicas)}/{replicas} rollouts hold v{version} after the timeout")
            time.sleep(0.02)

    def close(self) -> None:
        self._close_handles()
        self._snap.clear()
        self._mirrors.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> RefhubCheckpointEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _open(self, replica: str, shard: int) -> Any:
        return _client.open(self.model, replica=replica, shard=shard, num_shards=self.num_shards, server=self.server,
                            engine=self.engine, retain=self.retain, datacenter=self.datacenter,
                            request_timeout=self.timeout)

    def _close_handles(self) -> None:
        for h in self._handles:
            try:
                h.close()
            except Exception as exc:  # a dead server must not keep the worker from shutting down
                log.warning("closing a refhub handle failed: %s", exc)
        self._handles = []

    def _each_handle(self, fn: Any) -> list[Any]:
        if len(self._handles) == 1:
            return [fn(self._handles[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=min(8, len(self._handles)), thread_name_prefix="refhub-ckpt")
        return list(self._pool.map(fn, self._handles))

    def _register_target(self, name: str, t: Any) -> None:
        h = self._handles[shard_of(name, self.num_shards)]
        if _on_cuda(t):
            mirror = self._mirrors.get(name)
            if mirror is None or _nbytes(mirror) != _nbytes(t):
                mirror = self._mirrors[name] = _host_buffer(_nbytes(t), pinned=True)
            h.register(name, mirror)
        else:
            self._mirrors.pop(name, None)
            h.register(name, _bytes_view(t))

    def _stage(self, weights: Iterable[tuple[str, Any]] | dict[str, Any]) -> dict[str, Any]:
        """The tensors of this rank's shard, ready to publish (copied into owned snapshots by default)."""
        if self.role != TRAINER or not self._handles:
            raise RuntimeError("send_weights() needs init_process_group(role='trainer', ...) first")
        items = weights.items() if isinstance(weights, dict) else weights
        self._handles[0].unpublish(timeout=self.timeout)  # waits until reads of the previous version drained
        staged: dict[str, Any] = {}
        for name, t in items:
            if shard_of(name, self.num_shards) != self.rank:
                continue
            if not self.copy:
                if _on_cuda(t):
                    raise ValueError(f"{name}: copy=False publishes tensors in place, which needs CPU memory")
                staged[name] = _bytes_view(t)
                continue
            n = _nbytes(t)
            snap = self._snap.get(name)
            if snap is None or _nbytes(snap) != n:
                snap = self._snap[name] = _host_buffer(n, pinned=_on_cuda(t))
            _copy(snap, _bytes_view(t))
            staged[name] = snap
        return staged

    def _publish(self, staged: dict[str, Any], version: int | None) -> int:
        v = (self.version or 0) + 1 if version is None else int(version)
        if self.version is not None and v <= self.version:
            raise ValueError(f"version {v} is not newer than {self.version}, which this rank already sent")
        h = self._handles[0]
        for name in [n for n in h.items if n not in staged]:
            h.unregister(name)
        for name, buf in staged.items():
            it = h.items.get(name)
            if it is None or it.keep is not buf:
                h.register(name, buf)
        for name in [n for n in self._snap if n not in staged]:
            del self._snap[name]  # tensors that left the model
        t0 = time.monotonic()
        h.publish(v)
        self.version = v
        log.info("trainer rank %d published %s v%d: %d tensors, %d bytes (%.3fs)", self.rank, self.model, v, len(staged),
                 sum(_nbytes(b) for b in staged.values()), time.monotonic() - t0)
        return v


def register_verl_backend(name: str = "refhub") -> bool:
    """Make `RefhubCheckpointEngine` selectable in verl (``checkpoint_engine.backend=refhub``).
    Returns False when verl is not installed."""
    try:
        from verl.checkpoint_engine.base import CheckpointEngineRegistry  # type: ignore[import-not-found]
    except ImportError:
        return False
    CheckpointEngineRegistry.register(name)(RefhubCheckpointEngine)
    return True


__all__ = ["RefhubCheckpointEngine", "register_verl_backend", "shard_of"]
