"""Builds tent_ascend._executor: a plain C shared library (loaded with ctypes, not imported)."""

from tent_core.build import build_executor

build_executor("tent_ascend._executor", ["csrc/ascend_executor.c"], define_macros=[("_GNU_SOURCE", None)],
               extra_link_args=["-ldl"])
