"""`/v1/completions` `suffix`: fill-in-the-middle on a model whose vocabulary has FIM markers, a 400 on one without."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from tokenizers import Tokenizer

from stages.models.demo_variants import derive_demo_model
from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stream_chunks

# Qwen2.5-Coder's markers.
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>")
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n    return total\n"


@pytest.fixture(scope="module")
def fim_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny demo model with Qwen2.5-Coder's FIM tokens added, its own template kept."""
    template = (tiny_model / "chat_template.jinja").read_text(encoding="utf-8")
    return derive_demo_model(
        tiny_model,
        tmp_path_factory.mktemp("fim"),
        template=template,
        special_tokens=FIM_TOKENS,
        bos=None,
        eos=("<|im_end|>", "<|endoftext|>"),
    )


@pytest.fixture(scope="module")
def fim_server(server_factory: ServerFactory, fim_model: Path) -> Server:
    return server_factory(model=str(fim_model))


def test_suffix_fills_in_the_middle(fim_server: Server, fim_model: Path) -> None:
    tokenizer = Tokenizer.from_file(str(fim_model / "tokenizer.json"))
    client = fim_server.client()
    completion = client.completions.create(model="m", prompt=PREFIX, suffix=SUFFIX, max_tokens=6, temperature=0)
    psm = tokenizer.encode(f"<|fim_prefix|>{PREFIX}<|fim_suffix|>{SUFFIX}<|fim_middle|>").ids
    # The model saw the prefix-suffix-middle prompt, each marker one token.
    assert completion.usage is not None and completion.usage.prompt_tokens == len(psm)
    assert psm[0] == tokenizer.token_to_id("<|fim_prefix|>") and psm[-1] == tokenizer.token_to_id("<|fim_middle|>")
    plain = client.completions.create(model="m", prompt=PREFIX, max_tokens=6, temperature=0)
    assert plain.usage is not None and plain.usage.prompt_tokens < completion.usage.prompt_tokens


def test_a_fim_marker_ends_the_middle(fim_server: Server, fim_model: Path) -> None:
    pad = Tokenizer.from_file(str(fim_model / "tokenizer.json")).token_to_id("<|fim_pad|>")
    body = {"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 6, "temperature": 0, "logit_bias": {str(pad): 100}}
    chunks = [c for c in stream_chunks(fim_server, "/completions", body) if isinstance(c, dict)]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == ""  # type: ignore[index]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    # Without a suffix the same marker is ordinary output that does not end the text.
    plain = fim_server.client().completions.create(
        model="m", prompt=PREFIX, max_tokens=6, temperature=0, logit_bias={str(pad): 100}
    )
    assert plain.choices[0].finish_reason == "length"


def test_suffix_with_token_ids_is_a_400(fim_server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        fim_server.client().completions.create(model="m", prompt=[1, 2, 3], suffix=SUFFIX, max_tokens=2)
    assert caught.value.body["param"] == "suffix"  # type: ignore[index]


def test_suffix_on_a_model_without_fim_tokens_is_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", prompt=PREFIX, suffix=SUFFIX, max_tokens=2)
    assert caught.value.body["param"] == "suffix" and caught.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert "fill-in-the-middle" in caught.value.body["message"]  # type: ignore[index]
