"""Builds tent_nvlink._executor: a plain C shared library (loaded with ctypes, not imported).

CUDA is never linked: libcudart is dlopen()ed when the executor is created."""

from tent_core.build import build_executor

build_executor(
    "tent_nvlink._executor", ["csrc/nvlink_executor.c"], define_macros=[("_GNU_SOURCE", None)], extra_link_args=["-ldl"]
)
