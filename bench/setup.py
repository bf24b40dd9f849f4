"""Builds tent_bench._bare, the C helper holding the bare limits the benchmarks compare with."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tent_bench._bare",
            sources=["csrc/bare.c"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ]
)
