"""/v1/embeddings through the official SDK, and exclusive work beside running streams."""

from __future__ import annotations

import base64
import struct
import threading
import time

import httpx
import numpy as np
import openai
import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

TEXTS = ["hello world", "a much longer sentence about the weather and the sea", "x", "tokens and more tokens"]


def _vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def test_base64_default_and_float_give_the_same_vectors(client: openai.OpenAI) -> None:
    """The SDK asks for base64 unless told; both decode to the same float32 values, unit length."""
    default = client.embeddings.create(model="any", input=TEXTS)
    floats = client.embeddings.create(model="any", input=TEXTS, encoding_format="float")
    assert [item.index for item in default.data] == list(range(len(TEXTS)))
    np.testing.assert_array_equal(_vectors(default), _vectors(floats))
    np.testing.assert_allclose(np.linalg.norm(_vectors(floats), axis=1), 1.0, rtol=1e-5)
    assert default.object == "list" and default.data[0].object == "embedding"


def test_raw_base64_is_little_endian_float32(server: Server) -> None:
    body = {"input": "hello world", "encoding_format": "base64"}
    encoded = loopback.post(f"{server.v1}/embeddings", json=body).json()["data"][0]["embedding"]
    raw = base64.b64decode(encoded)
    floats = loopback.post(f"{server.v1}/embeddings", json={**body, "encoding_format": "float"}).json()["data"][0][
        "embedding"
    ]
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == pytest.approx(floats, rel=1e-6)


def test_an_input_alone_or_in_a_batch_gets_the_same_vector(client: openai.OpenAI) -> None:
    batch = _vectors(client.embeddings.create(model="any", input=TEXTS, encoding_format="float"))
    for i, text in enumerate(TEXTS):
        alone = _vectors(client.embeddings.create(model="any", input=text, encoding_format="float"))[0]
        np.testing.assert_allclose(alone, batch[i], atol=1e-4)


