"""Per-model defaults (fleet/defaults.py): composed over generation_config.json, and a request's own value wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.defaults import generation_config, with_defaults
from fleet.spec import Defaults
from pipeline.requests import GenerationRequest, JsonValue
from wire.anthropic_requests import decode_messages
from wire.openai_requests import decode_chat, decode_completion
from wire.responses_requests import decode_responses, to_chat

CHAT: dict[str, JsonValue] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_generation_config_is_read_as_vllm_reads_it(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps(
            {
                "temperature": 0.6,
                "top_p": 0.95,
                "top_k": 20,
                "max_new_tokens": 256,
                "do_sample": True,
                "bos_token_id": 1,
            }
        )
    )
    assert generation_config(tmp_path) == Defaults(temperature=0.6, top_p=0.95, top_k=20, max_tokens=256)


@pytest.mark.parametrize("text", ["", "not json", "[1]", '{"temperature": "hot"}'])
def test_no_or_a_broken_generation_config_sets_nothing(tmp_path: Path, text: str) -> None:
    if text:
        (tmp_path / "generation_config.json").write_text(text)
    assert generation_config(tmp_path) == Defaults()


def test_the_file_wins_over_the_generation_config() -> None:
    composed = Defaults(temperature=0.2, max_tokens=64).over(Defaults(temperature=0.6, top_p=0.9))
    assert composed == Defaults(temperature=0.2, top_p=0.9, max_tokens=64)


DEFAULTS = Defaults(temperature=0.3, top_p=0.8, top_k=7, max_tokens=40)


def decode_responses_body(body: JsonValue) -> GenerationRequest:
    assert isinstance(body, dict)
    return to_chat(decode_responses(body), (), None)


@pytest.mark.parametrize(
    ("decode", "body"),
    [
        pytest.param(decode_chat, CHAT, id="chat"),
        pytest.param(decode_completion, {"model": "m", "prompt": "hi"}, id="completions"),
        pytest.param(decode_responses_body, {"model": "m", "input": "hi"}, id="responses"),
    ],
)
def test_unset_fields_take_the_defaults(decode: object, body: dict[str, JsonValue]) -> None:
    request = with_defaults(decode, DEFAULTS)(body)  # type: ignore[arg-type]
    sampling = request.params.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.3, 0.8, 7)
    assert request.params.max_tokens == 40 and request.params.clamp_max_tokens


@pytest.mark.parametrize(
    ("decode", "body", "max_tokens"),
    [
        pytest.param(
            decode_chat, {**CHAT, "temperature": 0.0, "top_p": 1, "top_k": 3, "max_completion_tokens": 5}, 5, id="chat"
        ),
        pytest.param(
            decode_completion,
            {"model": "m", "prompt": "hi", "temperature": 0, "top_p": 1, "top_k": 3, "max_tokens": 5},
            5,
            id="completions",
        ),
        pytest.param(
            decode_messages,
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}],
                "temperature": 0,
                "top_p": 1,
                "top_k": 3,
            },
            5,
            id="messages",
        ),
        # Responses has no top_k: the model's default stays.
        pytest.param(
            decode_responses_body,
            {"model": "m", "input": "hi", "temperature": 0, "top_p": 1, "max_output_tokens": 16},
            16,
            id="responses",
        ),
    ],
)
def test_a_request_s_own_value_wins(decode: object, body: dict[str, JsonValue], max_tokens: int) -> None:
    request = with_defaults(decode, DEFAULTS)(body)  # type: ignore[arg-type]
    sampling = request.params.sampling
    assert (sampling.temperature, sampling.top_p) == (0.0, 1.0)
    assert sampling.top_k == (3 if "top_k" in body else 7)
    assert request.params.max_tokens == max_tokens


def test_no_defaults_leave_the_decoder_as_it_is() -> None:
    assert with_defaults(decode_chat, Defaults(adapter="a", context_limit=9)) is decode_chat
