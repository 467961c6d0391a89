"""LoRA adapters through a real server and the official SDKs.

The server serves two random adapters of the tiny model beside it
(`MLX_RELAY_ADAPTERS`). Greedy outputs are compared token for token with
mlx-lm's own generate, with the adapter loaded as mlx-lm loads it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import mlx_lm
import openai
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server, ServerFactory

pytestmark = pytest.mark.slow

PROMPTS = ([5, 17, 99, 230, 41, 7, 88, 19], [300, 12, 12, 8, 44, 410], [64, 65, 66, 67, 68, 69, 70, 71, 72, 73])
MAX_TOKENS = 16
NAMES: tuple[str | None, ...] = (None, "lora-a", "lora-b")


@pytest.fixture(scope="module")
def lora_server(server_factory: ServerFactory, lora_adapters: dict[str, Path]) -> Server:
    # An alias may name an adapter (MLX_RELAY_MODEL_ALIASES composes with MLX_RELAY_ADAPTERS).
    return server_factory(
        adapters=",".join(f"{name}={path}" for name, path in lora_adapters.items()), model_aliases="sql=lora-a"
    )


@pytest.fixture(scope="module")
def base_id(lora_server: Server) -> str:
    return lora_server.client().models.list().data[0].id


def mlx_lm_texts(
    model_path: Path, adapter: Path | None, prompts: tuple[list[int], ...], tokenizer: Tokenizer
) -> list[str]:
    """mlx-lm's greedy text for each prompt, with the adapter loaded as mlx-lm loads it."""
    model, wrapper = mlx_lm.load(str(model_path), adapter_path=str(adapter) if adapter else None)
    texts = []
    for prompt in prompts:
        tokens = [r.token for r in mlx_lm.stream_generate(model, wrapper, prompt=prompt, max_tokens=MAX_TOKENS)]
        eos = [i for i, token in enumerate(tokens) if token in wrapper.eos_token_ids]
        texts.append(tokenizer.decode(tokens[: eos[0]] if eos else tokens))
    return texts


@pytest.fixture(scope="module")
def expected(
    tiny_model: Path, lora_adapters: dict[str, Path], tokenizer: Tokenizer
) -> dict[tuple[str | None, int], str]:
    """mlx-lm's greedy text for each (adapter, prompt index)."""
    texts = {}
    for name in NAMES:
        for index, text in enumerate(
            mlx_lm_texts(tiny_model, lora_adapters[name] if name else None, PROMPTS, tokenizer)
        ):
            texts[name, index] = text
    return texts


def complete(server: Server, model: str, index: int | list[int], **extra: Any) -> Any:
    prompt = PROMPTS[index] if isinstance(index, int) else index
    return server.client().completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, **extra)


def test_models_lists_each_adapter_as_a_model(lora_server: Server, base_id: str) -> None:
    client = lora_server.client()
    cards = client.models.list().data
    assert [card.id for card in cards] == [base_id, "lora-a", "lora-b", "sql"]
    card = client.models.retrieve("lora-b")
    assert card.id == "lora-b" and card.model_extra is not None and card.model_extra["parent"] == base_id
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("lora-c")
    assert caught.value.code == "model_not_found"


def test_an_alias_for_an_adapter_runs_it_and_is_answered_under_the_alias(
    lora_server: Server, base_id: str, expected: dict[tuple[str | None, int], str]
) -> None:
    completion = complete(lora_server, "sql", 0)
    assert completion.model == "sql" and completion.choices[0].text == expected["lora-a", 0]
    card = lora_server.client().models.retrieve("sql")
    assert card.model_extra is not None and (card.model_extra["root"], card.model_extra["parent"]) == (
        "lora-a",
        base_id,
    )


def test_each_adapter_answers_as_mlx_lm_generate_with_it_loaded(
    lora_server: Server, base_id: str, expected: dict[tuple[str | None, int], str]
) -> None:
    """Greedy completions of base and adapters equal mlx-lm's, and differ from one another."""
    for name in NAMES:
        for index in range(len(PROMPTS)):
            completion = complete(lora_server, name or base_id, index)
            assert completion.choices[0].text == expected[name, index], (name, index)
            assert completion.model == (name or base_id)
    for index in range(len(PROMPTS)):
        assert len({expected[name, index] for name in NAMES}) == 3


def test_mixed_concurrent_requests_each_equal_their_solo_output(
    lora_server: Server, base_id: str, expected: dict[tuple[str | None, int], str]
) -> None:
    """Base, adapter A and adapter B rows at once, streaming and not: each gets its own adapter's text."""
    jobs = [(name, index, stream) for name in NAMES for index in range(len(PROMPTS)) for stream in (False, True)]

    def one(job: tuple[str | None, int, bool]) -> str:
        name, index, stream = job
        if not stream:
            return str(complete(lora_server, name or base_id, index).choices[0].text)
        chunks = complete(lora_server, name or base_id, index, stream=True)
        return "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)

    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(one, jobs))
    assert texts == [expected[name, index] for name, index, _ in jobs]


