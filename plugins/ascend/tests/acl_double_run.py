"""Drive the ascend transport against the CANN stand-in (acl_double.c) and print what happened as
JSON. Runs in its own process (the test starts it): the ACL library is loaded once per process.
Usage: TENT_ASCENDCL=LIB acl_double_run.py LIB"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np

from tent_core import READ, READ_ONLY, WRITE, Engine, PermissionDeniedError, Request
from tent_core.testing import pattern


def counters(lib: ctypes.CDLL) -> dict[str, int]:
    out = (ctypes.c_longlong * 6)()
    lib.acl_double_counters(out)
    return dict(zip(("h2h", "h2d", "d2h", "d2d", "bad_kind", "bad_device"), (int(v) for v in out), strict=True))


def main() -> None:
    lib_path = sys.argv[1]
    double = ctypes.CDLL(lib_path)
    from tent_ascend.acl import NpuBuffer

    res: dict = {}
    n = (5 << 20) + 77
    cfg = {"transports": {"ascend": {"chunk": 1 << 20, "threads": 3}},
           "target_staging_chunk_bytes": 1 << 20}
    with Engine(cfg, transports=["tcp", "ascend"]) as eng:
        res["available"] = eng.availability["ascend"].available
        npu0, npu1 = NpuBuffer(n, 0), NpuBuffer(n, 1)
        b0 = eng.register(npu0, segment="npu0")
        eng.register(npu1, segment="npu1")
        ro = NpuBuffer(4096, 0)
        eng.register(ro, segment="ro", perm=READ_ONLY)
        host = eng.allocate(n, segment="host")
        host.array[:] = pattern(n, 3)
        eng.transfer(WRITE, host, 0, eng.segment_name("npu0"), 0, n)  # host -> NPU 0
        res["h2d_ok"] = bool(np.array_equal(npu0.download(), pattern(n, 3)))
        eng.transfer(WRITE, b0, 0, eng.segment_name("npu1"), 0, n)  # NPU 0 -> NPU 1
        res["d2d_ok"] = bool(np.array_equal(npu1.download(), pattern(n, 3)))
        out = eng.allocate(n, segment="out")
        eng.transfer(READ, out, 0, eng.segment_name("npu1"), 0, n)  # NPU 1 -> host
        res["d2h_ok"] = bool(np.array_equal(out.array, pattern(n, 3)))
        try:
            eng.submit([Request(WRITE, host, 0, eng.segment_name("ro"), 0, 4096)])
            res["ro_refused"] = False
        except PermissionDeniedError:
            res["ro_refused"] = True
        res["stats"] = eng.transports["ascend"].stats()
        res["offer"] = eng.describe()["staging"]
        # another engine without the NPU transport: the first one stages for it (over TCP)
        with Engine(transports=["tcp"]) as other:
            src = other.allocate(n)
            src.array[:] = pattern(n, 8)
            ex = other.explain(Request(WRITE, src, 0, eng.segment_name("npu0"), 0, n))
            res["explain"] = ex.chosen
            other.transfer(WRITE, src, 0, eng.segment_name("npu0"), 0, n, timeout=60)
            res["staged_ok"] = bool(np.array_equal(npu0.download(), pattern(n, 8)))
            back = other.allocate(n)
            other.transfer(READ, back, 0, eng.segment_name("npu0"), 0, n, timeout=60)
            res["staged_back_ok"] = bool(np.array_equal(back.array, pattern(n, 8)))
        res["counters"] = counters(double)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
