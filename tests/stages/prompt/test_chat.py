"""stages/prompt/chat.py: chat requests rendered through the demo model's own template."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from pipeline.errors import ErrorKind, RequestError
from pipeline.requests import (
    ChatRequest,
    ClearThinking,
    GenerationParams,
    ImagePart,
    JsonValue,
    Message,
    Role,
    Sampling,
    TextRequest,
    Tool,
    ToolCallRecord,
)
from pipeline.tracing import Timeline
from stages.messages import Parsed, PrepKind, Reply
from stages.models.loading import Tokenizer
from stages.prompt.chat import ChatJobs, render_chat, render_chat_text, renders_at_once
from wire.openai_requests import decode_chat

PARAMS = GenerationParams(max_tokens=8, sampling=Sampling())


def request(*messages: Message, **template_kwargs: JsonValue) -> ChatRequest:
    return ChatRequest(messages=messages, params=PARAMS, template_kwargs=template_kwargs)


def m(role: Role, content: str, **fields: Any) -> Message:
    return Message(role=role, content=content, **fields)


RENDERED = [
    pytest.param(
        request(m(Role.USER, "hi")),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        id="user",
    ),
    pytest.param(
        request(m(Role.SYSTEM, "Be brief."), m(Role.USER, "hi")),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        id="system-first",
    ),
    pytest.param(
        request(m(Role.DEVELOPER, "Be brief."), m(Role.USER, "hi")),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        id="developer-renders-as-system",
    ),
    pytest.param(
        request(m(Role.USER, "a"), m(Role.DEVELOPER, "later rule"), m(Role.USER, "b")),
        "<|im_start|>user\na<|im_end|>\n<|im_start|>system\nlater rule<|im_end|>\n"
        "<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n",
        id="developer-mid-conversation",
    ),
    pytest.param(
        request(m(Role.USER, "q"), m(Role.ASSISTANT, "a"), m(Role.USER, "q2")),
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n",
        id="multi-turn",
    ),
    pytest.param(
        request(
            m(Role.USER, "q"),
            m(Role.ASSISTANT, ""),
            m(Role.TOOL, "42", tool_call_id="c1"),
            m(Role.TOOL, "43", tool_call_id="c2"),
        ),
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n",
        id="tool-results-in-one-user-turn",
    ),
    pytest.param(
        request(m(Role.USER, "hi"), enable_thinking=False),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        id="enable_thinking-false-adds-empty-think",
    ),
    pytest.param(
        request(m(Role.USER, "hi"), enable_thinking=True),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        id="enable_thinking-true",
    ),
]


@pytest.mark.parametrize(("chat", "text"), RENDERED)
def test_render_chat(tokenizer: Tokenizer, chat: ChatRequest, text: str) -> None:
    """The prompt is the template's ChatML with the generation prompt, as tokens with single special tokens."""
    tokens = render_chat(tokenizer, chat)
    assert tokenizer.decode(tokens) == text
    assert tokens == tokenizer.encode(text)
    assert tokens[0] == tokenizer.encode("<|im_start|>")[0]


def test_text_parts_render_like_a_string(tokenizer: Tokenizer) -> None:
    """Content sent as text parts renders exactly as the same content sent as one string."""
    parts = decode_chat(
        {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "you"}]}
            ]
        }
    )
    plain = decode_chat({"messages": [{"role": "user", "content": "Hello, you"}]})
    assert render_chat(tokenizer, parts) == render_chat(tokenizer, plain)


class OtherRole(enum.Enum):
    NARRATOR = "narrator"


