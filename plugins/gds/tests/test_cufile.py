"""GPU memory <-> file through cuFile in the gds transport, on machines with and without it.

- With NVIDIA's real libcufile (the nvidia-cufile-cu12 wheel, installed by `make install`) but no
  CUDA driver, the transport loads the library, says why cuFile is off, and keeps serving
  host memory <-> file; ``cufile=on`` refuses to start with that reason.
- The executor's cuFile plumbing (buffer and handle registration, per-thread CUDA context,
  offsets, mixed host/GPU batches, teardown without leaks) runs against a stand-in library,
  ``cufile_double.c``, in a child process. Real GPUDirect Storage is checked by
  ``scripts/gpu_check.sh`` on a GPU machine (the ``cuda`` marker).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tent_gds.plugin import GdsTransport, find_cufile_library

from tent_core.errors import InvalidRequestError, PluginABIError
from tent_core.transport import TransportContext
from tent_core.types import MemoryKind

HERE = Path(__file__).parent


def _has_cuda_driver() -> bool:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def _start(**cfg: Any) -> GdsTransport:
    tr = GdsTransport()
    tr.start(TransportContext(engine_id="self", host_id="h", config=cfg, bind_host="127.0.0.1"))
    return tr


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the cuFile stand-in")
    out = tmp_path_factory.mktemp("cufile") / "libcufile_standin.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-Wno-unused-parameter", "-pthread", "-o", str(out),
         str(HERE / "cufile_double.c")],
        check=True,
    )
    return str(out)


def _run(lib: str, work: Path, scenario: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(HERE / "cufile_double_run.py"), lib, str(work), scenario],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "CUFILE_DOUBLE_NO_DEVICE"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_gpu_file_transfers_run_through_cufile(standin: str, tmp_path: Path) -> None:
    r = _run(standin, tmp_path, "active")
    assert r["active"] and r["cuda_pair"] and r["kind"] == "cuda"
    assert r["bufs_after_register"] == 1  # the CUDA buffer was handed to cuFileBufRegister
    assert "overlaps a registered one" in r["overlap_refused"] and r["bufs_after_overlap"] == 1
    assert r["caller_ctx_kept"]  # registration switched to the buffer's context and back
    assert r["read_ok"] and r["write_ok"] and r["mixed_ok"]
    assert r["ro_refused"]
    n = (3 << 20) + 5
    # every GPU byte went through cuFileRead/Write, the host slice through the host engine
    assert r["stats"]["gpu_bytes"] == n + (n - 4101) + (1 << 20)
    assert r["stats"]["buffered_bytes"] + r["stats"]["direct_bytes"] == 1 << 20
    assert r["stats"]["slices_failed"] == 0
    assert r["bufs_after_unregister"] == 0  # unregister -> cuFileBufDeregister
    assert r["handles_before_close"] == 1  # one cuFile handle per file, made on first GPU I/O
    c = r["after_close"]
    assert c["handles_live"] == 0 and c["bufs_live"] == 0
    assert c["driver_open"] == c["driver_close"] == 1
    assert c["ctx_miss"] == 0  # every worker made the buffer's context current first
    assert c["range_miss"] == 0
    assert c["reads"] >= 4 and c["writes"] >= 3


def test_a_file_cufile_refuses_is_served_through_a_bounce_buffer(standin: str, tmp_path: Path) -> None:
    """cuFileHandleRegister refuses the file (a real H200 machine did, for files on its /tmp): the
    request used to be retried on the same refusal until its deadline. Now GPU I/O on that file goes
    through a host bounce buffer, every byte checked, nothing through cuFileRead/Write."""
    r = _run(standin, tmp_path, "refused")
    assert r["active"]
    assert r["read_ok"] and r["write_ok"]
    n = (9 << 20) + 4101
    st = r["stats"]
    assert st["bounce_bytes"] == n + (n - 7) and st["gpu_bytes"] == 0
    assert st["slices_failed"] == 0
    assert r["htod"] >= 3 and r["dtoh"] >= 3  # several bounce rounds each way (8 MiB bounce, 4 MiB chunks)
    c = r["after_close"]
    assert c["reads"] == 0 and c["writes"] == 0 and c["handles_live"] == 0 and c["ctx_miss"] == 0


def test_without_a_device_gpu_file_has_no_path_and_says_why(standin: str, tmp_path: Path) -> None:
    r = _run(standin, tmp_path, "no_device")
    assert not r["active"]
    assert "no usable CUDA device" in r["reason"]
    assert "cuda" in r["no_path"] and "file" in r["no_path"]
    assert r["after_close"]["driver_open"] == 0 and r["after_close"]["bufs_live"] == 0
    assert not r["on_started"]
    assert "cufile=on" in r["on_reason"] and "no usable CUDA device" in r["on_reason"]


@pytest.mark.skipif(find_cufile_library() is None, reason="nvidia-cufile wheel not installed")
@pytest.mark.skipif(_has_cuda_driver(), reason="a CUDA driver is present: the cuda-marked checks cover this")
def test_real_libcufile_without_cuda_driver_reports_why() -> None:
    tr = _start()
    try:
        assert not tr.cufile_active
        assert tr.cufile_reason.startswith("no CUDA driver"), tr.cufile_reason
        assert tr.capabilities().kind_pairs == frozenset({(MemoryKind.HOST, MemoryKind.FILE)})
        assert "cuFile: " in (tr.probe().reason or "")
    finally:
        tr.close()
    with pytest.raises(PluginABIError, match="cufile=on but cuFile is unusable: no CUDA driver"):
        _start(cufile="on")


def test_cufile_off_and_bad_values() -> None:
    tr = _start(cufile="off")
    try:
        assert not tr.cufile_active and "cufile=off" in tr.cufile_reason
    finally:
        tr.close()
    with pytest.raises(InvalidRequestError, match="cufile must be one of"):
        _start(cufile="sometimes")


def test_missing_library_path_is_named(tmp_path: Path) -> None:
    tr = _start(cufile_lib=str(tmp_path / "nope" / "libcufile.so.0"))
    try:
        assert not tr.cufile_active
        assert tr.cufile_reason.startswith("libcufile not found") and "nope" in tr.cufile_reason
    finally:
        tr.close()


@pytest.mark.cuda
def test_real_gpu_file_roundtrip(tmp_path: Path) -> None:
    """On a GPU machine with libcufile: file -> GPU tensor -> another file, bytes compared."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import numpy as np

    from tent_core import Engine

    n = (64 << 20) + 3
    data = np.random.default_rng(11).integers(0, 256, n, dtype=np.uint8)
    src = tmp_path / "src.bin"
    data.tofile(src)
    with Engine(transports=["gds"]) as eng:
        gds = eng.transports["gds"]
        if not gds.cufile_active:
            pytest.skip(f"cuFile unusable here: {gds.cufile_reason}")
        eng.register_file(str(src), segment="src")
        eng.register_file(str(tmp_path / "dst.bin"), segment="dst", size=n)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        buf = eng.register(dev)
        assert buf.kind == MemoryKind.CUDA
        eng.read(buf, eng.segment_name("src"), n, timeout=120)
        assert np.array_equal(dev.cpu().numpy(), data)
        eng.write(buf, eng.segment_name("dst"), n, timeout=120)
        st = gds.stats()  # through cuFile, or its bounce buffer where cuFile refuses the file (an H200 VM's /tmp)
        assert st["gpu_bytes"] + st["bounce_bytes"] == 2 * n
    assert np.array_equal(np.fromfile(tmp_path / "dst.bin", np.uint8), data)


def test_io_of_an_ordered_batch_waits_for_the_cuda_event(standin: str, tmp_path: Path) -> None:
    """Stream ordering on the gds path: the workers hold the cuFile I/O until the request's CUDA
    event is done (the submitter never blocks), and a batch whose event never fires fails at its
    deadline and is finalized."""
    r = _run(standin, tmp_path, "ordered")
    assert r["ordering"] == "native"
    assert r["held"], "the I/O ran before the event was done"
    assert r["done"] and r["ordered_chunks"] >= 3
    assert r["deadline"] != "completed" and r["deadline_s"] < 5
    assert r["finalized"]
