"""Fixtures for end-to-end tests: the served tokenizer and raw SSE reading."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from tests import loopback
from tests.conftest import Server


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> Tokenizer:
    """The served model's own tokenizer, read straight from its directory."""
    return Tokenizer.from_file(str(tiny_model / "tokenizer.json"))


@pytest.fixture(scope="session")
def plain_tokens(tokenizer: Tokenizer) -> list[int]:
    """Ids of distinct plain-word tokens whose repetition decodes to repeated text.

    With a logit bias of 100 on one of these, greedy decoding emits it every
    step, so each stream's expected text is known exactly.
    """
    chosen: list[int] = []
    seen: set[str] = set()
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token_id])
        word = len(text) >= 3 and text.isascii() and text.isalpha() and text not in seen
        if word and tokenizer.decode([token_id] * 3) == text * 3:
            chosen.append(token_id)
            seen.add(text)
    assert len(chosen) >= 32
    return chosen


@pytest.fixture(scope="session")
def no_eos(tokenizer: Tokenizer) -> dict[str, int]:
    """A logit bias that keeps sampling from ending early on an EOS."""
    return {str(tokenizer.token_to_id(token)): -100 for token in ("<|im_end|>", "<|endoftext|>")}


def sse_events(response: httpx.Response) -> Iterator[dict[str, object] | str]:
    """The `data:` payloads of an SSE response, JSON-decoded; `[DONE]` as a string."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        payload = line.removeprefix("data: ")
        yield payload if payload == "[DONE]" else json.loads(payload)


def stream_chunks(server: Server, path: str, body: dict[str, object]) -> list[dict[str, object] | str]:
    with loopback.stream("POST", f"{server.v1}{path}", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(response))


def stats(server: Server) -> dict[str, object]:
    response = loopback.get(f"{server.base_url}/stats", timeout=10)
    response.raise_for_status()
    body: dict[str, object] = response.json()
    return body


@pytest.fixture(scope="session")
def agent_server(server_factory: Callable[..., Server]) -> Server:
    """A server of the tiny model with a 64k window whose turns end: agent clients' prompts fit."""
    from stages.models.demo import ensure_demo_model

    ensure_demo_model("tiny-64k")
    return server_factory(demo_model="tiny-64k", keepalive_interval="1", pinned=True)


@pytest.fixture(scope="session")
def family_models(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A family's test model (tests/families.py) by name, built once a session."""
    from tests.families import CASES

    root = tmp_path_factory.mktemp("families")
    built: dict[str, Path] = {}

    def model(name: str) -> Path:
        if name not in built:
            case = next(case for case in CASES if case.name == name)
            built[name] = case.build(tiny_model, root / name)
        return built[name]

    return model


@pytest.fixture(scope="session")
def family_servers(
    family_models: Callable[[str], Path], server_factory: Callable[..., Server]
) -> Callable[[str], Server]:
    """A family's server by name (tests/families.py), serving that model alone under any model name: every module
    asking gets the same one."""
    from tests.families import CASES

    def serve(name: str) -> Server:
        case = next(case for case in CASES if case.name == name)
        settings = {"model": str(family_models(name)), "model_name": name}
        if case.tool_parser is not None:
            settings["tool_parser"] = case.tool_parser
        return server_factory(**settings, pinned=True)

    return serve


@pytest.fixture(scope="session")
def family_fleet(
    family_models: Callable[[str], Path],
    family_servers: Callable[[str], Server],
    tmp_path_factory: pytest.TempPathFactory,
    server_factory: Callable[..., Server],
) -> Callable[[str], Server]:
    """A server answering requests whose `model` is the family's name (tests/families.py).

    Every family whose call markup is found from its model shares one server of several models (docs/models.md),
    each its own worker: fourteen servers took 1.6 s each to start, mostly the front's, where a model of the fleet
    loads in a fraction of that. A family that needs a server-wide setting (`tool_parser`) gets its own server,
    which answers any model name.
    """
    from tests.families import CASES

    shared = [case.name for case in CASES if case.tool_parser is None]
    models_file = tmp_path_factory.mktemp("family-fleet") / "models.toml"
    models_file.write_text("".join(f'[models.{name}]\nmodel = "{family_models(name)}"\n' for name in shared))

    def serve(name: str) -> Server:
        if name not in shared:
            return family_servers(name)
        return server_factory(models_file=str(models_file), pinned=True)

    return serve
