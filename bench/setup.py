"""Builds tent_bench._bare, the C helper holding the bare limits the benchmarks compare with."""

from setuptools import Extension, setup

from tent_core.build import get_include  # tent/busy_poll.h: the tcp executor's polling rule, shared

setup(
    ext_modules=[
        Extension(
            "tent_bench._bare",
            sources=["csrc/bare.c"],
            include_dirs=[get_include()],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ]
)
