"""TENT transport plugin: TCP.

Multi-rail TCP with several persistent connections per (peer, rail); the data path is a
compiled slice executor (``tent_tcp._executor``) driven by the core's native submit.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "TcpTransport"]


def __getattr__(name: str) -> object:  # lazy: importing the package must stay cheap
    if name == "TcpTransport":
        from .transport import TcpTransport

        return TcpTransport
    raise AttributeError(name)
