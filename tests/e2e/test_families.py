"""Every family end to end: a random-weight model with the family's real
template and special tokens behind a real server, driven by the official
SDKs. Forced calls come back as calls in all three APIs (written in the
family's own markup under the grammar, parsed back, arguments valid for
the schema); a tool-result round trip renders; DeepSeek's think section
opened by its template is split into reasoning in every API."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from tests.conftest import Server
from tests.e2e.conftest import stats, stream_chunks
from tests.families import CASES, FamilyCase

pytestmark = pytest.mark.slow

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": PARAMETERS},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time in a city.", "parameters": PARAMETERS},
    },
]
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]


# A served family: its server, and the model name a request gives to reach the family's model on it.
Served = tuple[Server, str]


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def family(request: pytest.FixtureRequest, family_fleet: Callable[[str], Server]) -> Served:
    case: FamilyCase = request.param
    return family_fleet(case.name), case.name


@pytest.fixture(scope="module")
def deepseek(family_fleet: Callable[[str], Server]) -> Served:
    """The one family whose template opens a think section on request, with single-token markers."""
    return family_fleet("deepseek"), "deepseek"


def valid(arguments: str | dict[str, Any]) -> dict[str, Any]:
    parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(parsed, PARAMETERS)
    return parsed


def submitted(server: Server, model: str) -> dict[str, int]:
    """Requests each model's engine took: the server's several models, or the one it serves alone (as `model`)."""
    body = stats(server)
    if "models" not in body:
        return {model: int(body["submitted"])}  # type: ignore[call-overload]
    reports: dict[str, Any] = body["models"]  # type: ignore[assignment]
    return {name: int(report.get("engine", {}).get("submitted", 0)) for name, report in reports.items()}


def test_a_request_runs_on_its_family_s_own_model(family: Served) -> None:
    """Most families share one server of several models: a request naming a family reaches that family's
    model and no other, so every test here runs on its family's template, tokens and markup."""
    family_server, model = family
    before = submitted(family_server, model)
    family_server.client().chat.completions.create(model=model, messages=ASK, max_tokens=1, temperature=0)
    after = submitted(family_server, model)
    assert {name: count - before.get(name, 0) for name, count in after.items()} == {
        name: int(name == model) for name in after
    }


def test_chat_named_call(family: Served) -> None:
    family_server, model = family
    completion = family_server.client().chat.completions.create(
        model=model,
        messages=ASK,
        tools=CHAT_TOOLS,
        max_tokens=96,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    valid(call.function.arguments)


def test_chat_required_call_streamed(family: Served) -> None:
    family_server, model = family
    # One call: a family without call markup would otherwise write a JSON list, which a random model may not close.
    body = {
        "model": model,
        "messages": ASK,
        "tools": CHAT_TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_tokens": 96,
        "temperature": 0,
    }
    chunks = [c for c in stream_chunks(family_server, "/chat/completions", body) if isinstance(c, dict)]
    deltas = [c["choices"][0] for c in chunks if c["choices"]]  # type: ignore[index]
    calls = [call for d in deltas for call in d["delta"].get("tool_calls") or []]
    assert calls and calls[0]["function"]["name"] in ("get_weather", "get_time")
    valid("".join(call["function"].get("arguments") or "" for call in calls))
    assert deltas[-1]["finish_reason"] == "tool_calls"
    assert not "".join(d["delta"].get("content") or "" for d in deltas)


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        {"type": "any", "disable_parallel_tool_use": True},
    ],
)
def test_messages_forced_call(family: Served, choice: dict[str, str]) -> None:
    family_server, model = family
    tools: list[Any] = [
        {"name": t["function"]["name"], "description": t["function"]["description"], "input_schema": PARAMETERS}
        for t in CHAT_TOOLS
    ]
    message = family_server.anthropic_client().messages.create(
        model=model,
        max_tokens=96,
        messages=ASK,
        tools=tools,
        tool_choice=choice,
        extra_body={"temperature": 0},  # type: ignore[arg-type]
    )
    uses = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and uses, message
    assert uses[0].name == choice.get("name", uses[0].name)
    valid(uses[0].input)  # type: ignore[arg-type]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "get_weather"}])
