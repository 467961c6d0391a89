"""Client libraries nobody on this project wrote, used as their users use them, against one tiny-model server:
instructor's RESPONSES_TOOLS mode (a named tool forced beside a text format), litellm's `anthropic/` provider
with a `response_format` (Anthropic's structured-outputs field under its beta name, or a forced tool, as litellm
chooses by model), langchain-openai's `with_structured_output(include_raw=True)`, and the `ollama` clients'
structured outputs (`format=Model.model_json_schema()`; the npm package's cases are tests/e2e/test_ollama_js.py).

instructor is installed without its pins (they hold jiter<0.15 and rich<15, which openai>=3 and this
environment outgrew); each test skips, saying so, where its library is absent."""

from __future__ import annotations

import os
from typing import Literal

import ollama
import openai
import pytest
from pydantic import BaseModel, ConfigDict

from tests import loopback
from tests.conftest import Server

pytestmark = pytest.mark.slow

# litellm reads its model price map from the network unless told to use its own copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


class Weather(BaseModel):
    """Bounded fields and no others (`additionalProperties: false`): a random-weight model's answer stays short."""

    model_config = ConfigDict(extra="forbid")

    city: Literal["Paris", "Rome"]
    # An enumeration, not a range: litellm moves `minimum`/`maximum` into a description for Anthropic.
    days: Literal[1, 2, 3, 4, 5, 6, 7]


def test_instructor_responses_tools(server: Server) -> None:
    instructor = pytest.importorskip("instructor")
    client = instructor.from_openai(server.client(), mode=instructor.Mode.RESPONSES_TOOLS)
    for _ in range(2):
        weather = client.responses.create(
            model="m", input="Weather in Paris?", response_model=Weather, max_output_tokens=200, max_retries=0
        )
        assert isinstance(weather, Weather)


# litellm builds pydantic models of TypedDicts whose ReadOnly items pydantic warns about, on first use.
@pytest.mark.filterwarnings("ignore:.* using the `ReadOnly` qualifier:UserWarning")
@pytest.mark.parametrize("model", ["claude-sonnet-4-5", "m"], ids=["output_format", "forced-tool"])
def test_litellm_anthropic_response_format(server: Server, model: str) -> None:
    litellm = pytest.importorskip("litellm")
    response_format = {"type": "json_schema", "json_schema": {"name": "weather", "schema": Weather.model_json_schema()}}
    for _ in range(2):
        reply = litellm.completion(
            model=f"anthropic/{model}",
            api_base=server.base_url,
            api_key="unused",
            max_tokens=200,
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            response_format=response_format,
        )
        Weather.model_validate_json(reply.choices[0].message.content)


def test_langchain_with_structured_output_include_raw(server: Server) -> None:
    chat_openai = pytest.importorskip("langchain_openai")
    llm = chat_openai.ChatOpenAI(base_url=server.v1, api_key="unused", model="m", max_tokens=200, max_retries=0)
    for method in ("json_schema", "function_calling"):
        result = llm.with_structured_output(Weather, method=method, include_raw=True).invoke("Weather in Paris?")
        assert result["parsing_error"] is None, (method, result["raw"])
        assert isinstance(result["parsed"], Weather)


def test_openai_sdk_parse_helper_beside_a_forced_tool(server: Server) -> None:
    """The `openai` SDK's own `parse`: a format and a forced, strict tool in one request (was a 400)."""
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    completion = server.client().chat.completions.parse(
        model="m",
        messages=[{"role": "user", "content": "Weather?"}],
        response_format=Weather,
        tools=[tool],
        tool_choice="required",
        max_tokens=200,
        parallel_tool_calls=False,
    )
    [call] = completion.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Weather)  # type: ignore[union-attr]


def test_ollama_structured_output(server: Server) -> None:
    """The `ollama` Python client's structured outputs, as its documentation writes them."""
    with ollama.Client(host=server.base_url, verify=loopback.TLS) as client:
        for _ in range(2):
            reply = client.chat(
                model="tiny",
                messages=[{"role": "user", "content": "Weather in Paris?"}],
                format=Weather.model_json_schema(),
                options={"num_predict": 200},
            )
            Weather.model_validate_json(reply.message.content or "")
