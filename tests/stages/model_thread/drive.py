"""Rows driven through a generator (mlx-lm's `BatchGenerator`, or one wrapped by the single-row path or
speculation) call by call: what each test of those wrappers compares with the plain batch."""

from __future__ import annotations

from typing import Any

from pipeline.requests import Sampling
from stages.model_thread.sampling import RowStops, make_row_processors, make_row_sampler

# A row: its name, prompt, sampling, max_tokens and stop sequences.
Arrival = tuple[str, list[int], Sampling, int, list[list[int]]]


def drive(generator: Any, arrivals: dict[int, list[Arrival]]) -> dict[str, dict[str, Any]]:
    """Insert each arrival before the call it is keyed by; every row's tokens, logprobs, finish and final cache."""
    rows: dict[int, dict[str, Any]] = {}
    call = 0
    while call <= max(arrivals) or any(row["finish"] is None for row in rows.values()):
        for name, prompt, sampling, max_tokens, stops in arrivals.get(call, []):
            (uid,) = generator.insert(
                [prompt],
                max_tokens=[max_tokens],
                caches=None,
                all_tokens=[[]],
                samplers=[make_row_sampler(sampling)],
                logits_processors=[make_row_processors(sampling, max_tokens)],
                stop_sequences=[RowStops(stops)],
            )
            rows[uid] = {"name": name, "prompt": prompt, "tokens": [], "logprobs": [], "finish": None}
        for response in generator.next()[1]:
            row = rows[response.uid]
            assert row["finish"] is None, "a token after the row finished"
            row["tokens"].append(response.token)
            row["logprobs"].append(response.logprobs)
            row["finish"] = response.finish_reason
            if response.finish_reason is not None:
                row["cache"], row["all_tokens"] = response.prompt_cache, response.all_tokens
                row["speculated"] = getattr(response, "speculated", None)
        call += 1
        assert call < 500
    return {row["name"]: row for row in rows.values()}
