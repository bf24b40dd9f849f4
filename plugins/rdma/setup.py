"""Builds tent_rdma._executor: a plain C shared library (loaded with ctypes, not imported).

libibverbs is dlopen()ed at run time (csrc/verbs_abi.h mirrors the few rdma-core structures the
executor touches): the library has no link-time dependency on rdma-core."""

from tent_core.build import build_executor

build_executor(
    "tent_rdma._executor",
    ["csrc/rdma_executor.c"],
    include_dirs=["csrc"],
    extra_link_args=["-ldl"],
)
