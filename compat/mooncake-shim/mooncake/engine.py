"""`mooncake.engine` backed by TENT: `TransferEngine` is tent_core.compat.mooncake.TransferEngine."""

from tent_core.compat.mooncake import TransferEngine, TransferNotify, TransferOpcode

# Build flags of Mooncake's extension module: this engine has none of the vendor-specific builds
# (GPUs and RDMA NICs are TENT plugins, chosen at run time).
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False
SUPPORT_CUDA = False

__all__ = ["TransferEngine", "TransferNotify", "TransferOpcode"]
