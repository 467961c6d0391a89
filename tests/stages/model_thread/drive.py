"""Rows driven through a generator (mlx-lm's `BatchGenerator`, or one wrapped by the single-row path or
speculation) call by call: what each test of those wrappers compares with the plain batch."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx

from pipeline.requests import Sampling
from stages.model_thread.sampling import RowStops, make_row_processors, make_row_sampler
from stages.models.loading import load_tokenizer, load_weights, resolve_model

GREEDY = Sampling(temperature=0.0)
# Low enough that a random model's samples often repeat what a drafter proposes (still the sampled path).
SEEDED = Sampling(temperature=0.3, seed=5)
PENALISED = Sampling(
    temperature=0.8, seed=11, repetition_penalty=1.3, presence_penalty=0.5, logit_bias={5: 3.0, 7: -100.0}
)
# A prompt that repeats itself: prompt lookup has something to copy.
COPY = [*range(3, 30), *range(3, 30), *range(3, 12)]
OTHER = list(range(50, 95))

# A row: its name, prompt, sampling, max_tokens and stop sequences.
Arrival = tuple[str, list[int], Sampling, int, list[list[int]]]


def real_text_rows(path: Path, samplings: Sequence[Sampling]) -> tuple[Any, dict[int, list[Arrival]]]:
    """The real model at `path` as the server serves it on a CPU (float32), and three rows of real text that arrive
    while the others decode, the i-th sampled as `samplings[i]`."""
    info = resolve_model(str(path))
    model = load_weights(attrs.evolve(info, float32_weights=True))
    tokenizer = load_tokenizer(info)
    texts = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea,"]
    calls, lengths = (0, 2, 3), (12, 10, 8)
    rows = zip("abc", texts, samplings, calls, lengths, strict=True)
    return model, {
        call: [(name, tokenizer.encode(text), sampling, tokens, [[0]])] for name, text, sampling, call, tokens in rows
    }


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


@attrs.define
class Oracle:
    """A drafter that knows each row's reply (from a run without speculation) and proposes it, its last token
    wrong every third time (by row, and in every row at every third call): rows accept different counts, and the
    batch cuts and rolls each by its own. Every other step it proposes nothing, so plain one-token steps follow
    cut layers too."""

    replies: list[list[int]]
    name: str = "oracle"
    caught_up: int = 0
    calls: int = 0

    def propose(self, uid: int, history: Sequence[int], k: int) -> list[int]:
        for reply in self.replies:
            if reply[: len(history)] == list(history):
                proposal = reply[len(history) : len(history) + k]
                if proposal and ((len(history) + uid) % 3 == 0 or self.calls % 3 == 0):
                    proposal[-1] = (proposal[-1] + 1) % 256
                return proposal
        return []

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        self.calls += 1
        if self.calls % 2 == 0:
            return [[] for _ in requests]
        return [self.propose(uid, history, k) for uid, history, k in requests]

    def forget(self, uids: Sequence[int]) -> None:
        pass


def same_replies(expected: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]]) -> None:
    """Every row's tokens, finish reason, logprobs (1e-4) and the tokens its final cache names agree."""
    assert expected.keys() == got.keys()
    for name, want in expected.items():
        have = got[name]
        assert have["tokens"] == want["tokens"], name
        assert have["finish"] == want["finish"], name
        for a, b in zip(want["logprobs"], have["logprobs"]):
            assert mx.allclose(a, b, atol=1e-4).item(), name
        assert have.get("all_tokens") == want.get("all_tokens"), name
