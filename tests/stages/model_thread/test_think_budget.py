"""The thinking budget: after `budget` tokens inside the think section, only its end marker may follow."""

from __future__ import annotations

import mlx.core as mx

from stages.model_thread.sampling import ThinkBudget, _opened

START, END, VOCAB = 3, 4, 8


def allowed(budget: ThinkBudget, tokens: list[int]) -> list[int]:
    out = budget(mx.array(tokens), mx.zeros((1, VOCAB)))
    return [i for i in range(VOCAB) if out[0, i].item() > -mx.inf]


def test_budget_forces_the_end_marker_once_spent() -> None:
    budget = ThinkBudget(budget=2, start=START, end=END, opened=True)
    prompt = [1, START]
    assert len(allowed(budget, prompt)) == VOCAB
    assert len(allowed(budget, [*prompt, 5])) == VOCAB  # one spent
    assert allowed(budget, [*prompt, 5, 6]) == [END]  # two spent: only the end marker
    assert len(allowed(budget, [*prompt, 5, 6, END])) == VOCAB  # closed: the answer is free


def test_section_opened_by_the_model_counts_from_its_start() -> None:
    budget = ThinkBudget(budget=1, start=START, end=END, opened=False)
    assert len(allowed(budget, [1])) == VOCAB
    assert len(allowed(budget, [1, 7])) == VOCAB  # not thinking yet
    assert len(allowed(budget, [1, 7, START])) == VOCAB
    assert allowed(budget, [1, 7, START, 5]) == [END]


def test_opened_reads_the_prompt_tail() -> None:
    assert _opened((1, START, 2), START, END)
    assert not _opened((1, START, END, 2), START, END)
    assert not _opened((1, 2), START, END)


def test_start_marker_of_several_tokens() -> None:
    """gpt-oss opens its reasoning with `<|channel|>analysis<|message|>`: three tokens, counted once all are seen."""
    channel, analysis, message = 5, 6, 7
    budget = ThinkBudget(budget=1, start=(channel, analysis, message), end=END, opened=False)
    seen = [1]
    free = [len(allowed(budget, seen)) == VOCAB]
    for token in (channel, 2, channel, analysis, message, 2):  # another channel first: not reasoning
        seen.append(token)
        free.append(len(allowed(budget, seen)) == VOCAB)
    assert free == [True] * 6 + [False]  # one token of reasoning spent the budget
    assert allowed(budget, seen) == [END]
    assert len(allowed(budget, [*seen, END])) == VOCAB
    assert _opened((1, channel, analysis, message, 2), (channel, analysis, message), END)
    assert not _opened((1, channel, analysis, message, END), (channel, analysis, message), END)
