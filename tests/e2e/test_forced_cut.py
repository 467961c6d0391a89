"""A forced call cut by max tokens before the model wrote its name is still that call, in every API.

`tool_choice` names the tool (or `required` / `any` offers one), so the name is never in doubt: the
reply carries the call with arguments "" and the API's own truncation signal, streamed and not,
through the real SDKs. The max tokens used are small enough that no tokenization the forced grammar
allows reaches the name (`before_name`), so no test leans on the random model's choices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tokenizers import Tokenizer

from tests.conftest import Server
from tests.e2e.conftest import stream_chunks
from tests.e2e.test_call_streaming import ASK, CHAT_TOOLS, MESSAGES_TOOLS, NAMED, RESPONSES_TOOLS
from tests.families import CASES, FamilyCase

OPENER = "<tool_call>"
# The tiny model's forced call (Hermes markup) up to its name.
HEAD = '\n{"name": "'
SECOND_CHAT: Any = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def before_name(tokenizer: Tokenizer) -> int:
    """The most tokens that cannot reach the name, however the grammar lets the model tokenize the head."""
    pieces = {tokenizer.decode([token]) for token in range(tokenizer.get_vocab_size())} - {""}
    assert tokenizer.encode(OPENER, add_special_tokens=False).ids == [tokenizer.token_to_id(OPENER)]
    # fewest[i]: tokens to write OPENER then HEAD[:i] exactly; a piece that runs past HEAD writes the name.
    fewest = [1] + [1_000] * len(HEAD)
    to_name = 1_000
    for at in range(len(HEAD) + 1):
        for piece in pieces:
            if HEAD.startswith(piece, at):
                fewest[at + len(piece)] = min(fewest[at + len(piece)], fewest[at] + 1)
            elif piece.startswith(HEAD[at:]):
                to_name = min(to_name, fewest[at] + 1)
    assert to_name > 3
    return to_name - 1


BUDGETS = [pytest.param(False, id="one-token"), pytest.param(True, id="last-before-name")]


def budget(before_name: int, last: bool) -> int:
    return before_name if last else 1


def chat_body(max_tokens: int, **changes: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": ASK,
        "tools": CHAT_TOOLS,
        "tool_choice": NAMED,
        "max_tokens": max_tokens,
    } | changes


@pytest.mark.parametrize("last", BUDGETS)
@pytest.mark.parametrize("choice", [pytest.param(NAMED, id="named"), pytest.param("required", id="required-one")])
def test_chat(server: Server, before_name: int, last: bool, choice: Any) -> None:
    body = chat_body(budget(before_name, last), tool_choice=choice)
    completion = server.client().chat.completions.create(**body)
    choice_out = completion.choices[0]
    assert choice_out.finish_reason == "length" and not choice_out.message.content
    (call,) = choice_out.message.tool_calls or []
    assert call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, call.function.arguments) == ("get_weather", "")
    chunks = [c for c in stream_chunks(server, "/chat/completions", body) if isinstance(c, dict) and c["choices"]]
    deltas = [c["choices"][0]["delta"] for c in chunks]  # type: ignore[index]
    calls = [head for delta in deltas for head in delta.get("tool_calls") or []]
    assert not "".join(delta.get("content") or "" for delta in deltas)
    (head,) = calls
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]


def test_chat_required_among_several_is_left_as_is(server: Server) -> None:
    # Which tool the model meant is not known before it writes the name.
    body = chat_body(1, tool_choice="required", tools=[*CHAT_TOOLS, SECOND_CHAT])
    completion = server.client().chat.completions.create(**body)
    assert completion.choices[0].finish_reason == "length" and not completion.choices[0].message.tool_calls


@pytest.mark.parametrize("last", BUDGETS)
@pytest.mark.parametrize(
    "choice",
    [pytest.param({"type": "tool", "name": "get_weather"}, id="tool"), pytest.param({"type": "any"}, id="any")],
)
def test_messages(server: Server, before_name: int, last: bool, choice: Any) -> None:
    claude = server.anthropic_client()
    ask: dict[str, Any] = {
        "model": "m",
        "max_tokens": budget(before_name, last),
        "messages": ASK,
        "tools": MESSAGES_TOOLS,
        "tool_choice": choice,
    }
    message = claude.messages.create(**ask)
    assert message.stop_reason == "max_tokens"
    (block,) = message.content
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    assert (block.name, block.input) == ("get_weather", {})
    with claude.messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    (streamed,) = final.content
    assert streamed.type == "tool_use" and (streamed.name, streamed.input) == ("get_weather", {})
    pieces = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert "".join(pieces) == ""


def responses_ask(max_tokens: int, choice: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "input": "Forecast for a city.",
        "tools": RESPONSES_TOOLS,
        "max_output_tokens": max_tokens,
        "tool_choice": choice,
        "store": False,
    }


@pytest.mark.parametrize("last", BUDGETS)
@pytest.mark.parametrize(
    "choice",
    [pytest.param({"type": "function", "name": "get_weather"}, id="named"), pytest.param("required", id="required")],
)
def test_responses(server: Server, before_name: int, last: bool, choice: Any) -> None:
    client = server.client()
    ask = responses_ask(budget(before_name, last), choice)
    response = client.responses.create(**ask)
    # The SDK's stream helper reads only a completed response (get_final_response); the events carry this one.
    with client.responses.create(**ask, stream=True) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    for reply in (response, final):
        assert reply.status == "incomplete" and reply.incomplete_details is not None
        assert reply.incomplete_details.reason == "max_output_tokens"
        (item,) = reply.output
        assert item.type == "function_call" and item.status == "incomplete"
        assert (item.name, item.arguments) == ("get_weather", "") and item.call_id.startswith("call_")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(e.name, e.arguments) for e in done] == [("get_weather", "")]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_family_at_one_token(family_fleet: Callable[[str], Server], case: FamilyCase) -> None:
    """One token of a forced call is markup in every family's grammar: each API still returns the call."""
    server, model = family_fleet(case.name), case.name
    completion = server.client().chat.completions.create(**chat_body(1, model=model))
    (call,) = completion.choices[0].message.tool_calls or []
    assert completion.choices[0].finish_reason == "length" and not completion.choices[0].message.content
    assert (call.function.name, call.function.arguments) == ("get_weather", "")
    chunks = [c for c in stream_chunks(server, "/chat/completions", chat_body(1, model=model)) if isinstance(c, dict)]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]  # type: ignore[index]
    heads = [head for delta in deltas for head in delta.get("tool_calls") or []]
    assert [head["function"] for head in heads] == [{"name": "get_weather", "arguments": ""}]
    message = server.anthropic_client().messages.create(
        model=model,
        max_tokens=1,
        messages=ASK,
        tools=MESSAGES_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    assert message.stop_reason == "max_tokens"
    assert [(block.type, getattr(block, "input", None)) for block in message.content] == [("tool_use", {})]
    response = server.client().responses.create(
        **responses_ask(1, {"type": "function", "name": "get_weather"}) | {"model": model}
    )
    assert response.status == "incomplete"
    assert [(item.type, item.status, getattr(item, "arguments", None)) for item in response.output] == [
        ("function_call", "incomplete", "")
    ]
