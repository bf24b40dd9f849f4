"""refhub's data-plane benchmark inputs."""

from __future__ import annotations

from tent_bench.refhub.data import shard_sizes

MB = 1 << 20


def test_shard_sizes_model_like() -> None:
    sizes = shard_sizes(1024, 500)
    assert len(sizes) == 500 and sum(sizes) == 1024 * MB
    assert sum(1 for n in sizes if n < 2 * MB) == 250
    assert sum(n for n in sizes if n < 2 * MB) < 16 * MB  # the pack stays small
