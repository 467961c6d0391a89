"""pipeline/tracing.py: timelines of stamps, and durations computed from them (docs/STYLE.md, "Tracing")."""

from __future__ import annotations

import pytest

from pipeline.tracing import Mark, Timeline


def test_start_stamps_received_from_the_injected_clock() -> None:
    """A timeline starts with RECEIVED read from the clock it is given."""
    assert Timeline.start(clock=lambda: 100.0).stamps == ((Mark.RECEIVED, 100.0),)


def test_stamp_returns_a_new_timeline() -> None:
    """Timelines are values: stamping makes a copy and leaves the original alone."""
    first = Timeline.start(clock=lambda: 1.0)
    second = first.stamp(Mark.PARSED, 1.5)
    assert first.stamps == ((Mark.RECEIVED, 1.0),)
    assert second.stamps == ((Mark.RECEIVED, 1.0), (Mark.PARSED, 1.5))


def test_stamp_without_a_time_uses_the_monotonic_clock() -> None:
    """A stamp with no explicit time is taken now, after the earlier monotonic stamps."""
    timeline = Timeline.start().stamp(Mark.PARSED)
    received, parsed = timeline.at(Mark.RECEIVED), timeline.at(Mark.PARSED)
    assert received is not None and parsed is not None and parsed >= received


TIMELINE = (
    Timeline.start(clock=lambda: 10.0)
    .stamp(Mark.PARSED, 10.25)
    .stamp(Mark.PREPARED, 10.5)
    .stamp(Mark.ADMITTED, 11.0)
    .stamp(Mark.FIRST_TOKEN, 11.1234567)
)


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        pytest.param(Mark.RECEIVED, Mark.PARSED, 0.25, id="parse"),
        pytest.param(Mark.PREPARED, Mark.ADMITTED, 0.5, id="queue"),
        pytest.param(Mark.ADMITTED, Mark.FIRST_TOKEN, 0.123457, id="prefill-rounded-to-microseconds"),
        pytest.param(Mark.RECEIVED, Mark.FIRST_TOKEN, 1.123457, id="total"),
        pytest.param(Mark.FIRST_TOKEN, Mark.FINISHED, None, id="end-missing"),
        pytest.param(Mark.FINISHED, Mark.RECEIVED, None, id="start-missing"),
    ],
)
def test_between(start: Mark, end: Mark, expected: float | None) -> None:
    """Durations come from the stamps, rounded for logs; a missing stamp gives None, not a guess."""
    assert TIMELINE.between(start, end) == expected


def test_at_reads_the_first_stamp_of_a_mark() -> None:
    """A mark stamped twice keeps its first time; an absent mark is None."""
    timeline = Timeline.start(clock=lambda: 0.0).stamp(Mark.PARSED, 1.0).stamp(Mark.PARSED, 2.0)
    assert timeline.at(Mark.PARSED) == 1.0
    assert timeline.at(Mark.FINISHED) is None
