"""Capture segments and their bytes: the specification's rules, case by case."""

from __future__ import annotations

import pytest

from iqtrain.data.sigmf.layout import LayoutProblem, plan_layout


def layout(captures, region=400, frame=4, offset=0, trailing=0, rate=None):
    return plan_layout(
        region=region, frame=frame, offset=offset, trailing=trailing, captures=captures, rate=rate
    )


def cap(start, **fields):
    return {"core:sample_start": start, **fields}


def test_no_captures_is_one_segment_of_every_sample():
    out = layout([])
    assert out.samples == 100 and out.segments == ((0, 100),) and out.bytes == (0,)


def test_captures_with_other_fields_are_segments_of_their_own():
    out = layout([cap(0, **{"core:frequency": 1.0}), cap(30, **{"core:frequency": 2.0})])
    assert out.segments == ((0, 30), (30, 70)) and out.bytes == (0, 120)


def test_captures_that_differ_only_in_their_start_are_one_segment():
    out = layout([cap(0, **{"core:frequency": 1.0}), cap(30, **{"core:frequency": 1.0})])
    assert out.segments == ((0, 100),) and out.bytes == (0,)


def test_a_global_index_that_continues_joins_and_one_that_jumps_splits():
    gi = "core:global_index"
    assert layout([cap(0, **{gi: 1000}), cap(30, **{gi: 1030})]).segments == ((0, 100),)
    assert layout([cap(0, **{gi: 1000}), cap(30, **{gi: 1500})]).segments == ((0, 30), (30, 70))
    assert layout([cap(0), cap(30, **{gi: 30})]).segments == ((0, 30), (30, 70))


def test_datetimes_join_when_they_advance_by_the_samples_between_them():
    dt = "core:datetime"
    rate = 10.0  # 30 samples = 3 s
    ok = [cap(0, **{dt: "2024-01-01T00:00:00Z"}), cap(30, **{dt: "2024-01-01T00:00:03.000Z"})]
    assert layout(ok, rate=rate).segments == ((0, 100),)
    offset = [cap(0, **{dt: "2024-01-01T01:00:00+01:00"}), cap(30, **{dt: "2024-01-01T00:00:03Z"})]
    assert layout(offset, rate=rate).segments == ((0, 100),)
    gap = [cap(0, **{dt: "2024-01-01T00:00:00Z"}), cap(30, **{dt: "2024-01-01T00:00:04Z"})]
    assert layout(gap, rate=rate).segments == ((0, 30), (30, 70))
    assert layout(ok).segments == ((0, 30), (30, 70))  # no rate: cannot tell
    unparsed = [cap(0, **{dt: 5}), cap(30, **{dt: 8})]
    assert layout(unparsed, rate=rate).segments == ((0, 30), (30, 70))
    nanos = [
        cap(0, **{dt: "2024-01-01T00:00:00.000000001Z"}),
        cap(3, **{dt: "2024-01-01T00:00:00.300000001Z"}),
    ]
    assert layout(nanos, rate=rate).segments == ((0, 100),)


def test_header_bytes_sit_before_their_capture_and_never_join():
    # The specification's example: cu8 (2 bytes), 4-byte headers, captures at 0 and 500.
    out = layout([cap(0, **{"core:header_bytes": 4}), cap(500, **{"core:header_bytes": 4})],
                 region=2008, frame=2)  # fmt: skip
    assert out.samples == 1000
    assert out.segments == ((0, 500), (500, 500)) and out.bytes == (4, 1008)


def test_trailing_bytes_and_offset():
    out = layout([cap(1000)], region=410, trailing=10, offset=1000)
    assert out.samples == 100 and out.segments == ((1000, 100),) and out.bytes == (0,)
    lead = layout([cap(1050)], region=400, offset=1000)
    assert lead.segments == ((1000, 50), (1050, 50)) and lead.bytes == (0, 200)


def test_a_capture_before_the_offset_starts_at_it_with_a_note():
    out = layout([cap(0)], offset=1000)
    assert out.segments == ((1000, 100),)
    assert out.notes and "core:offset" in out.notes[0][1]


def test_captures_at_or_past_the_end_are_ignored_with_a_note():
    out = layout([cap(0, x=1), cap(100, x=2), cap(500, x=3)])
    assert out.segments == ((0, 100),)
    assert [f for f, _ in out.notes] == [
        "captures[1].core:sample_start",
        "captures[2].core:sample_start",
    ]


def test_equal_starts_leave_the_earlier_capture_empty():
    out = layout([cap(0, x=1), cap(40, x=1), cap(40, x=2)])
    assert out.segments == ((0, 40), (40, 60))


def test_a_leading_segment_before_the_first_capture():
    out = layout([cap(20)])
    assert out.segments == ((0, 20), (20, 80)) and out.bytes == (0, 80)


def test_bytes_that_are_not_whole_samples_or_no_room_are_problems():
    with pytest.raises(LayoutProblem) as e:
        layout([], region=401)
    assert e.value.field == "data length"
    with pytest.raises(LayoutProblem) as e:
        layout([cap(0, **{"core:header_bytes": 300})], region=400, trailing=200)
    assert e.value.field == "core:header_bytes"
