"""Building a transport plugin's compiled executor (used from a plugin's ``setup.py``).

Import-light on purpose: it needs setuptools and nothing else (no numpy, no pyzmq, no compiled
part of tent_core), so it works inside an isolated PEP 517 build environment that holds only
the plugin's build requirements (``setuptools`` and ``tent-core``). A plugin's whole
``setup.py`` is::

    from tent_core.build import build_executor

    build_executor("tent_mine._executor", ["csrc/mine_executor.c"])

The executor is a plain shared library: it exports ``tent_executor_ops`` (see
``tent/executor_abi.h``, shipped inside the tent-core wheel, :func:`get_include`) and no
``PyInit_*``; the core loads it with ctypes. It is built through setuptools' ``build_ext`` so
it gets the interpreter's extension suffix and lands inside the package, where
:func:`tent_core.executor.find_extension` finds it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Flags every executor is built with. -fvisibility=hidden: only symbols marked
# __attribute__((visibility("default"))) are exported (tent_executor_ops and the plugin's own
# private entry points); everything else stays internal to the library.
COMPILE_ARGS: tuple[str, ...] = (
    "-O2",
    "-std=gnu11",
    "-Wall",
    "-Wextra",
    "-Wno-unused-parameter",
    "-fvisibility=hidden",
    "-pthread",
)
LINK_ARGS: tuple[str, ...] = ("-pthread",)


def get_include() -> str:
    """The directory holding ``tent/executor_abi.h`` and the other public headers."""
    inc = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")
    if not os.path.isfile(os.path.join(inc, "tent", "executor_abi.h")):
        raise FileNotFoundError(f"tent-core headers missing from {inc}: reinstall tent-core")
    return inc


class BuildPlainLibrary(build_ext):
    """``build_ext`` for libraries that are not Python modules: no ``PyInit_*`` is demanded."""

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return list(ext.export_symbols or [])


def executor_extension(
    name: str,
    sources: Sequence[str],
    *,
    include_dirs: Sequence[str] = (),
    extra_compile_args: Sequence[str] = (),
    extra_link_args: Sequence[str] = (),
    libraries: Sequence[str] = (),
    define_macros: Sequence[tuple[str, str | None]] = (),
) -> Extension:
    """An :class:`Extension` for executor `name` (e.g. ``"tent_mine._executor"``) with the
    tent-core headers on the include path and the standard flags (extra ones are appended)."""
    return Extension(
        name,
        sources=list(sources),
        include_dirs=[*include_dirs, get_include()],
        extra_compile_args=[*COMPILE_ARGS, *extra_compile_args],
        extra_link_args=[*LINK_ARGS, *extra_link_args],
        libraries=list(libraries),
        define_macros=list(define_macros),
    )


def build_executor(name: str, sources: Sequence[str], **kwargs: Any) -> None:
    """Run ``setup()`` for a plugin whose only compiled part is the executor `name`.

    Keyword arguments go to :func:`executor_extension`; the rest of the metadata comes from
    the plugin's ``pyproject.toml``."""
    setup(ext_modules=[executor_extension(name, sources, **kwargs)], cmdclass={"build_ext": BuildPlainLibrary})
