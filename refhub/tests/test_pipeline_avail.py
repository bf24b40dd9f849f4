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


def test_progress_marks_note_each_sixteenth_once() -> None:
    from refhub.client import _mark

    st = {"total": 1600, "marks": []}
    _mark(st, 50, 1.0)  # under the first sixteenth (100 bytes): nothing yet
    assert st["marks"] == []
    _mark(st, 100, 2.0)
    _mark(st, 350, 3.0)  # one batch passes the 2nd and 3rd sixteenths at once
    assert st["marks"] == [2.0, 3.0, 3.0]
    _mark(st, 350, 4.0)  # no new bytes: no new mark
    _mark(st, 1600, 5.0)
    assert len(st["marks"]) == 16 and st["marks"][-1] == 5.0
    _mark(st, 1600, 6.0)
    assert len(st["marks"]) == 16
    _mark({"done": 0}, 10, 1.0)  # a pull without marks (none asked for) is left alone
