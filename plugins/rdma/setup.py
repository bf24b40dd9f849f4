"""Builds tent_rdma._executor: a plain C shared library (loaded with ctypes, not imported)."""

from __future__ import annotations

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


def _include_dir() -> str:
    try:
        from tent_core.executor import get_include

        inc = get_include()
        if os.path.exists(os.path.join(inc, "tent", "executor_abi.h")):
            return inc
    except Exception:  # tent_core missing or not importable at build time
        pass
    return os.path.normpath(os.path.join(HERE, "..", "..", "tent_core", "include"))


class BuildPlainLibrary(build_ext):
    """The executor exports tent_executor_ops, not PyInit_*: do not demand an init symbol."""

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return ext.export_symbols or []


setup(
    ext_modules=[
        Extension(
            "tent_rdma._executor",
            sources=["csrc/rdma_executor.c"],
            depends=["csrc/verbs_abi.h"],
            include_dirs=[_include_dir(), "csrc"],
            extra_compile_args=["-O2", "-pthread", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            # libibverbs is dlopen()ed at run time: no link-time dependency on rdma-core
            extra_link_args=["-pthread", "-ldl"],
        )
    ],
    cmdclass={"build_ext": BuildPlainLibrary},
)
