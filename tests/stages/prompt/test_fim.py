"""stages/prompt/fim.py: the infilling format read from a vocabulary, and the prompt it makes."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.errors import RequestError
from pipeline.requests import GenerationParams, Sampling, TextRequest
from stages.prompt.fim import find_infill


class Vocab:
    """A tokenizer seen only through `get_vocab`, as detection sees it."""

    def __init__(self, *tokens: str) -> None:
        self._vocab = {token: index for index, token in enumerate(("a", "b", *tokens))}

    def get_vocab(self) -> dict[str, int]:
        return self._vocab


def request(prompt: Any = "def f(x):\n    ", suffix: str = "\n    return y\n", **params: Any) -> TextRequest:
    return TextRequest(
        prompt=prompt, suffix=suffix, params=GenerationParams(max_tokens=8, sampling=Sampling(), **params)
    )


@pytest.mark.parametrize(
    ("tokens", "name", "text"),
    [
        (
            ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"),
            "qwen",
            "<|fim_prefix|>P<|fim_suffix|>S<|fim_middle|>",
        ),
        (("<fim_prefix>", "<fim_suffix>", "<fim_middle>"), "starcoder", "<fim_prefix>P<fim_suffix>S<fim_middle>"),
        (("<fim-prefix>", "<fim-suffix>", "<fim-middle>"), "santacoder", "<fim-prefix>P<fim-suffix>S<fim-middle>"),
        (("<PRE>", "<SUF>", "<MID>", "<EOT>"), "codellama", "<PRE> P <SUF>S <MID>"),
        (
            ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
            "deepseek-coder",
            "<｜fim▁begin｜>P<｜fim▁hole｜>S<｜fim▁end｜>",
        ),
    ],
)
def test_each_family_is_found_by_its_markers(tokens: tuple[str, ...], name: str, text: str) -> None:
    infill = find_infill(Vocab(*tokens))  # type: ignore[arg-type]
    assert infill is not None and infill.format.name == name
    assert infill.format.prompt("P", "S") == text
    # Every marker the vocabulary has ends the infill.
    assert set(infill.end_ids) == set(range(2, 2 + len(tokens)))


def test_a_vocabulary_without_all_three_markers_cannot_infill() -> None:
    assert find_infill(Vocab("<|fim_prefix|>", "<|fim_suffix|>")) is None  # type: ignore[arg-type]
    assert find_infill(Vocab()) is None  # type: ignore[arg-type]


def test_the_request_prompt_keeps_the_clients_stop_ids_first() -> None:
    infill = find_infill(Vocab("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))  # type: ignore[arg-type]
    assert infill is not None
    prompt, params = infill.request_prompt(request(stop_token_ids=(1, 3)))
    assert prompt.text == "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y\n<|fim_middle|>"
    assert params.stop_token_ids == (1, 3, 2, 4)
    with pytest.raises(RequestError) as caught:
        infill.request_prompt(request(prompt=(1, 2)))
    assert caught.value.param == "suffix"