def test_chat_and_messages_pick_the_adapter_by_model(lora_server: Server, base_id: str) -> None:
    """Every API routes by `model`: the adapter's reply differs from the base model's, and repeats itself."""
    messages = [{"role": "user", "content": "Say something."}]
    client = lora_server.client()

    def chat(model: str) -> str:
        completion = client.chat.completions.create(model=model, messages=messages, max_tokens=12, temperature=0)  # type: ignore[arg-type]
        assert completion.model == model
        return str(completion.choices[0].message.content)

    def message(model: str) -> str:
        reply = lora_server.anthropic_client().messages.create(
            model=model, messages=messages, max_tokens=12, extra_body={"temperature": 0}
        )  # type: ignore[arg-type]
        return "".join(block.text for block in reply.content if block.type == "text")

    assert chat("lora-a") == chat("lora-a") != chat(base_id)
    assert message("lora-a") == chat("lora-a") and message(base_id) == chat(base_id)


def test_the_adapters_field_is_honoured(
    lora_server: Server, base_id: str, expected: dict[tuple[str | None, int], str]
) -> None:
    """mlx-lm's server's `adapters` field (a served adapter's name or path) picks the adapter too."""
    completion = complete(lora_server, base_id, 0, extra_body={"adapters": "lora-b"})
    assert completion.choices[0].text == expected["lora-b", 0]
    with pytest.raises(openai.NotFoundError) as caught:
        complete(lora_server, base_id, 0, extra_body={"adapters": "/not/served"})
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as clash:
        complete(lora_server, "lora-a", 0, extra_body={"adapters": "lora-b"})
    assert (clash.value.body or {}).get("param") == "adapters"  # type: ignore[union-attr]


def test_an_unknown_model_is_a_404_in_each_api_shape(lora_server: Server) -> None:
    client = lora_server.client()
    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(model="lora-c", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.value.code == "model_not_found" and "lora-c" in chat.value.message
    with pytest.raises(openai.NotFoundError) as responses:
        client.responses.create(model="lora-c", input="hi", max_output_tokens=2)
    assert responses.value.code == "model_not_found"
    with pytest.raises(anthropic.NotFoundError) as messages:
        lora_server.anthropic_client().messages.create(
            model="lora-c", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert messages.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        lora_server.anthropic_client().messages.count_tokens(
            model="lora-c", messages=[{"role": "user", "content": "hi"}]
        )
    counted = lora_server.anthropic_client().messages.count_tokens(
        model="lora-a", messages=[{"role": "user", "content": "hi"}]
    )
    assert counted.input_tokens > 0


def test_the_prompt_cache_never_serves_one_adapters_kv_to_another(
    lora_server: Server, base_id: str, tiny_model: Path, lora_adapters: dict[str, Path], tokenizer: Tokenizer
) -> None:
    """A prompt the base model cached is a miss for an adapter, and the adapter's answer is still its own."""
    # A prompt no other test sends, so the cache holds it under no adapter yet.
    prompt = [401, 402, 17, 403, 404, 9, 405, 406, 407]
    first = complete(lora_server, base_id, prompt)
    assert cached(first) == 0 and first.choices[0].text == mlx_lm_texts(tiny_model, None, (prompt,), tokenizer)[0]
    assert cached(complete(lora_server, base_id, prompt)) == len(prompt) - 1
    for name in ("lora-a", "lora-b"):
        (text,) = mlx_lm_texts(tiny_model, lora_adapters[name], (prompt,), tokenizer)
        cold = complete(lora_server, name, prompt)
        assert cached(cold) == 0 and cold.choices[0].text == text
        warm = complete(lora_server, name, prompt)
        assert cached(warm) == len(prompt) - 1 and warm.choices[0].text == text


def cached(completion: Any) -> int:
    details = completion.usage.prompt_tokens_details
    return 0 if details is None else int(details.cached_tokens or 0)


def test_embeddings_and_scores_refuse_an_adapter_they_would_not_apply(lora_server: Server, base_id: str) -> None:
    """They run on the base model: an adapter (or its alias) is a 400 naming `model`, an unknown name a 404."""
    client = lora_server.client()
    for model in ("lora-b", "sql"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=model, input="Hi")
        assert refused.value.code == "model_not_supported" and base_id in refused.value.message
        scored = loopback.post(
            f"{lora_server.v1}/score", json={"model": model, "text_1": "a", "text_2": "b"}, timeout=60
        )
        assert scored.status_code == 400 and scored.json()["error"]["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="lora-c", input="Hi")
    assert client.embeddings.create(model=base_id, input="Hi").model == base_id


def test_embeddings_use_the_base_model_whichever_adapter_ran_last(lora_server: Server, base_id: str) -> None:
    client = lora_server.client()
    before = client.embeddings.create(model=base_id, input="the same words", encoding_format="float").data[0].embedding
    complete(lora_server, "lora-a", 0)
    after = client.embeddings.create(model=base_id, input="the same words", encoding_format="float").data[0].embedding
    assert after == pytest.approx(before, abs=1e-5)
