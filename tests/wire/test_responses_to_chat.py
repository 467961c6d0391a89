"""wire/responses_requests.py: a validated request, with stored history spliced in front, as a chat request.

How bodies validate is in test_responses_requests.py (and its refusals in test_responses_requests_refused.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.events import ReasoningDelta, TextDelta, ToolCall
from pipeline.requests import (
    ChatRequest,
    GenerationParams,
    JsonObject,
    JsonValue,
    Message,
    Role,
    Sampling,
    ToolCallRecord,
    ToolChoice,
    ToolChoiceMode,
)
from tests.wire.test_responses_requests import (
    HI,
    PARTS_ITEM,
    USER_HI_ITEM,
    WEATHER,
    WEATHER_TOOL,
    body,
)
from wire.responses import output_items
from wire.responses_requests import continued_input, decode_responses, to_chat


def chat(*messages: Message, **fields: Any) -> ChatRequest:
    return ChatRequest(
        messages=messages,
        params=fields.pop("params", GenerationParams(max_tokens=None, sampling=Sampling())),
        **fields,
    )


def assistant_item(text: str) -> JsonObject:
    return {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(call_id: str, name: str = "get_weather", arguments: JsonValue = '{"n": 1}') -> JsonObject:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def function_output(call_id: str, output: JsonValue) -> JsonObject:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def record(call_id: str, name: str = "get_weather", arguments: str = '{"n": 1}') -> ToolCallRecord:
    return ToolCallRecord(id=call_id, name=name, arguments=arguments)


def items(*values: JsonValue) -> dict[str, JsonValue]:
    return body(input=list(values))


CHATS = [
    pytest.param(body(), (), None, chat(HI), id="string-input"),
    pytest.param(
        items(
            {"role": "system", "content": "S"},
            {"role": "developer", "content": [{"type": "input_text", "text": "D"}]},
            PARTS_ITEM,
            assistant_item("Hi!"),
            {"type": "message", "role": "user", "content": [{"type": "text", "text": "more"}]},
        ),
        (),
        None,
        chat(
            Message(role=Role.SYSTEM, content="S"),
            Message(role=Role.DEVELOPER, content="D"),
            Message(role=Role.USER, content="ab"),
            Message(role=Role.ASSISTANT, content="Hi!"),
            Message(role=Role.USER, content="more"),
        ),
        id="message-items-every-role-and-text-part",
    ),
    pytest.param(
        items(USER_HI_ITEM, assistant_item("Checking."), function_call("call_1"), function_call("call_2", "now", "{}")),
        (),
        None,
        chat(
            HI,
            Message(
                role=Role.ASSISTANT, content="Checking.", tool_calls=(record("call_1"), record("call_2", "now", "{}"))
            ),
        ),
        id="function_calls-join-the-preceding-assistant-message",
    ),
    pytest.param(
        items(USER_HI_ITEM, function_call("call_1"), function_call("call_2")),
        (),
        None,
        chat(HI, Message(role=Role.ASSISTANT, content="", tool_calls=(record("call_1"), record("call_2")))),
        id="function_calls-without-assistant-message-make-one",
    ),
    pytest.param(
        items(
            USER_HI_ITEM,
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
            assistant_item("ok"),
            {"type": "reasoning", "id": "rs_2", "summary": []},
            function_call("call_1", arguments={"n": 2}),
            {"type": "function_call", "call_id": "call_2", "name": "now"},
            function_output("call_1", "42"),
            function_output("call_2", [{"type": "input_text", "text": "no"}, {"type": "input_text", "text": "on"}]),
        ),
        (),
        None,
        chat(
            HI,
            Message(
                role=Role.ASSISTANT,
                content="ok",
                tool_calls=(record("call_1", arguments='{"n": 2}'), record("call_2", "now", "{}")),
            ),
            Message(role=Role.TOOL, content="42", tool_call_id="call_1"),
            Message(role=Role.TOOL, content="noon", tool_call_id="call_2"),
        ),
        id="reasoning-skipped-arguments-object-or-missing-outputs-to-tool-messages",
    ),
    pytest.param(
        items(function_output("call_1", "42"), function_call("call_2")),
        (),
        None,
        chat(
            Message(role=Role.TOOL, content="42", tool_call_id="call_1"),
            Message(role=Role.ASSISTANT, content="", tool_calls=(record("call_2"),)),
        ),
        id="function_call-after-tool-output-is-a-new-turn",
    ),
    pytest.param(
        body(input="Next?", instructions="ignored here"),
        (USER_HI_ITEM, assistant_item("Hello.")),
        "Be brief.",
        chat(
            Message(role=Role.SYSTEM, content="Be brief."),
            HI,
            Message(role=Role.ASSISTANT, content="Hello."),
            Message(role=Role.USER, content="Next?"),
        ),
        id="effective-instructions-lead-history-before-new-input",
    ),
    pytest.param(
        items(function_output("call_1", "42")),
        (USER_HI_ITEM, function_call("call_1")),
        None,
        chat(
            HI,
            Message(role=Role.ASSISTANT, content="", tool_calls=(record("call_1"),)),
            Message(role=Role.TOOL, content="42", tool_call_id="call_1"),
        ),
        id="tool-output-answers-a-stored-call",
    ),
    pytest.param(body(), (), "", chat(HI), id="empty-instructions-add-no-message"),
    pytest.param(
        body(
            max_output_tokens=8,
            temperature=0.0,
            stream=True,
            tools=[WEATHER],
            tool_choice="required",
            reasoning={"effort": "high"},
        ),
        (),
        None,
        chat(
            HI,
            params=GenerationParams(max_tokens=8, sampling=Sampling(temperature=0.0)),
            template_kwargs={"enable_thinking": True, "reasoning_effort": "high"},
            tools=(WEATHER_TOOL,),
            tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED),
            stream=True,
        ),
        id="params-tools-and-template-kwargs-carried",
    ),
]


@pytest.mark.parametrize(("value", "history", "instructions", "expected"), CHATS)
def test_to_chat(
    value: JsonValue, history: tuple[JsonObject, ...], instructions: str | None, expected: ChatRequest
) -> None:
    """The chat request is the instructions, then the stored history, then the new input, as messages."""
    assert to_chat(decode_responses(value), history, instructions) == expected


def test_continued_input_is_stored_input_then_output() -> None:
    """A follow-up replays the stored input, then the stored output items; non-objects are skipped."""
    stored_input: list[JsonValue] = [USER_HI_ITEM]
    stored_output: list[JsonValue] = [assistant_item("a"), "junk", function_call("call_1")]
    assert continued_input(stored_input, stored_output) == (USER_HI_ITEM, assistant_item("a"), function_call("call_1"))
    assert continued_input([], []) == ()


def test_a_responses_output_replays_as_the_assistant_turn() -> None:
    """The output items the stream builds decode back to the turn that produced them."""
    output: list[JsonValue] = list(
        output_items(
            [
                ReasoningDelta(text="think"),
                TextDelta(text="Let me "),
                TextDelta(text="look."),
                ToolCall(index=0, id="call_1", name="get_weather", arguments='{"n": 1}'),
            ]
        )
    )
    history = continued_input([USER_HI_ITEM], output)
    follow_up = decode_responses(items(function_output("call_1", "7")))
    assert to_chat(follow_up, history, None).messages == (
        HI,
        Message(role=Role.ASSISTANT, content="Let me look.", tool_calls=(record("call_1"),)),
        Message(role=Role.TOOL, content="7", tool_call_id="call_1"),
    )
