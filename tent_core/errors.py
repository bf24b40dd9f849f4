"""Typed errors. Every message says what was asked and why it cannot be done."""

from __future__ import annotations


class TentError(Exception):
    """Base class of every error tent_core raises."""


class InvalidRequestError(TentError, ValueError):
    """A request or registration is malformed (negative length, bad type...)."""


class UnknownSegmentError(TentError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0]) if self.args else "unknown segment"


class NotRegisteredError(TentError):
    """A local or remote range is not inside registered memory."""


class OutOfBoundsError(NotRegisteredError):
    """The range starts inside a registered buffer but runs past its end."""


class PermissionDeniedError(TentError, PermissionError):
    """The remote buffer was registered without the permission this op needs."""


class PeerUnreachableError(TentError, ConnectionError):
    """The peer's control endpoint or every data path to it failed."""


class DeadlineExceededError(TentError, TimeoutError):
    """The request or batch did not complete before its deadline."""


class PeerSilentError(PeerUnreachableError, DeadlineExceededError):
    """The request's deadline passed while every path to its peer stayed down or silent (a stopped
    process, cut links). Both a PeerUnreachableError and a DeadlineExceededError; the message says
    what was tried and for how long."""


class CancelledError(TentError):
    """The batch was cancelled."""


class NoPathError(TentError):
    """No installed transport (nor synthesized path) can serve this request."""


class PolicyRejectedError(NoPathError):
    """Administrator policy rules allow no transport/rail for this request."""


class TransferError(TentError):
    """A transfer failed for a reason not covered above."""


class ConfigError(TentError, ValueError):
    """A configuration value or key the engine or a transport does not accept."""


class PluginABIError(TentError):
    """A plugin's compiled executor does not speak this core's ABI."""


class ProtocolError(TentError):
    """A malformed control-plane message."""


class NotReadyError(TransferError):
    """A waiting READ (``Engine.submit_when``): the target's word did not reach the condition's range
    before the wait ran out, or left it (the bytes are not there yet, or no longer will be)."""
