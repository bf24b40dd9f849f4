"""What a reader may read from a partial copy, from the progress words its batches bring back."""

from __future__ import annotations

from refhub.client import _merge_avail


def test_avail_grows_with_the_source_and_never_shrinks() -> None:
    assert _merge_avail(0, 4096, 0) == 4096
    assert _merge_avail(8192, 4096, 4096) == 8192  # an older batch's word arrives late: keep the newer view


def test_source_without_the_version_stops_new_reads_where_we_are() -> None:
    # the source's receive failed (word reset) or it moved on: nothing beyond what is already issued
    assert _merge_avail(8192, -1, 4096) == 4096
    assert _merge_avail(2048, -1, 4096) == 2048
