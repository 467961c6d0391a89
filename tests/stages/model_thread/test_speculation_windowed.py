"""Speculative decoding over sliding-window (rotating) cache layers, as Gemma 3 has: the same replies as without.

A verifying pass's rejected positions are cut from a rotating layer as from a plain one
(`stages/models/mlx_internals.py`'s `cut_batch_layer`), and a ring that decode steps rotated is laid out in time order
before the pass (`in_time_order`). An oracle drafter makes rows accept different counts, all rows reject at once,
and one-token steps follow cut layers.
"""

from __future__ import annotations

import pytest

from pipeline.requests import Sampling
from tests.stages.model_thread.drive import COPY, GREEDY, OTHER, SEEDED, Oracle, drive, same_replies
from tests.stages.model_thread.test_speculation import _batch, _speculating
from tests.stages.model_thread.windowed import windowed_model


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_sliding_window_model_speculates_past_its_window(sampling: Sampling) -> None:
    """Gemma 3's sliding layers rotate past their window (8 tokens here); a verifying pass's rejected positions are
    cut from them as from plain layers, and every row's replies stay the same, rows joining mid-generation."""
    windowed = windowed_model()
    arrivals = {
        0: [("a", COPY, sampling, 40, [[0]])],
        3: [("b", OTHER, sampling, 30, [[0]]), ("c", COPY[5:], sampling, 25, [[0]])],
        9: [("d", OTHER[:20] + OTHER[:20], sampling, 20, [[0]])],
        # Shorter than the window, prefilled beside a long prompt: it joins on a ring decode steps rotated.
        12: [("e", OTHER[:6], sampling, 12, [[0]])],
    }
    expected = drive(_batch(windowed), arrivals)
    oracle = Oracle([row["prompt"] + row["tokens"] for row in expected.values()])
    generator, speculation = _speculating(windowed, oracle)
    got = drive(generator, arrivals)
    same_replies(expected, got)
    for have in got.values():
        # A row that ended inside a verified span past its window keeps no KV; any it keeps holds its tokens.
        assert have["cache"] is None or have["cache"][0].offset == len(have["all_tokens"])
    counts = speculation.counts
    assert counts.proposed > 0 and 0 < counts.accepted < counts.proposed
