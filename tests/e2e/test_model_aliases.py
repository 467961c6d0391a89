"""MLX_RELAY_MODEL_ALIASES: other names for the served model, listed and echoed."""

from __future__ import annotations

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory

HELLO = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def aliased(server_factory: ServerFactory) -> Server:
    return server_factory(model_name="served", model_aliases="gpt-4o=served,qwen2.5-coder:7b=served")


def test_aliases_are_listed_and_retrievable(aliased: Server) -> None:
    client = aliased.client()
    assert [model.id for model in client.models.list()] == ["served", "gpt-4o", "qwen2.5-coder:7b"]
    card = client.models.retrieve("qwen2.5-coder:7b")
    assert card.id == "qwen2.5-coder:7b" and card.model_extra is not None and card.model_extra["root"] == "served"
    with pytest.raises(Exception, match="does not exist"):
        client.models.retrieve("gpt-5")


def test_a_request_by_alias_is_answered_under_that_alias(aliased: Server) -> None:
    client = aliased.client()
    by_alias = client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert by_alias.model == "gpt-4o"
    other = client.chat.completions.create(model="anything", messages=HELLO, max_tokens=2)  # type: ignore[arg-type]
    assert other.model == "served"
    assert client.completions.create(model="qwen2.5-coder:7b", prompt="x", max_tokens=2).model == "qwen2.5-coder:7b"
    assert client.responses.create(model="gpt-4o", input="Hi", max_output_tokens=2).model == "gpt-4o"
    stream = client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=2, stream=True)  # type: ignore[arg-type]
    assert {chunk.model for chunk in stream} == {"gpt-4o"}


def test_embeddings_rerank_and_score_are_answered_under_the_alias_asked_by(aliased: Server) -> None:
    """As OpenAI's replies do, `model` is the name the request used; a name that is no alias answers as the served
    id."""
    client = aliased.client()
    assert client.embeddings.create(model="gpt-4o", input="Hi").model == "gpt-4o"
    assert client.embeddings.create(model="anything", input="Hi").model == "served"
    assert client.embeddings.create(model="served", input="Hi").model == "served"
    for path, body in (
        ("rerank", {"query": "sea", "documents": ["ocean", "desk"]}),
        ("score", {"text_1": "sea", "text_2": "ocean"}),
    ):
        for model, answered in (("qwen2.5-coder:7b", "qwen2.5-coder:7b"), ("anything", "served")):
            reply = loopback.post(f"{aliased.v1}/{path}", json={"model": model, **body}, timeout=60)
            assert reply.status_code == 200 and reply.json()["model"] == answered


def test_an_alias_for_a_model_not_served_stops_the_start(server_factory: ServerFactory) -> None:
    with pytest.raises(RuntimeError, match="MLX_RELAY_MODEL_ALIASES maps 'gpt-4o' to 'other'"):
        server_factory(model_name="served", model_aliases="gpt-4o=other")
