from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "tent_core._native",
            sources=["tent_core/_native/native.c"],
            include_dirs=["tent_core/include"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-D_GNU_SOURCE"],
        ),
        # a fault-injecting executor (plain C library behind the executor ABI) for resilience tests
        Extension(
            "tent_core._fault_executor",
            sources=["tent_core/_native/fault_executor.c"],
            include_dirs=["tent_core/include"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-D_GNU_SOURCE"],
        ),
    ]
)
