"""Build the nvlink executor (never links CUDA: libcudart is dlopen()ed at create time): a plain C shared library (loaded with ctypes, not imported)."""

import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _include_dir() -> str:
    try:
        from tent_core.executor import get_include

        return get_include()
    except Exception:  # tent_core not importable at build time: use the source tree
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tent_core", "include")


class _PlainLibBuildExt(build_ext):
    """The library has no PyInit_ function; do not ask the linker to export one."""

    def get_export_symbols(self, ext):  # noqa: D401
        return []


setup(
    cmdclass={"build_ext": _PlainLibBuildExt},
    ext_modules=[
        Extension(
            "tent_nvlink._executor",
            sources=["csrc/nvlink_executor.c"],
            include_dirs=[_include_dir()],
            extra_compile_args=[
                "-O2",
                "-std=gnu11",
                "-Wall",
                "-Wextra",
                "-Wno-unused-parameter",
                "-fvisibility=hidden",
                "-D_GNU_SOURCE",
            ],
            extra_link_args=["-pthread", "-ldl"],
        )
    ],
)
