"""A/B of the staged pipeline's shape, interleaved transfer by transfer in one engine.

The O_DIRECT file stage of `tent bench --path file:tcp --config '{"transports": {"gds": {"direct":
1}}}'` moves between 0.2 and 2.7 GB/s from one transfer to the next on a shared VM, so whole runs
(or rounds) of two builds compared one after the other say nothing. This runs, in one engine and
one target process, one transfer of each case per cycle, the order rotated every cycle: the file
stage alone (file -> local memory), the tcp stage alone (local memory -> remote), and the staged
path (file -> staging -> tcp, mapped paths off) once per variant `DEPTH[:CHUNKS]` (the pool's
`first_depth` = config staging_first_depth, and `chunks` = staging_chunks, set between transfers).
Prints each case's median GB/s and, per variant against the first, the median of the per-cycle
speed ratios and how many cycles it was faster in, and each variant's staged time against the
slower stage's in the same cycle (x slower stage).

    python plugins/gds/tools/staged_depth_ab.py --variants 1,8 --cycles 60
    python plugins/gds/tools/staged_depth_ab.py --variants 1,8 --config '{}'   # page cache instead
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time

import click
from tent_bench.runner import bench_file, target_process

from tent_core import Engine, OpCode, Permission, Request


@click.command()
@click.option("--size-mib", default=64, show_default=True, help="Bytes per transfer, MiB.")
@click.option("--cycles", default=40, show_default=True, type=click.IntRange(2, 100000))
@click.option("--variants", default="1,8", show_default=True, help="DEPTH[:CHUNKS],... (the first is the reference).")
@click.option("--config", "config_json", default='{"transports": {"gds": {"direct": 1}}}', show_default=True)
@click.option("--file-dir", default=None, help="Directory of the benchmark file (default: the temp dir).")
@click.option("--dump", default=None, help="Write every transfer's seconds, per case, to this JSON file.")
def main(size_mib: int, cycles: int, variants: str, config_json: str, file_dir: str | None, dump: str | None) -> None:
    size = size_mib << 20
    config = json.loads(config_json)
    names = ["file", "tcp", *variants.split(",")]
    with bench_file(file_dir or tempfile.gettempdir(), size) as path, \
            target_process(size, "127.0.0.1", config, pattern_fill=False) as target:  # fmt: skip
        remote = target["segment"]
        with Engine({**config, "mapped_paths": False}, transports=["gds", "tcp"]) as eng:
            f = eng.register_file(path, segment="bench-file", perm=Permission.READ)
            local = eng.allocate(size, segment="bench-local")
            own = eng.segment_name("bench-file")
            cases = {"file": [Request(OpCode.READ, local, 0, own, 0, size)],
                     "tcp": [Request(OpCode.WRITE, local, 0, remote, 0, size)]}  # fmt: skip
            staged = [Request(OpCode.WRITE, f, 0, remote, 0, size)]
            pool = eng._submitter._staging_pool()
            chunks0 = pool.chunks

            def one(name: str) -> float:
                if name not in cases:
                    depth, _, chunks = name.partition(":")
                    pool.first_depth, pool.chunks = int(depth), int(chunks or chunks0)
                t0 = time.perf_counter()
                if not eng.submit(cases.get(name, staged)).wait(120):
                    raise RuntimeError(f"{name}: a transfer did not finish in 120 s")
                return time.perf_counter() - t0

            for n in names:  # warm: connections, staging buffers made and faulted in
                one(n)
                one(n)
            t: dict[str, list[float]] = {n: [] for n in names}
            for c in range(cycles):
                for n in names[c % len(names):] + names[: c % len(names)]:
                    t[n].append(one(n))
            eng.unregister(f)
    if dump:
        with open(dump, "w") as fh:
            json.dump(t, fh)
    gb = size / 1e9
    click.echo(" ".join(f"{n} {gb / statistics.median(t[n]):.2f}" for n in names) + " GB/s (median)")
    for n in names[2:]:  # staged / its slower stage, both stages timed in the same cycle
        x = [max(a, b) / c for a, b, c in zip(t["file"], t["tcp"], t[n], strict=True)]
        click.echo(f"{n}: x slower stage, median of the cycles {statistics.median(x):.3f}")
    ref = names[2]
    for n in names[3:]:
        r = [a / b for a, b in zip(t[ref], t[n], strict=True)]
        click.echo(f"speed {n} / {ref}: median {statistics.median(r):.3f}, faster in {sum(v > 1 for v in r)}/{len(r)} cycles")


if __name__ == "__main__":
    main()
