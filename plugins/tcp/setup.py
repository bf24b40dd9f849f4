"""Builds tent_tcp._executor: a plain C shared library (loaded with ctypes, not imported)."""

from tent_core.build import build_executor

build_executor("tent_tcp._executor", ["csrc/tcp_executor.c"])
