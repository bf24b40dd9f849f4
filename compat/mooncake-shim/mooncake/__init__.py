"""TENT's stand-in for the `mooncake` package: only `mooncake.engine` (TransferEngine) is provided.

Installed by the opt-in distribution tent-mooncake-shim; see its README."""

TENT_SHIM = True
