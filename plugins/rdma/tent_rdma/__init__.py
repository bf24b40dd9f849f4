"""TENT transport plugin: RDMA (libibverbs, loaded at run time; pyverbs optional for discovery).

One-sided RDMA READ/WRITE over RC queue pairs, several NICs (rails) per host; the data path is
a compiled slice executor (``tent_rdma._executor``) driven by the core's native submit.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "RdmaTransport"]


def __getattr__(name: str) -> object:  # lazy: importing the package must stay cheap
    if name == "RdmaTransport":
        from .transport import RdmaTransport

        return RdmaTransport
    raise AttributeError(name)
