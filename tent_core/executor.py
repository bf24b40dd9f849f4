"""Loading a plugin's compiled slice executor behind the versioned C ABI.

See ``tent_core/include/tent/executor_abi.h``. Plugins call :func:`load_executor_library`
on their shared library and :meth:`ExecutorLibrary.create` to get an :class:`Executor`,
which the engine's native submit path drives directly (no Python per slice).
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import logging
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

from . import _native
from .errors import PluginABIError

log = logging.getLogger(__name__)

EXECUTOR_ABI_VERSION = _native.EXECUTOR_ABI_VERSION


class _Ops(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("create", ctypes.c_void_p),
        ("destroy", ctypes.c_void_p),
        ("submit", ctypes.c_void_p),
    ]


_CREATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
_DESTROY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def get_include() -> str:
    """Directory holding ``tent/executor_abi.h``, for plugin builds (see :mod:`tent_core.build`)."""
    from .build import get_include as _get_include

    return _get_include()


def find_extension(package_dir: str | os.PathLike[str], stem: str) -> str:
    """Locate a compiled library `stem` (built as an extension module) inside a package dir."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        cand = Path(package_dir) / f"{stem}{suffix}"
        if cand.exists():
            return str(cand)
    raise FileNotFoundError(f"compiled executor {stem!r} not found in {package_dir} (was the plugin built?)")


class Executor:
    """One live executor instance. `ops` and `handle` are raw pointers for the native submit.

    The native submit path accepts only registered executors: close() retires the handle first
    (waiting for submits inside the executor to return), so a submit racing with close gets
    TENT_E_INTERNAL instead of reaching freed memory."""

    def __init__(self, library: ExecutorLibrary, handle: int) -> None:
        self.library = library
        self.handle = handle
        self.ops = library.ops_address
        self._lock = threading.Lock()
        _native.executor_register(self.ops, handle)

    def close(self) -> None:
        with self._lock:
            if self.handle:
                handle, self.handle = self.handle, 0
                _native.executor_retire(self.ops, handle)
                self.library._destroy(handle)


class ExecutorLibrary:
    """A dlopen'ed executor library whose ABI version was checked."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.cdll = ctypes.CDLL(path)
        try:
            entry = self.cdll.tent_executor_ops
        except AttributeError as exc:
            raise PluginABIError(f"{path}: no tent_executor_ops symbol") from exc
        entry.restype = ctypes.c_void_p
        entry.argtypes = []
        addr = entry()
        if not addr:
            raise PluginABIError(f"{path}: tent_executor_ops() returned NULL")
        ops = _Ops.from_address(addr)
        if ops.abi_version != EXECUTOR_ABI_VERSION:
            raise PluginABIError(
                f"{path}: executor ABI version {ops.abi_version}, this tent_core speaks {EXECUTOR_ABI_VERSION}"
            )
        if ops.struct_size < ctypes.sizeof(_Ops):
            raise PluginABIError(f"{path}: executor ops table too small ({ops.struct_size} bytes)")
        self.ops_address = addr
        self.name = (ops.name or b"?").decode()
        self._create = _CREATE(ops.create)
        self._destroy = _DESTROY(ops.destroy)

    def create(self, config: dict[str, object] | None = None) -> Executor:
        items = [(str(k), str(v)) for k, v in (config or {}).items()]
        for k, v in items:  # the C side splits on these: a path holding one would be misread
            if not k or any(c in k for c in ";= ") or ";" in v:
                raise PluginABIError(f"executor {self.name}: config entry {k!r}={v!r} cannot hold ';' (or '=' in the key)")
        cfg = ";".join(f"{k}={v}" for k, v in items).encode()
        err = ctypes.create_string_buffer(512)
        handle = self._create(_native.host_api_address(), cfg, err, len(err))
        if not handle:
            raise PluginABIError(f"executor {self.name}: create failed: {err.value.decode(errors='replace')}")
        try:
            return Executor(self, handle)
        except BaseException:
            self._destroy(handle)
            raise


_libraries: dict[str, ExecutorLibrary] = {}
_libraries_lock = threading.Lock()


def load_executor_library(path: str) -> ExecutorLibrary:
    with _libraries_lock:
        lib = _libraries.get(path)
        if lib is None:
            lib = _libraries[path] = ExecutorLibrary(path)
        return lib


class PluginLibrary:
    """A plugin's compiled executor library plus ctypes handles on its private (non-ABI) exports.

    Subclasses set ``PREFIX`` and ``PROTOTYPES`` (``{name: (restype, argtypes)}`` for functions
    exported as ``PREFIX + name``); each becomes an attribute ``name``. Construct with the
    plugin's package directory, which holds the library built as ``_executor``.
    """

    PREFIX: ClassVar[str] = ""
    PROTOTYPES: ClassVar[dict[str, tuple[Any, list[Any]]]] = {}

    def __init__(self, package_dir: str | os.PathLike[str], stem: str = "_executor") -> None:
        self.library = load_executor_library(find_extension(package_dir, stem))
        for name, (restype, argtypes) in self.PROTOTYPES.items():
            fn = getattr(self.library.cdll, self.PREFIX + name)
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
