"""The `gemma3` built-in served: real weights through the real server, and its sliding-window caches across turns.

Gemma 3's sliding-window layers keep 512 tokens (mlx-lm's `RotatingKVCache`):
past that, an entry holds exactly its tokens and serves the next turn only
from the state kept at the turn boundary (docs/DESIGN.md, "Prompt cache and
cache kinds"). Here a first turn longer than the window is extended by a
second through the server, which reports the tokens it took from the
cache. That such a second turn is token for token the one made from
scratch is shown on Gemma 3's shape, in
tests/stages/cache/test_prompt_cache_shaped.py (a real-weights copy of it
here cost 18 s of the suite, most of it two loads of a 262k-token
embedding). Greedy, on the weights as this backend serves them.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.conftest import Server, ServerFactory

# Converting and loading Gemma 3 270M and prefilling turns past its window take a while on two busy cores.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

MODEL = "mlx-relay/gemma3"
WINDOW = 512
# The base model has no chat tuning; shown one exchange, it answers the next question in kind.
EXAMPLE = [
    {"role": "user", "content": "What is the capital of Italy?"},
    {"role": "assistant", "content": "The capital of Italy is Rome."},
]
# Some 550 tokens: just past the window.
DIARY = " ".join(f"Day {day}: the weather in Lyon was mild and the market was busy." for day in range(1, 34))


@pytest.fixture(scope="module")
def gemma3_server(gemma3_model: Path, server_factory: ServerFactory) -> Server:
    # In the HTTP process: a worker would load the 262k-token tokenizer a second time (4 s here), and the worker
    # path is the same for every model (tests/e2e/test_workers.py).
    return server_factory(model="gemma3", in_process="1")


@pytest.fixture
def gemma(gemma3_server: Server) -> openai.OpenAI:
    return gemma3_server.client(timeout=300.0)


def test_a_chat_request_answers_through_gemmas_template(gemma: openai.OpenAI) -> None:
    question = {"role": "user", "content": "What is the capital of France?"}
    reply = gemma.chat.completions.create(model=MODEL, messages=[*EXAMPLE, question], temperature=0, max_tokens=8)  # type: ignore[list-item]
    assert (reply.choices[0].message.content or "").startswith("The capital of France is Paris")
    assert reply.model == MODEL


def test_a_second_turn_past_the_window_is_served_from_the_first(gemma: openai.OpenAI) -> None:
    turn = [{"role": "user", "content": f"{DIARY}\nWhich city is this diary about?"}]
    first = gemma.chat.completions.create(model=MODEL, messages=turn, temperature=0, max_tokens=4)  # type: ignore[arg-type]
    assert first.usage is not None and first.usage.prompt_tokens > WINDOW
    answer = {"role": "assistant", "content": first.choices[0].message.content or ""}
    follow_up = [*turn, answer, {"role": "user", "content": "And which weekday was day 3?"}]
    second = gemma.chat.completions.create(model=MODEL, messages=follow_up, temperature=0, max_tokens=4)  # type: ignore[arg-type]
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens


def test_prompt_lookup_copies_past_its_sliding_window(gemma3_server: Server, gemma: openai.OpenAI) -> None:
    """Prompt lookup is on by default, and Gemma 3's rotating layers are cut back after each verifying pass: a
    completion that repeats a list, past the 512-token window, has its proposals accepted, and says so in /stats."""
    from tests import loopback

    listing = ", ".join(f"item {n} of the ledger" for n in range(1, 9))
    prompt = f"{DIARY}\n{listing}; {listing}; {listing}; item 1 of"
    reply = gemma.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=24)
    assert reply.usage is not None and reply.usage.prompt_tokens > WINDOW
    assert reply.choices[0].text.startswith(" the ledger, item 2 of the ledger")
    gateway = loopback.get(f"{gemma3_server.base_url}/stats", timeout=10).json()["gateway"]
    assert gateway["speculation_off"] is None
    assert gateway["speculation"]["accepted_tokens"] > 0
