"""A dedicated embedding model beside the chat model, through the official `openai` SDK on a real server."""

from __future__ import annotations

import threading
import time

import httpx
import numpy as np
import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

EMBEDDER = "mlx-relay/shaped:qwen3-embedding-0.6b-2l"
CHAT = "mlx-relay/tiny"
TEXTS = ["the sea is blue", "cats sleep a lot", "waves and tides", "x"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(server_factory: ServerFactory) -> Server:
    return server_factory(embedding_model="shaped:qwen3-embedding-0.6b-2l", embedding_matryoshka="256,512")


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return server.client()


def _vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def test_both_models_are_listed_with_their_own_windows(client: openai.OpenAI, server: Server) -> None:
    assert [model.id for model in client.models.list()] == [CHAT, EMBEDDER]
    card = loopback.get(f"{server.v1}/models/{EMBEDDER}").json()
    assert card["id"] == EMBEDDER and card["max_model_len"] == 32768


def test_the_request_model_chooses_which_model_embeds(client: openai.OpenAI, server: Server) -> None:
    """The embedding model's vectors are its width; the chat model still answers when named; none named is the
    embedder."""
    dedicated = client.embeddings.create(model=EMBEDDER, input=TEXTS)
    chat = client.embeddings.create(model=CHAT, input=TEXTS)
    assert (dedicated.model, _vectors(dedicated).shape) == (EMBEDDER, (4, 1024))
    assert (chat.model, _vectors(chat).shape) == (CHAT, (4, 64))
    np.testing.assert_allclose(np.linalg.norm(_vectors(dedicated), axis=1), 1.0, rtol=1e-5)
    unnamed = loopback.post(f"{server.v1}/embeddings", json={"input": TEXTS, "encoding_format": "float"}).json()
    assert unnamed["model"] == EMBEDDER
    np.testing.assert_allclose(
        np.array([item["embedding"] for item in unnamed["data"]]), _vectors(dedicated), atol=1e-6
    )


def test_an_input_alone_or_in_a_batch_gets_the_same_vector(client: openai.OpenAI) -> None:
    batch = _vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS, encoding_format="float"))
    for i, text in enumerate(TEXTS):
        alone = _vectors(client.embeddings.create(model=EMBEDDER, input=text, encoding_format="float"))[0]
        np.testing.assert_allclose(alone, batch[i], atol=1e-4)


def test_declared_matryoshka_sizes_truncate_and_renormalize(client: openai.OpenAI) -> None:
    full = _vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS))
    for size in (256, 512):
        cut = _vectors(client.embeddings.create(model=EMBEDDER, input=TEXTS, dimensions=size))
        reference = full[:, :size] / np.linalg.norm(full[:, :size], axis=1, keepdims=True)
        assert cut.shape == (4, size)
        np.testing.assert_allclose(cut, reference, atol=1e-5)
    assert _vectors(client.embeddings.create(model=EMBEDDER, input="x", dimensions=1024)).shape == (1, 1024)


@pytest.mark.parametrize(
    ("model", "dimensions", "words"),
    [(EMBEDDER, 300, "256, 512"), (EMBEDDER, 4096, "256, 512"), (CHAT, 32, "does not support Matryoshka")],
)
def test_a_size_not_declared_is_a_400_naming_dimensions(
    client: openai.OpenAI, model: str, dimensions: int, words: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model=model, input="x", dimensions=dimensions)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "dimensions" and words in error["message"]


def test_chat_naming_the_embedding_model_is_a_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == "model" and "embedding model" in error["message"]
    reply = client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert reply.model == CHAT


def test_an_unknown_model_is_a_404_while_two_are_served(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="no-such-model", input="x")
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "model_not_found"


def test_rerank_with_the_embedding_model_is_cosine_similarity(client: openai.OpenAI, server: Server) -> None:
    """A sentence-transformers model scores as vLLM scores with an embedding model: the cosine of the two embeddings."""
    vectors = _vectors(client.embeddings.create(model=EMBEDDER, input=["ocean", *TEXTS[:3]]))
    expected = vectors[1:] @ vectors[0]
    ranked = loopback.post(
        f"{server.v1}/rerank", json={"model": EMBEDDER, "query": "ocean", "documents": TEXTS[:3]}, timeout=60
    ).json()
    assert ranked["model"] == EMBEDDER
    assert {r["index"]: r["relevance_score"] for r in ranked["results"]} == pytest.approx(
        dict(enumerate(expected)), abs=1e-4
    )
    scored = loopback.post(f"{server.v1}/score", json={"model": CHAT, "text_1": "ocean", "text_2": TEXTS[:3]}).json()
    assert scored["model"] == CHAT and all(0.0 <= item["score"] <= 1.0 for item in scored["data"])


def test_a_seeded_stream_is_unchanged_by_the_dedicated_models_work(server: Server, no_eos: dict[str, int]) -> None:
    """The embedding model runs on the chat model's thread between its steps, and the stream's tokens stay the same."""
    body = {
        "model": CHAT,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 120,
        "temperature": 1.0,
        "seed": 11,
        "logit_bias": no_eos,
        "logprobs": True,
    }
    alone = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=120).json()
    finished: list[float] = []
    stop = threading.Event()

    def embed_load() -> None:
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                response = http.post(
                    f"{server.v1}/embeddings", json={"model": EMBEDDER, "input": f"tides {len(finished)}"}
                )
                assert response.status_code == 200
                finished.append(time.monotonic())

    load = threading.Thread(target=embed_load)
    load.start()
    try:
        while not finished:
            time.sleep(0.01)
        began = time.monotonic()
        beside = loopback.post(f"{server.v1}/chat/completions", json=body, timeout=120).json()
        ended = time.monotonic()
    finally:
        stop.set()
        load.join()
    assert any(began < at < ended for at in finished), "no embedding finished while the stream ran"
    tokens = [[item["token"] for item in reply["choices"][0]["logprobs"]["content"]] for reply in (alone, beside)]
    assert tokens[0] == tokens[1] and len(tokens[0]) == 120


def test_tokenize_and_detokenize_use_the_named_models_tokenizer(server: Server) -> None:
    """/tokenize naming the embedding model counts its tokens against its window; the chat model's otherwise."""
    chat_window = loopback.get(f"{server.v1}/models/{CHAT}").json()["max_model_len"]
    text = "The tides of the ocean"
    answers = {
        name: loopback.post(f"{server.base_url}/tokenize", json={"model": name, "prompt": text}).json()
        for name in (EMBEDDER, CHAT, None)
    }
    assert answers[EMBEDDER]["max_model_len"] == 32768, answers
    assert answers[CHAT]["max_model_len"] == answers[None]["max_model_len"] == chat_window != 32768
    for name in (EMBEDDER, CHAT):
        back = loopback.post(
            f"{server.base_url}/detokenize", json={"model": name, "tokens": answers[name]["tokens"]}
        ).json()
        assert back["prompt"].strip() == text
    unknown = loopback.post(f"{server.base_url}/tokenize", json={"model": "no-such-model", "prompt": text})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