def test_token_inputs_match_text_and_usage_counts_them(server: Server, client: openai.OpenAI) -> None:
    ids = [loopback.post(f"{server.base_url}/tokenize", json={"prompt": text}).json()["tokens"] for text in TEXTS[:2]]
    by_text = client.embeddings.create(model="any", input=TEXTS[:2], encoding_format="float")
    by_ids = client.embeddings.create(model="any", input=ids, encoding_format="float")
    one_list = client.embeddings.create(model="any", input=ids[0], encoding_format="float")
    np.testing.assert_allclose(_vectors(by_ids), _vectors(by_text), atol=1e-6)
    np.testing.assert_allclose(_vectors(one_list)[0], _vectors(by_text)[0], atol=1e-4)
    assert by_text.usage.prompt_tokens == by_text.usage.total_tokens == sum(map(len, ids))


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({}, "input", "required"),
        ({"input": []}, "input", "empty"),
        ({"input": ""}, "input", "empty"),
        ({"input": ["fine", ""]}, "input[1]", "empty"),
        ({"input": ["fine", 3.5]}, "input[1]", "string"),
        ({"input": [[1, 2], []]}, "input[1]", "empty"),
        ({"input": [[1, -2]]}, "input[0]", "non-negative"),
        ({"input": [1, 999999]}, "input", "vocabulary"),
        ({"input": 7}, "input", "string"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format", "base64"),
        ({"input": "x", "dimensions": 8}, "dimensions", "64 dimensions"),
        ({"input": "x", "dimensions": 0}, "dimensions", ""),
        ({"input": "x", "truncate_prompt_tokens": 8}, "truncate_prompt_tokens", "not supported"),
        ({"input": "word " * 3000}, "input", "2048 tokens"),
        ({"input": ["ok", "word " * 3000]}, "input[1]", "2048 tokens"),
    ],
)
def test_invalid_input_is_a_400_naming_the_field(
    server: Server, body: dict[str, object], param: str, words: str
) -> None:
    response = loopback.post(f"{server.v1}/embeddings", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert words in error["message"]


def test_rerank_sorts_by_relevance_and_score_matches_it(server: Server) -> None:
    documents = ["the sea is blue", "cats sleep a lot", {"text": "waves and tides"}]
    ranked = loopback.post(f"{server.v1}/rerank", json={"query": "ocean", "documents": documents}).json()
    scores = [result["relevance_score"] for result in ranked["results"]]
    assert scores == sorted(scores, reverse=True) and all(0.0 <= s <= 1.0 for s in scores)
    assert sorted(result["index"] for result in ranked["results"]) == [0, 1, 2]
    assert ranked["results"][0]["document"]["text"] in {"the sea is blue", "cats sleep a lot", "waves and tides"}
    texts = ["the sea is blue", "cats sleep a lot", "waves and tides"]
    scored = loopback.post(f"{server.v1}/score", json={"text_1": "ocean", "text_2": texts}).json()
    by_index = {result["index"]: result["relevance_score"] for result in ranked["results"]}
    assert [item["score"] for item in scored["data"]] == pytest.approx([by_index[i] for i in range(3)], abs=1e-5)
    top = loopback.post(
        f"{server.base_url}/rerank", json={"query": "ocean", "documents": texts, "top_n": 1, "return_documents": False}
    ).json()
    assert top["results"] == [
        {"index": ranked["results"][0]["index"], "relevance_score": pytest.approx(scores[0], abs=1e-5)}
    ]


def test_score_refuses_mismatched_lists(server: Server) -> None:
    response = loopback.post(f"{server.v1}/score", json={"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "text_1"


def test_tokenize_round_trips_and_counts_chats_like_count_tokens(server: Server) -> None:
    tokens = loopback.post(
        f"{server.base_url}/tokenize", json={"prompt": "hello world", "return_token_strs": True}
    ).json()
    assert tokens["count"] == len(tokens["tokens"]) and "".join(tokens["token_strs"]).endswith("hello world")
    text = loopback.post(f"{server.base_url}/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text.endswith("hello world")
    messages = [{"role": "user", "content": "What is the tide?"}]
    chat = loopback.post(f"{server.base_url}/tokenize", json={"messages": messages}).json()
    counted = loopback.post(f"{server.v1}/messages/count_tokens", json={"model": "any", "messages": messages}).json()
    assert chat["count"] == counted["input_tokens"] and chat["max_model_len"] == 2048
    bad = loopback.post(f"{server.base_url}/detokenize", json={"tokens": [1, 10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


@pytest.mark.slow
def test_a_seeded_stream_is_unchanged_by_embedding_work_between_its_steps(
    server_factory: ServerFactory, no_eos: dict[str, int]
) -> None:
    """Embeddings run on the model thread between the stream's steps (after every step here), and its tokens stay
    the same."""
    server = server_factory(exclusive_period="1", exclusive_share="1.0")
    body = {
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
                response = http.post(f"{server.v1}/embeddings", json={"input": [f"{TEXTS[1]} {i}" for i in range(16)]})
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


@pytest.mark.slow
def test_a_full_exclusive_queue_answers_429_and_a_client_that_leaves_is_dropped(server_factory: ServerFactory) -> None:
    server = server_factory(exclusive_pending="1", admission_timeout="0")
    big = {"input": [f"{TEXTS[1]} {i} " * 20 for i in range(64)]}
    statuses: list[int] = []

    def post() -> None:
        statuses.append(loopback.post(f"{server.v1}/embeddings", json=big, timeout=300).status_code)

    threads = [threading.Thread(target=post) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert 200 in statuses and 429 in statuses, statuses
    # Four times the work of the others: it must outlast the client's second whatever the attention's speed.
    with pytest.raises(httpx.ReadTimeout):
        loopback.post(f"{server.v1}/embeddings", json={"input": big["input"] * 4}, timeout=1.0)
    deadline = time.monotonic() + 60
    while '"outcome": "cancelled"' not in server.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert '"outcome": "cancelled"' in server.logs()
    assert loopback.post(f"{server.v1}/embeddings", json={"input": "after"}).status_code == 200
    assert loopback.get(f"{server.base_url}/stats").json()["exclusive"]["admission"]["in_flight"] == 0