def test_a_role_the_template_rejects_is_a_400(tokenizer: Tokenizer) -> None:
    """When the template raises on a message, the request fails with a 400 about the messages."""
    bad = request(Message(role=OtherRole.NARRATOR, content="x"))  # type: ignore[arg-type]
    with pytest.raises(RequestError) as caught:
        render_chat(tokenizer, bad)
    assert (caught.value.kind, caught.value.param) == (ErrorKind.INVALID_REQUEST, "messages")
    assert "Unsupported message role: narrator" in caught.value.message


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"chat_template": "{% for %}"}, id="template-syntax-error"),
        # Keys the client controls must not reach apply_chat_template's own parameters or fail
        # as something other than a RequestError: the preparation stage would crash the engine.
        pytest.param({"tokenize": False}, id="tokenize"),
        pytest.param({"continue_final_message": True}, id="continue_final_message"),
        pytest.param({"tools": "not a list"}, id="tools-wrong-type"),
        pytest.param({"documents": 5}, id="documents-wrong-type"),
        pytest.param({"chat_template": "{{ messages[5].content }}"}, id="template-undefined"),
        pytest.param({"chat_template": "{{ 1 / 0 }}"}, id="template-zero-division"),
        pytest.param({"chat_template": "{% for i in range(10**6) %}{% endfor %}"}, id="template-sandbox-range"),
    ],
)
def test_template_kwargs_that_break_rendering_are_a_400(tokenizer: Tokenizer, kwargs: dict[str, JsonValue]) -> None:
    """Whatever a client puts in chat_template_kwargs, rendering fails as a RequestError (400), never otherwise."""
    with pytest.raises(RequestError) as caught:
        render_chat(tokenizer, request(m(Role.USER, "hi"), **kwargs))
    assert caught.value.status == 400


def parsed(request_id: str, generation: ChatRequest | TextRequest) -> Parsed:
    reply: Reply = Reply(request_id)
    return Parsed(request_id=request_id, request=generation, reply=reply, timeline=Timeline.start())


def test_a_small_conversation_renders_on_the_loop_and_anything_that_can_make_a_render_long_off_it(
    tokenizer: Tokenizer,
) -> None:
    small = request(m(Role.SYSTEM, "Be brief."), m(Role.USER, "hi"))
    assert renders_at_once(small)
    assert ChatJobs(tokenizer=tokenizer).job(parsed("small", small), small).inline
    assert renders_at_once(request(m(Role.USER, "x" * 2_048)))
    called = m(Role.ASSISTANT, "", tool_calls=(ToolCallRecord(id="c", name="f", arguments="{}"),))
    long_ones = {
        "long": request(m(Role.USER, "x" * 2_049)),
        "long with its reasoning": request(m(Role.ASSISTANT, "x" * 1_000, reasoning="y" * 1_049)),
        "many messages": request(*[m(Role.USER, "hi")] * 9),
        "an image": request(m(Role.USER, "look", images=(ImagePart(param="p", offset=0, url="https://x/y.png"),))),
        "a call": request(m(Role.USER, "hi"), called),
        "tools": ChatRequest(messages=(m(Role.USER, "hi"),), params=PARAMS, tools=(Tool(name="f"),)),
        "an edit": ChatRequest(messages=(m(Role.USER, "hi"),), params=PARAMS, context_edits=(ClearThinking(),)),
        "a cut to fit": ChatRequest(messages=(m(Role.USER, "hi"),), params=PARAMS, truncate_to_fit=True),
        "template arguments": request(m(Role.USER, "hi"), enable_thinking=False),
    }
    assert [name for name, chat in long_ones.items() if renders_at_once(chat)] == []


def test_chat_jobs_turn_parsed_requests_into_tokenize_jobs(tokenizer: Tokenizer) -> None:
    """A chat request becomes a TOKENIZE job that renders the template in the job, not before."""
    live = parsed("live", request(m(Role.USER, "hi")))
    assert isinstance(live.request, ChatRequest)
    job = ChatJobs(tokenizer=tokenizer).job(live, live.request)
    assert (job.request_id, job.kind, job.request, job.params, job.reply, job.timeline) == (
        "live",
        PrepKind.TOKENIZE,
        live.request,
        PARAMS,
        live.reply,
        live.timeline,
    )
    assert job.tokenize() == render_chat_text(tokenizer, request(m(Role.USER, "hi")))
