"""refhub: Reference-Oriented Storage for model weights.

    import refhub
    h = refhub.open("policy", replica="trainer", shard=0, num_shards=1, server="tcp://127.0.0.1:5555")
    h.register("w", weights)       # numpy array or CPU torch tensor (zero-copy "direct" mode)
    h.register("e", emb, mode="copy")  # reallocated often: served via pre-registered staging slots
    h.publish(1)                   # reference passing: only metadata goes to the server
    ...
    r = refhub.open("policy", replica="rollout-3", server=...)
    r.register("w", buffer)
    r.replicate("latest")          # blocks until it exists, READs it from a peer via tent_core
"""

from __future__ import annotations

from .client import (
    ChecksumError,
    Connection,
    RefhubError,
    ServerFailover,
    ShardHandle,
    VersionUnavailable,
    checksum,
    default_engine,
    open,
    query,
)
from .state import ServerState

__version__ = "0.1.0"

__all__ = [
    "ChecksumError",
    "Connection",
    "RefhubError",
    "ServerFailover",
    "ServerState",
    "ShardHandle",
    "VersionUnavailable",
    "checksum",
    "default_engine",
    "open",
    "query",
]
