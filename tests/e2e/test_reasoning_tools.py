"""Reasoning split and tool rendering through the real template and server."""

from __future__ import annotations

import json

import openai
from tokenizers import Tokenizer

from tests.conftest import Server
from tests.e2e.conftest import stream_chunks

HELLO = [{"role": "user", "content": "Think first."}]
OPENED = "<|im_start|>user\nThink first.<|im_end|>\n<|im_start|>assistant\n<think>\n"


def test_text_inside_think_goes_to_reasoning(client: openai.OpenAI) -> None:
    # With `thinking`, the demo template opens a <think> block itself, so the
    # whole (greedy) output is reasoning; the raw continuation shows what it is.
    raw = client.completions.create(model="m", prompt=OPENED, max_tokens=20, temperature=0).choices[0].text
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=20,
        temperature=0,  # type: ignore[arg-type]
        extra_body={"chat_template_kwargs": {"thinking": True}},
    )
    message = completion.choices[0].message
    assert "</think>" not in raw
    assert message.content == ""
    extra = message.model_extra or {}
    assert extra["reasoning_content"] == extra["reasoning"] == raw.strip()
    # Every generated token was spent thinking.
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == completion.usage.completion_tokens == 20


def test_streamed_reasoning_deltas(server: Server, client: openai.OpenAI) -> None:
    body = {"messages": HELLO, "max_tokens": 20, "temperature": 0, "chat_template_kwargs": {"thinking": True}}
    chunks = [c for c in stream_chunks(server, "/chat/completions", body) if isinstance(c, dict)]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]  # type: ignore[index]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    assert reasoning and all(d.get("content") in (None, "") for d in deltas)
    assert all(d["reasoning"] == d["reasoning_content"] for d in deltas if "reasoning_content" in d)
    whole = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=20,
        temperature=0,  # type: ignore[arg-type]
        extra_body={"chat_template_kwargs": {"thinking": True}},
    )
    assert reasoning == (whole.choices[0].message.model_extra or {})["reasoning_content"]


def test_think_marker_is_never_streamed_as_text(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    # A bias makes the model open a think block at once; the marker itself
    # must not reach the answer text.
    think = tokenizer.token_to_id("<think>")
    completion = client.chat.completions.create(
        model="m",
        messages=HELLO,
        max_tokens=1,
        logit_bias={str(think): 100},  # type: ignore[arg-type]
    )
    assert completion.choices[0].message.content == ""
    assert "<think>" not in json.dumps(completion.model_dump())


def _banned(tokenizer: Tokenizer, *tokens: str) -> dict[str, int]:
    """A bias that keeps `tokens` out of the output (with the end of the turn, so the reply runs to max_tokens)."""
    return {str(tokenizer.token_to_id(token)): -100 for token in ("<|im_end|>", "<|endoftext|>", *tokens)}


def test_a_think_tag_in_the_users_words_opens_no_reasoning(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    # The prompt's last think tag is the user's, a few tokens before the generation prompt, which opens none: the
    # reply is the answer. The bias keeps markers out of the output, so where its text goes is how the reply opened.
    markers = _banned(tokenizer, "<think>", "</think>")
    completion = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Close this tag: <think>"}],
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
        logit_bias=markers,  # type: ignore[arg-type]
    )
    message = completion.choices[0].message
    assert message.content
    assert not (message.model_extra or {}).get("reasoning_content")
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == 0


def test_a_continued_turn_inside_its_own_long_think_block_goes_on_reasoning(
    client: openai.OpenAI, tokenizer: Tokenizer
) -> None:
    # The assistant's own unfinished turn opened a think block far more than a few tokens back: what follows is
    # still reasoning.
    opened = "<think>\n" + "I should weigh each option in turn before I answer. " * 6
    completion = client.chat.completions.create(
        model="m",
        messages=[*HELLO, {"role": "assistant", "content": opened}],
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
        logit_bias=_banned(tokenizer, "</think>"),  # type: ignore[arg-type]
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    message = completion.choices[0].message
    assert message.content == ""
    assert (message.model_extra or {})["reasoning_content"]
    assert completion.usage is not None and completion.usage.completion_tokens_details is not None
    assert completion.usage.completion_tokens_details.reasoning_tokens == completion.usage.completion_tokens


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_tools_and_tool_turns_render_through_the_template(client: openai.OpenAI, tokenizer: Tokenizer) -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
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
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    completion = client.chat.completions.create(
        model="m",
        messages=messages,
        tools=[WEATHER],
        max_tokens=1,
        temperature=0,  # type: ignore[arg-type, list-item]
    )
    signature = json.dumps(WEATHER, separators=(", ", ": "))
    rendered = (
        "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{signature}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(tokenizer.encode(rendered).ids)


def test_tool_choice_none_leaves_tools_out(client: openai.OpenAI) -> None:
    with_tools = client.chat.completions.create(
        model="m",
        messages=HELLO,
        tools=[WEATHER],
        max_tokens=1,
        temperature=0,  # type: ignore[arg-type, list-item]
    )
    without = client.chat.completions.create(
        model="m",
        messages=HELLO,
        tools=[WEATHER],
        tool_choice="none",
        max_tokens=1,
        temperature=0,  # type: ignore[arg-type, list-item]
    )
    plain = client.chat.completions.create(model="m", messages=HELLO, max_tokens=1, temperature=0)  # type: ignore[arg-type]
    assert with_tools.usage and without.usage and plain.usage
    assert without.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens


def test_reasoning_effort_switches_thinking(client: openai.OpenAI) -> None:
    low = client.chat.completions.create(model="m", messages=HELLO, max_tokens=1, reasoning_effort="low")  # type: ignore[arg-type]
    off = client.chat.completions.create(model="m", messages=HELLO, max_tokens=1, reasoning_effort="minimal")  # type: ignore[arg-type]
    assert low.usage and off.usage
    # "minimal" turns thinking off: the template adds its empty think block.
    assert off.usage.prompt_tokens > low.usage.prompt_tokens
