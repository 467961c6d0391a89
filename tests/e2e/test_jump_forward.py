"""Jump-forward end to end, through hypercorn and the openai SDK, on the tiny demo model.

The default server (jump-forward on, through the model worker process) and
one with `MLX_RELAY_JUMP_FORWARD=0` answer the same greedy requests: a
forced call (`tool_choice` naming a function), a JSON-schema reply, both
again from the prompt cache, and all of them at once beside a free reply in
the batch. The replies must be identical, the grammar rows must take fewer
decode steps (`/stats`' `gateway.steps`), and `gateway.jump_forward` must
count the forced tokens taken, so a server that never jumped cannot pass.
The Qwen3-Coder family's forced calls, whose grammar names `>` and the
newline by id, answer the same with prompt lookup's guesses beside the
grammar as without them (issue #37's leftover).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats
from tests.families import CASES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}, "unit": {"const": "celsius"}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time.", "parameters": WEATHER}},
]
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "kind": {"const": "person"},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "country": {"enum": ["France", "Japan"]},
    },
    "required": ["name", "kind", "age", "country"],
    "additionalProperties": False,
}
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def servers(server_factory: ServerFactory) -> dict[bool, Server]:
    # Prompt lookup (on by default) off: jump-forward's figures alone, `gateway.speculation` null.
    return {True: server_factory(prompt_lookup="0"), False: server_factory(jump_forward="0", prompt_lookup="0")}


def forced_call(server: Server) -> Any:
    client: Any = server.client()
    completion = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=80,
        temperature=0,
    )
    choice = completion.choices[0]
    calls = [(call.function.name, call.function.arguments) for call in choice.message.tool_calls or ()]
    return choice.finish_reason, calls, choice.message.content


def json_reply(server: Server) -> Any:
    schema = {"name": "person", "schema": PERSON, "strict": True}
    client: Any = server.client()
    completion = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "A person, as JSON."}],
        response_format={"type": "json_schema", "json_schema": schema},
        max_tokens=80,
        temperature=0,
    )
    return completion.choices[0].finish_reason, completion.choices[0].message.content


def free_reply(server: Server) -> Any:
    completion = server.client().completions.create(model="m", prompt="alpha beta gamma", max_tokens=30, temperature=0)
    return completion.choices[0].text


def _gateway(server: Server) -> dict[str, Any]:
    figures = stats(server)["gateway"]
    assert isinstance(figures, dict)
    return figures


def _steps_for(server: Server, ask: Callable[[Server], Any]) -> tuple[Any, int, int]:
    """The reply, the decode steps the server took for it, and the forced tokens it took."""
    before = _gateway(server)
    reply = ask(server)
    # A worker's figures reach /stats with its heartbeat: wait until the batch is empty again.
    deadline = time.monotonic() + 20
    while (after := _gateway(server))["active"] or after["generated_tokens"] == before["generated_tokens"]:
        assert time.monotonic() < deadline, "the server's figures did not settle"
        time.sleep(0.1)
    # A heartbeat sent between two steps of the reply: one more beat settles it.
    time.sleep(0.1)
    after = _gateway(server)
    forced = (after["jump_forward"] or {}).get("accepted_tokens", 0) - (before["jump_forward"] or {}).get(
        "accepted_tokens", 0
    )
    return reply, after["steps"] - before["steps"], forced


@pytest.mark.parametrize("ask", [forced_call, json_reply], ids=["forced_call", "json_schema"])
def test_a_grammar_reply_is_the_same_in_fewer_steps(servers: dict[bool, Server], ask: Callable[[Server], Any]) -> None:
    off, steps_off, forced_off = _steps_for(servers[False], ask)
    on, steps_on, forced_on = _steps_for(servers[True], ask)
    assert on == off
    assert forced_off == 0 and forced_on > 0
    assert steps_on < steps_off
    # Again, from the prompt cache: the same reply.
    assert ask(servers[True]) == on and ask(servers[False]) == off


def test_grammar_rows_beside_a_free_row_keep_their_replies(servers: dict[bool, Server]) -> None:
    asks = [forced_call, json_reply, free_reply, forced_call]

    def run(server: Server) -> list[Any]:
        with ThreadPoolExecutor(len(asks)) as pool:
            return list(pool.map(lambda ask: ask(server), asks))

    assert run(servers[True]) == run(servers[False])


def test_stats_name_jump_forward_only_where_it_is_on(servers: dict[bool, Server]) -> None:
    forced_call(servers[True])
    on, off = _gateway(servers[True]), _gateway(servers[False])
    assert off["jump_forward"] is None and on["speculation"] is None
    figures = on["jump_forward"]
    assert figures["forced_tokens"] >= figures["accepted_tokens"] > 0 and figures["spans"] > 0


@pytest.fixture(scope="module")
def qwen3_coder(
    server_factory: ServerFactory, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[bool, Server]:
    """The Qwen3-Coder family's model with prompt lookup asked for (`True`) and off."""
    case = next(case for case in CASES if case.name == "qwen3_coder")
    model = str(case.build(tiny_model, tmp_path_factory.mktemp("qwen3_coder")))
    return {
        looking: server_factory(model=model, model_name="qwen3_coder", prompt_lookup="1" if looking else "0")
        for looking in (True, False)
    }


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_call_is_the_same_beside_prompt_lookup(qwen3_coder: dict[bool, Server], choice: Any) -> None:
    """The drafter copies the tools' markup from the prompt; its guesses are judged under the grammar's mask."""

    def call(server: Server) -> Any:
        completion = server.client().chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=96, temperature=0
        )
        calls = completion.choices[0].message.tool_calls or []
        return completion.choices[0].finish_reason, [(c.function.name, c.function.arguments) for c in calls]

    looked, plain = call(qwen3_coder[True]), call(qwen3_coder[False])
    assert looked == plain and plain[0] == "tool_calls" and plain[1], plain
    # The drafter's guesses were taken (a worker's figures reach /stats with its heartbeat).
    deadline = time.monotonic() + 20
    while not (speculation := _gateway(qwen3_coder[True])["speculation"])["accepted_tokens"]:
        assert time.monotonic() < deadline, speculation
        time.sleep(0.1)