def test_responses_forced_call(family: Served, choice: Any) -> None:
    family_server, model = family
    tools: list[Any] = [
        {
            "type": "function",
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "parameters": PARAMETERS,
            "strict": True,
        }
        for t in CHAT_TOOLS
    ]
    response = family_server.client().responses.create(
        model=model,
        input="Weather in Paris?",
        tools=tools,
        tool_choice=choice,
        max_output_tokens=96,
        temperature=0,
        store=False,
        parallel_tool_calls=False,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, response.output
    assert calls[0].name == ("get_weather" if isinstance(choice, dict) else calls[0].name)
    valid(calls[0].arguments)


def test_tool_result_round_trip(family: Served) -> None:
    family_server, model = family
    messages: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    client = family_server.client()
    with_result = client.chat.completions.create(
        model=model, messages=messages, tools=CHAT_TOOLS, max_tokens=4, temperature=0
    )
    without = client.chat.completions.create(model=model, messages=ASK, tools=CHAT_TOOLS, max_tokens=4, temperature=0)
    assert with_result.usage is not None and without.usage is not None
    # The call and its result are in the prompt the template rendered.
    assert with_result.usage.prompt_tokens > without.usage.prompt_tokens + 8


def test_reasoning_split_in_every_api(deepseek: Served) -> None:
    family_server, model = deepseek
    chat = family_server.client().chat.completions.create(
        model=model, messages=ASK, max_tokens=12, temperature=0, extra_body={"chat_template_kwargs": {"thinking": True}}
    )
    assert (chat.choices[0].message.model_extra or {}).get("reasoning_content") and not chat.choices[0].message.content
    message = family_server.anthropic_client().messages.create(
        model=model,
        max_tokens=12,
        messages=ASK,
        # Greedy, as the other two: sampled, a random model may write the think section's end within 12 tokens.
        extra_body={"temperature": 0},
        thinking={"type": "adaptive"},  # type: ignore[arg-type]
    )
    assert [block.type for block in message.content] == ["thinking"]
    response = family_server.client().responses.create(
        model=model,
        input="Weather in Paris?",
        max_output_tokens=12,
        temperature=0,
        reasoning={"effort": "high"},
        store=False,
    )
    assert [item.type for item in response.output] == ["reasoning"]


BUDGET = 1024


def test_thinking_budget_closes_the_think_section(deepseek: Served) -> None:
    family_server, model = deepseek
    client = family_server.anthropic_client()
    greedy: dict[str, Any] = {"temperature": 0}  # this SDK's create() takes no temperature argument
    # Anthropic's floor for a budget is 1024 tokens, and the answer needs room after it.
    unbounded = client.messages.create(
        model=model,
        max_tokens=BUDGET + 16,
        messages=ASK,
        thinking={"type": "adaptive"},
        extra_body=greedy,  # type: ignore[arg-type]
    )
    if unbounded.content[0].type != "thinking" or len(unbounded.content) > 1:
        pytest.skip("this random model closes its think section by itself before the budget")
    bounded = client.messages.create(
        model=model,
        max_tokens=BUDGET + 16,
        messages=ASK,
        thinking={"type": "enabled", "budget_tokens": BUDGET},
        extra_body=greedy,
    )
    kinds = [block.type for block in bounded.content]
    assert kinds[0] == "thinking" and "text" in kinds, bounded.content
    # The budget's thinking tokens, then the forced end marker, then the answer.
    assert bounded.content[0].thinking == unbounded.content[0].thinking[: len(bounded.content[0].thinking)]  # type: ignore[union-attr]


NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}
MESSAGES_WEATHER: Any = {"name": "get_weather", "description": "Weather in a city.", "input_schema": PARAMETERS}
RESPONSES_WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": PARAMETERS,
    "strict": True,
}
RESPONSES_ASK: dict[str, Any] = {
    "input": "Weather in Paris?",
    "tools": [RESPONSES_WEATHER],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "temperature": 0,
    "store": False,
}


