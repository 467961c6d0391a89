"""The unknown-field policy's tables against the fields each official SDK sends: every one is read by the
decoder (honoured, or refused by name) or listed as inert; the rest, reported, are named here."""

from __future__ import annotations

import typing
from collections.abc import Callable

import pytest
from anthropic.types import message_create_params
from openai.types import completion_create_params, embedding_create_params
from openai.types.chat import completion_create_params as chat_create_params
from openai.types.responses import response_create_params

from pipeline.errors import RequestError
from pipeline.requests import JsonValue
from wire.anthropic_requests import decode_messages
from wire.embeddings import decode_embeddings
from wire.field_policy import INERT, ReadKeys, decode_noting_unread, header_value
from wire.openai_requests import decode_chat, decode_completion
from wire.responses_requests import decode_responses

USER: list[JsonValue] = [{"role": "user", "content": "hi"}]
APIS: dict[str, tuple[Callable[[JsonValue], object], dict[str, JsonValue], object]] = {
    "chat": (decode_chat, {"model": "m", "messages": USER}, chat_create_params.CompletionCreateParamsBase),
    "completions": (
        decode_completion,
        {"model": "m", "prompt": "hi"},
        completion_create_params.CompletionCreateParamsBase,
    ),
    "responses": (decode_responses, {"model": "m", "input": "hi"}, response_create_params.ResponseCreateParamsBase),
    "messages": (
        decode_messages,
        {"model": "m", "messages": USER, "max_tokens": 5},
        message_create_params.MessageCreateParamsBase,
    ),
    "embeddings": (decode_embeddings, {"model": "m", "input": "hi"}, embedding_create_params.EmbeddingCreateParams),
}
# Fields of the SDKs this server neither serves nor knows to be inert: served, and reported by name.
REPORTED = {
    "responses": {"access_programs", "background_options", "context_management", "image"},
    "messages": {"diagnostics"},
}


@pytest.mark.parametrize("api", sorted(APIS))
def test_every_sdk_field_is_read_inert_or_reported_by_name(api: str) -> None:
    decode, body, params = APIS[api]
    recorded = ReadKeys(body)
    decode(recorded)
    sent = set(typing.get_type_hints(params))
    assert sent - recorded.read - INERT[api] == REPORTED.get(api, set())


@pytest.mark.parametrize("api", sorted(APIS))
def test_an_unknown_field_is_reported_or_refused_in_strict_mode(api: str) -> None:
    decode, body, _ = APIS[api]
    with_unknown = {**body, "bogus_field": 1, "user": "u"}
    _, unread = decode_noting_unread(decode, with_unknown, api, strict=False)
    assert unread == ("bogus_field",)
    with pytest.raises(RequestError) as caught:
        decode_noting_unread(decode, with_unknown, api, strict=True)
    assert caught.value.param == "bogus_field" and "'bogus_field'" in str(caught.value)
    assert decode_noting_unread(decode, {**body, "user": "u"}, api, strict=True)[1] == ()


def test_odd_names_reach_a_header_as_ascii() -> None:
    assert header_value(("plain_name", "\r\nx-evil: 1", "ü")) == 'plain_name, "\\r\\nx-evil: 1", "\\u00fc"'
