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
        # a simulated accelerator (device memory, streams, events, the simdev transport's executor) so the
        # core's device paths run in tests on machines without one (tent_core.simdev)
        Extension(
            "tent_core._simdev",
            sources=["tent_core/_native/simdev.c"],
            include_dirs=["tent_core/include"],
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-D_GNU_SOURCE", "-pthread"],
            extra_link_args=["-pthread"],
        ),
    ]
)