def test_forced_call_streams_in_every_api(family: Served) -> None:
    family_server, model = family
    """The call's head, then its arguments in pieces, joining to the unstreamed call's, in all three APIs."""
    client = family_server.client()
    ask: dict[str, Any] = {
        "model": model,
        "messages": ASK,
        "tools": CHAT_TOOLS,
        "tool_choice": NAMED,
        "max_tokens": 96,
        "temperature": 0,
    }
    (whole,) = client.chat.completions.create(**ask).choices[0].message.tool_calls or []
    chunks = [c for c in stream_chunks(family_server, "/chat/completions", ask) if isinstance(c, dict) and c["choices"]]
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or []]  # type: ignore[index]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}, calls
    assert "".join(call["function"]["arguments"] for call in calls) == whole.function.arguments  # type: ignore[union-attr]
    with family_server.anthropic_client().messages.stream(
        model=model,
        max_tokens=96,
        messages=ASK,
        # The tools Chat offered, so the prompt is Chat's and so is the greedy call it compares with.
        tools=[
            {**MESSAGES_WEATHER, "name": t["function"]["name"], "description": t["function"]["description"]}
            for t in CHAT_TOOLS
        ],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    ) as stream:
        pieces = [
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        ]  # type: ignore[union-attr]
        final = stream.get_final_message()
    assert len(pieces) >= 2 and json.loads("".join(pieces)) == final.content[-1].input == valid(
        whole.function.arguments
    )  # type: ignore[union-attr]
    with client.responses.stream(**RESPONSES_ASK, model=model, max_output_tokens=96) as responses:
        deltas = [e.delta for e in responses if e.type == "response.function_call_arguments.delta"]  # type: ignore[union-attr]
        output = responses.get_final_response().output
    assert len(deltas) >= 2 and "".join(deltas) == output[-1].arguments  # type: ignore[union-attr]
    valid(output[-1].arguments)  # type: ignore[union-attr]


def test_forced_call_cut_by_max_tokens_is_a_call(family: Served) -> None:
    family_server, model = family
    """Every budget short of the whole call ends `length` with no markup as text, and a call once its name is
    whole, with a prefix of the whole call's arguments; Messages and Responses say the same in their terms."""
    client = family_server.client()
    ask: dict[str, Any] = {"model": model, "messages": ASK, "tools": CHAT_TOOLS, "tool_choice": NAMED, "temperature": 0}
    whole = client.chat.completions.create(**ask, max_tokens=96)
    arguments = (whole.choices[0].message.tool_calls or [])[0].function.arguments  # type: ignore[union-attr]
    assert whole.usage is not None
    budget, cut = whole.usage.completion_tokens, arguments
    while cut == arguments:
        budget -= 1
        assert budget > 0, "no budget cut the call inside its arguments"
        choice = client.chat.completions.create(**ask, max_tokens=budget).choices[0]
        assert choice.finish_reason == "length" and not choice.message.content, choice
        calls = choice.message.tool_calls or []
        assert [call.function.name for call in calls] == ["get_weather"], choice  # type: ignore[union-attr]
        cut = calls[0].function.arguments  # type: ignore[union-attr]
        assert arguments.startswith(cut), (cut, arguments)
    message = family_server.anthropic_client().messages.create(
        model=model,
        max_tokens=budget,
        messages=ASK,
        tools=[MESSAGES_WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        extra_body={"temperature": 0},
    )
    assert message.stop_reason == "max_tokens" and [block.type for block in message.content] == ["tool_use"]
    response = client.responses.create(**RESPONSES_ASK, model=model, max_output_tokens=budget)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [(item.type, item.status) for item in response.output] == [("function_call", "incomplete")]
