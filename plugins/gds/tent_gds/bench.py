"""Throughput of the gds executor next to the real ``fio`` (io_uring engine) on the same file.

    python -m tent_gds.bench --size 1G --block 1M --rw read --direct 1 [--dir /var/tmp | --path FILE]

prints one JSON object: fio GB/s, ours, and the ratio. Both sides use the same file, size,
block size, worker count (fio numjobs = our threads, each job owning 1/numjobs of the
file) and queue depth (fio iodepth = our queue_depth). O_DIRECT is not real direct I/O on
tmpfs: there ``direct`` is forced to 0 for both and the result says so.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(s: str | int) -> int:
    if isinstance(s, int):
        return s
    s = s.strip().lower().removesuffix("ib").removesuffix("b")
    return int(float(s[:-1]) * _UNITS[s[-1]]) if s and s[-1] in _UNITS else int(s)


def _aligned(n: int, align: int = 4096) -> np.ndarray:
    raw = np.empty(n + align, np.uint8)
    off = (-raw.ctypes.data) % align
    arr = raw[off : off + n]
    arr[::4096] = 0  # fault the pages in before timing
    return arr


def prepare_file(path: str, size: int) -> None:
    """Create `path` with `size` bytes of non-zero data (once; reused when already that size)."""
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    block = np.random.default_rng(0).integers(1, 256, 16 << 20, dtype=np.uint8).tobytes()
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())


def direct_possible(path: str) -> bool:
    from .plugin import is_tmpfs, open_direct

    if is_tmpfs(path):
        return False
    fd = open_direct(path, False)
    if fd < 0:
        return False
    os.close(fd)
    return True


def fio_baseline(
    path: str, size: int, block: int, rw: str = "read", *, direct: bool = False, numjobs: int = 2, iodepth: int = 16
) -> tuple[float, list[str]]:
    """GB/s (1e9 B/s) of fio's io_uring engine on `path`; also returns the command line."""
    fio = shutil.which("fio")
    if fio is None:
        raise RuntimeError("fio not installed (apt-get install -y fio)")
    per_job = (size // numjobs) // block * block
    cmd = [
        fio,
        "--name=tent-gds-baseline",
        f"--filename={path}",
        "--ioengine=io_uring",
        f"--rw={rw}",
        f"--bs={block}",
        f"--size={per_job}",
        f"--offset_increment={per_job}",
        f"--numjobs={numjobs}",
        f"--iodepth={iodepth}",
        f"--direct={int(direct)}",
        "--thread",
        "--group_reporting",
        "--invalidate=0",
        "--output-format=json",
    ]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    key = "read" if "read" in rw else "write"
    return job[key]["bw_bytes"] / 1e9, cmd


def gds_throughput(
    path: str,
    size: int,
    block: int,
    rw: str = "read",
    *,
    direct: bool = False,
    threads: int = 2,
    queue_depth: int = 16,
    engine: str = "auto",
    repeat: int = 3,
) -> tuple[float, dict[str, Any]]:
    """Median GB/s of our executor moving the whole file in one slice (split in `block` chunks)."""
    from tent_core import _native, rails  # noqa: F401  (rails sets the telemetry array)
    from tent_core.transport import TransportContext
    from tent_core.types import MemoryKind, PeerInfo, Permission

    from .plugin import GdsTransport

    tr = GdsTransport()
    tr.start(
        TransportContext(
            engine_id="bench",
            host_id="bench",
            config={
                "engine": engine,
                "threads": threads,
                "queue_depth": queue_depth,
                "chunk": block,
                "direct": int(direct),
            },
            bind_host="127.0.0.1",
        )
    )
    try:
        base = 1 << 52
        peer = PeerInfo("bench", "bench", os.getpid(), {"gds": {}})
        rb = {
            "addr": base,
            "length": size,
            "perm": int(Permission.READ_WRITE),
            "kind": MemoryKind.FILE.value,
            "desc": {"gds": {"path": os.path.abspath(path), "perm": int(Permission.READ_WRITE)}},
        }
        h = tr.connect(peer, [rb]).handle
        buf = _aligned(size)
        op = 0 if "read" in rw else 1
        ex = tr.executor
        rates = []
        for _ in range(repeat):
            b = _native.Batch(1)
            t0 = time.perf_counter()
            rc = _native.submit_one(ex.ops, ex.handle, b, op, buf.ctypes.data, base, size, h, 0, 0, 0)
            if rc != 0 or not b.wait(600) or b.error != 0:
                raise RuntimeError(f"gds transfer failed: rc={rc} error={b.error}")
            rates.append(size / (time.perf_counter() - t0) / 1e9)
        info = {"engine": tr.io_engine, "rates": rates, "stats": tr.stats(), **tr.executor_config()}
        return statistics.median(rates), info
    finally:
        tr.close()


def compare(
    path: str, size: int, block: int, rw: str, *, direct: bool, threads: int, queue_depth: int, repeat: int = 3
) -> dict[str, Any]:
    prepare_file(path, size)
    note = ""
    if direct and not direct_possible(path):
        direct = False
        note = "O_DIRECT not possible on this filesystem (tmpfs?): both sides buffered"
    fio_rates = []
    cmd: list[str] = []
    for _ in range(repeat):
        r, cmd = fio_baseline(path, size, block, rw, direct=direct, numjobs=threads, iodepth=queue_depth)
        fio_rates.append(r)
    ours, info = gds_throughput(
        path, size, block, rw, direct=direct, threads=threads, queue_depth=queue_depth, repeat=repeat
    )
    fio = statistics.median(fio_rates)
    return {
        "path": path,
        "size": size,
        "block": block,
        "rw": rw,
        "direct": direct,
        "threads": threads,
        "queue_depth": queue_depth,
        "fio_gbps": round(fio, 3),
        "fio_runs": [round(x, 3) for x in fio_rates],
        "fio_cmd": " ".join(cmd),
        "gds_gbps": round(ours, 3),
        "gds_runs": [round(x, 3) for x in info["rates"]],
        "gds_engine": info["engine"],
        "ratio": round(ours / fio, 3) if fio else None,
        "note": note,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default=None, help="benchmark file (default: a fresh one in a private directory under --dir)")
    ap.add_argument("--dir", default=os.environ.get("TMPDIR", "/var/tmp"), help="where the default file goes (a disk, not tmpfs)")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--block", default="1M")
    ap.add_argument("--rw", default="read", choices=["read", "write"])
    ap.add_argument("--direct", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--queue-depth", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="keep a --path file this run created")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # the default file lives in a directory private to this run (mode 0700), removed at the end:
    # a fixed name in a shared directory would collide with (or reuse) another user's file
    private = tempfile.mkdtemp(prefix="tent-gds-bench-", dir=a.dir) if a.path is None else None
    path = a.path or os.path.join(private, "data.bin")
    created = not os.path.exists(path)
    try:
        res = compare(
            path,
            parse_size(a.size),
            parse_size(a.block),
            a.rw,
            direct=bool(a.direct),
            threads=a.threads,
            queue_depth=a.queue_depth,
            repeat=a.repeat,
        )
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
        elif created and not a.keep and os.path.exists(path):
            os.unlink(path)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
