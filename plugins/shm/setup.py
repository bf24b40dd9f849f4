"""Builds tent_shm._executor: a plain C shared library (loaded with ctypes, not imported)."""

from tent_core.build import build_executor

build_executor("tent_shm._executor", ["csrc/shm_executor.c"], define_macros=[("_GNU_SOURCE", None)])
