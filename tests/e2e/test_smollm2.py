"""The default model answers: SmolLM2 through a real server and the openai SDK.

These are the tests that need real language, which the random-weight demo
models cannot give: a fact, a stop string a user would write, a JSON
answer that means something. Greedy decoding makes each answer fixed.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

# Converting and loading SmolLM2 and its first answers take minutes on two busy cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2_server(smollm2_model: Path, server_factory: ServerFactory) -> Server:
    # Unset MLX_RELAY_MODEL serves the default; naming it keeps the test clear of the caller's environment.
    return server_factory(model="smollm2", pinned=True)


@pytest.fixture
def smol(smollm2_server: Server) -> openai.OpenAI:
    return smollm2_server.client(timeout=300.0)


def test_the_default_model_knows_the_capital_of_france(smol: openai.OpenAI) -> None:
    reply = smol.chat.completions.create(model="mlx-relay/smollm2", messages=FRANCE, temperature=0, max_tokens=24)  # type: ignore[arg-type]
    choice = reply.choices[0]
    assert "Paris" in (choice.message.content or "")
    # It ends its answer itself, with <|im_end|>.
    assert choice.finish_reason == "stop"
    assert reply.model == "mlx-relay/smollm2"


def test_a_full_stop_ends_the_sentence_it_closes(smol: openai.OpenAI) -> None:
    """Streamed, the answer stops before the '.' that would end it, and never shows it."""
    stream = smol.chat.completions.create(
        model="mlx-relay/smollm2",
        messages=FRANCE,
        temperature=0,
        max_tokens=24,
        stop=["."],
        stream=True,  # type: ignore[arg-type]
    )
    chunks = list(stream)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text.rstrip().endswith("Paris") and "." not in text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_a_newline_stop_keeps_the_first_line_of_a_list(smol: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Name three colors, one per line."}]
    reply = smol.chat.completions.create(
        model="mlx-relay/smollm2", messages=messages, temperature=0, max_tokens=24, stop=["\n"]
    )  # type: ignore[arg-type]
    choice = reply.choices[0]
    content = choice.message.content or ""
    assert choice.finish_reason == "stop"
    assert content.strip() and "\n" not in content


def test_a_json_schema_answer_is_the_right_answer(smol: openai.OpenAI) -> None:
    """Constrained to the schema, the model still fills it with the fact."""
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string"}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    reply = smol.chat.completions.create(
        model="mlx-relay/smollm2",
        messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
        temperature=0,
        max_tokens=24,
        response_format={"type": "json_schema", "json_schema": {"name": "capital", "schema": schema, "strict": True}},
    )
    assert json.loads(reply.choices[0].message.content or "") == {"capital": "Paris"}


def test_the_cpu_backend_serves_the_float32_weights_and_says_so(smollm2_server: Server) -> None:
    stats = loopback.get(f"{smollm2_server.base_url}/stats", timeout=10).json()
    assert stats["weights"].startswith("float32, dequantized from 4-bit")
    # Planned for what is served: 135M float32 weights, not the 4-bit file.
    assert stats["admission"]["weights_bytes"] > 500 * 2**20


def test_keep_quantized_serves_the_stored_weights_and_they_still_know_paris(
    smollm2_model: Path, server_factory: ServerFactory
) -> None:
    server = server_factory(model="smollm2", keep_quantized="1")
    stats = loopback.get(f"{server.base_url}/stats", timeout=10).json()
    assert stats["weights"] == "as stored (MLX_RELAY_KEEP_QUANTIZED is set)"
    assert stats["admission"]["weights_bytes"] < 200 * 2**20
    reply = server.client(timeout=300.0).chat.completions.create(
        model="mlx-relay/smollm2",
        messages=FRANCE,
        temperature=0,
        max_tokens=24,  # type: ignore[arg-type]
    )
    assert "Paris" in (reply.choices[0].message.content or "")
