"""wire/openai_extensions.py: the vLLM / llama.cpp fields Chat Completions and Completions honour, and those refused
by name."""

from __future__ import annotations

import pytest

from pipeline.errors import RequestError
from pipeline.requests import JsonValue
from tests.wire.test_openai_requests import chat_body, text_body
from wire.openai_extensions import REFUSED
from wire.openai_requests import decode_chat, decode_completion

DECODERS = [
    pytest.param(decode_chat, chat_body, id="chat"),
    pytest.param(decode_completion, text_body, id="completions"),
]


@pytest.mark.parametrize(("decode", "body"), DECODERS)
def test_honoured_fields_reach_the_generation_params(decode, body) -> None:  # type: ignore[no-untyped-def]
    request = decode(body(min_tokens=4, ignore_eos=True, stop_token_ids=[7, 3, 7], typical_p=0.5))
    assert request.params.min_tokens == 4
    assert request.params.ignore_eos is True
    # Order kept, repeats dropped.
    assert request.params.stop_token_ids == (7, 3)
    assert request.params.sampling.typical_p == 0.5


@pytest.mark.parametrize(("decode", "body"), DECODERS)
def test_absent_fields_leave_the_output_as_it_is(decode, body) -> None:  # type: ignore[no-untyped-def]
    params = decode(body()).params
    assert (params.min_tokens, params.ignore_eos, params.stop_token_ids, params.sampling.typical_p) == (
        0,
        False,
        (),
        1.0,
    )


@pytest.mark.parametrize(
    ("field", "value", "gist"),
    [
        ("min_tokens", -1, "'min_tokens' must be"),
        ("min_tokens", "3", "'min_tokens' must be an integer"),
        ("ignore_eos", 1, "'ignore_eos' must be a boolean"),
        ("stop_token_ids", 7, "'stop_token_ids' must be an array"),
        ("stop_token_ids", [-1], "non-negative token ids"),
        ("stop_token_ids", [True], "non-negative token ids"),
        ("stop_token_ids", list(range(300)), "at most 256"),
        ("typical_p", 0, "greater than 0"),
        ("typical_p", 1.5, "'typical_p'"),
    ],
)
@pytest.mark.parametrize(("decode", "body"), DECODERS)
def test_bad_values_are_400s_naming_the_field(decode, body, field: str, value: JsonValue, gist: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RequestError) as caught:
        decode(body(**{field: value}))
    assert caught.value.param == field
    assert gist in caught.value.message


# A value for each refused extension that is not its neutral one.
NOT_NEUTRAL: dict[str, JsonValue] = {
    "chat_template": "{{ messages }}",
    "prompt_logprobs": 1,
    "draft_model": "small",
    "guided_decoding_backend": "outlines",
    "include_stop_str_in_output": True,
    "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 8,
    "add_generation_prompt": False,
    "use_beam_search": True,
    "length_penalty": 0.5,
    "bad_words": ["x"],
    "allowed_token_ids": [1],
    "logits_processors": ["m.f"],
    "return_tokens_as_token_ids": True,
    "structural_tag": "{}",
    "mirostat": 2,
    "n_probs": 3,
    "tfs_z": 0.9,
    "dynatemp_range": 0.5,
    "xtc_probability": 0.5,
    "dry_multiplier": 0.8,
    "grammar": 'root ::= "a"',
    "json_schema": {"type": "object"},
}


def test_every_refused_extension_has_a_case() -> None:
    assert set(NOT_NEUTRAL) == set(REFUSED)


@pytest.mark.parametrize("field", sorted(REFUSED))
@pytest.mark.parametrize(("decode", "body"), DECODERS)
def test_refused_extensions_are_400s_naming_them(decode, body, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(RequestError) as caught:
        decode(body(**{field: NOT_NEUTRAL[field]}))
    assert caught.value.param == field
    assert caught.value.code == "unsupported_parameter"


@pytest.mark.parametrize("field", sorted(REFUSED))
@pytest.mark.parametrize(("decode", "body"), DECODERS)
def test_refused_extensions_at_their_neutral_value_are_accepted(decode, body, field: str) -> None:  # type: ignore[no-untyped-def]
    if REFUSED[field] is not None:
        assert decode(body(**{field: REFUSED[field]})) == decode(body())


def test_a_suffix_asks_for_fill_in_the_middle() -> None:
    assert decode_completion(text_body(suffix="return x\n")).suffix == "return x\n"
    # OpenAI's default, an empty suffix, is no infill.
    assert decode_completion(text_body(suffix="")).suffix is None
    assert decode_completion(text_body()).suffix is None
