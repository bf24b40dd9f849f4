"""Plain data types shared by the engine, the policies and the plugins."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class OpCode(enum.IntEnum):
    READ = 0  # remote -> local
    WRITE = 1  # local -> remote


READ = OpCode.READ
WRITE = OpCode.WRITE


class Priority(enum.IntEnum):
    HIGH = 0
    MID = 1
    LOW = 2


class Permission(enum.IntFlag):
    """What remote peers may do with a registered buffer."""

    NONE = 0
    READ = 1
    WRITE = 2
    READ_WRITE = 3


READ_ONLY = Permission.READ
READ_WRITE = Permission.READ_WRITE


class MemoryKind(str, enum.Enum):
    HOST = "host"
    CUDA = "cuda"
    FILE = "file"
    NPU = "npu"  # Huawei Ascend device memory (CANN runtime; the tent-ascend plugin)
    # device-like memory simulated for tests (tent_core.simdev): host code cannot dereference its
    # addresses, only the test transport `simdev` copies it, so the core's device paths run on CPU
    SIM = "sim"

    @property
    def is_device(self) -> bool:
        """Accelerator memory: reached from host memory only through a device runtime's copies."""
        return self in DEVICE_KINDS


DEVICE_KINDS = frozenset({MemoryKind.CUDA, MemoryKind.NPU, MemoryKind.SIM})


@dataclass(frozen=True)
class Availability:
    available: bool
    reason: str = ""

    @classmethod
    def ok(cls) -> Availability:
        return cls(True, "")

    @classmethod
    def unavailable(cls, reason: str) -> Availability:
        return cls(False, reason)


@dataclass(frozen=True)
class CapabilityProfile:
    """What a transport can serve: (local kind, remote kind) pairs and locality.

    `rank` orders transports that can both serve a request: lower is preferred.
    """

    kind_pairs: frozenset[tuple[MemoryKind, MemoryKind]]
    same_host: bool
    cross_host: bool
    rank: int = 100
    # Typical rate of one request through this transport, for comparing paths by cost (direct vs
    # staged: tent_core.routing.path_cost). 0 = unknown: the planner assumes a default by locality.
    bandwidth_gbps: float = 0.0
    # A file transport whose reads go through the page cache: a read-only shared mapping of a file it
    # serves shows the bytes it would read, so the core may send from such a mapping instead of
    # staging (tent_core.mapped). False where it reads around the cache (O_DIRECT).
    page_cache_files: bool = False
    # Its sends from host memory copy in the kernel (send/sendmsg), never in user space: a source
    # page that vanished (a mapped file truncated under it) fails the call with EFAULT instead of
    # killing the process with SIGBUS, so a file mapping may be its source.
    kernel_copy_sends: bool = False

    def serves(self, local: MemoryKind, remote: MemoryKind, same_host: bool) -> bool:
        if same_host and not self.same_host:
            return False
        if not same_host and not self.cross_host:
            return False
        return (local, remote) in self.kind_pairs


@dataclass
class BufferInfo:
    """One registered local buffer, as transports see it."""

    segment: str
    offset: int  # offset of this buffer inside its segment's address space
    addr: int
    length: int
    kind: MemoryKind
    device: int = -1
    perm: Permission = Permission.READ_WRITE
    # Engine-allocated buffers backed by a memfd carry it here (shm plugin uses it).
    memfd: int = -1
    path: str | None = None  # file-backed buffers
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RailInfo:
    """One path between this engine and a peer for one transport."""

    index: int  # rail index passed to the executor in tent_slice.rail
    name: str  # e.g. "198.18.0.1->198.18.0.2"
    nominal_gbps: float = 0.0  # 0 = unknown
    penalty: float = 1.0  # topology penalty multiplier (>= 1)
    numa_node: int = -1  # NUMA node of the local NIC (-1 = unknown / not applicable)
    pci: str = ""  # PCI address of the local NIC ("" = unknown / not applicable)


@dataclass
class PeerLink:
    """What a transport returns from connect(): an executor peer handle and its rails."""

    handle: int
    rails: list[RailInfo]
    # Translate a remote address for the executor, when the transport needs it.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PeerInfo:
    """A remote engine as seen through the metadata exchange."""

    engine_id: str  # host:port of the peer's control endpoint
    host_id: str
    pid: int
    transports: dict[str, dict[str, Any]]  # transport name -> its local_descriptor()
    # What the peer stages for others (tent_core.target_staging): the device kinds it copies to
    # and from its own host staging buffers, chunk size and rates; empty when it does not.
    staging: dict[str, Any] = field(default_factory=dict)
