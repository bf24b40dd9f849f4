"""Builds tent_gds._executor: a plain C shared library (loaded with ctypes, not imported)."""

from tent_core.build import build_executor

build_executor("tent_gds._executor", ["csrc/gds_executor.c"], define_macros=[("_GNU_SOURCE", None)])
