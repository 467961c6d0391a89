"""Ollama's API through the real `ollama` npm package, as its JavaScript users call it, against the shared server.

`tests/e2e/ollama_js/cases.cjs` runs each case with the client (chat and generate, streamed and whole; tools;
`format` with a JSON schema; embed and the older embeddings; list, show, ps and version; a refused option)
and prints what came back as one JSON object; the assertions are here. The package is installed at its pinned
version into ~/.cache/mlx-relay/npm-ollama the first time, from npm's registry; without node or npm the tests
skip, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Server

OLLAMA_JS = "ollama@0.6.4"
PREFIX = Path.home() / ".cache" / "mlx-relay" / "npm-ollama"
CASES = Path(__file__).with_name("ollama_js") / "cases.cjs"
DONE_FIELDS = ("total_duration", "load_duration", "prompt_eval_count", "eval_count", "eval_duration")


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """The pinned `ollama` package's node_modules folder, installed once per machine."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed: the `ollama` JavaScript client comes from npm")
    modules = PREFIX / "node_modules"
    installed = modules / "ollama" / "package.json"
    version = OLLAMA_JS.split("@")[1]
    if not installed.exists() or json.loads(installed.read_text())["version"] != version:
        PREFIX.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(PREFIX), "--no-audit", "--no-fund", OLLAMA_JS],
            check=True,
            timeout=300,
            capture_output=True,
        )
    return modules


@pytest.fixture(scope="module")
def found(node_modules: Path, server: Server) -> dict[str, Any]:
    ran = subprocess.run(
        ["node", str(CASES), server.base_url],
        env={**os.environ, "NODE_PATH": str(node_modules)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert ran.returncode == 0, ran.stderr
    return dict(json.loads(ran.stdout))


def _check_done(done: dict[str, Any], *, limit: int) -> None:
    assert done["done_reason"] in ("stop", "length")
    assert all(isinstance(done[name], int) for name in DONE_FIELDS), done
    assert 1 <= done["eval_count"] <= limit and done["prompt_eval_count"] > 0
    assert done["total_duration"] >= done["eval_duration"] > 0


def test_chat_whole_and_streamed(found: dict[str, Any]) -> None:
    chat = found["chat"]
    assert chat["role"] == "assistant" and isinstance(chat["whole"], str)
    _check_done(chat["done"], limit=5)
    assert chat["dones"] == [False] * (len(chat["dones"]) - 1) + [True]
    _check_done(chat["last"], limit=5)
    # The same seed makes the same row: the streamed pieces join into the whole answer.
    assert chat["text"] == chat["whole"]


def test_generate_whole_and_streamed(found: dict[str, Any]) -> None:
    generate = found["generate"]
    _check_done(generate["done"], limit=4)
    _check_done(generate["last"], limit=4)
    assert generate["text"] == generate["whole"]


def test_tools_reach_the_prompt_and_come_back_whole(found: dict[str, Any]) -> None:
    """The tiny model has no call markup, so under Ollama's (automatic) tool choice it answers in text: what is
    checked is that the tools and a history of calls and results reach the prompt, and any call is well formed."""
    tools = found["tools"]
    for call in tools["calls"]:
        assert call["function"]["name"] == "get_weather" and isinstance(call["function"]["arguments"], dict)
    assert tools["prompt_tokens"]["tools"] > tools["prompt_tokens"]["bare"]
    assert tools["history_tokens"]["answered"] > tools["history_tokens"]["asked"]


def test_format_schema_gives_matching_json(found: dict[str, Any]) -> None:
    assert json.loads(found["format"]["content"])["city"] in ("Paris", "Rome")


def test_embed_and_embeddings(found: dict[str, Any]) -> None:
    embeddings = found["embeddings"]
    assert len(embeddings["embeddings"]) == 2 and len(embeddings["embeddings"][0]) > 0
    assert embeddings["prompt_eval_count"] > 0
    assert embeddings["legacy"] == pytest.approx(embeddings["embeddings"][0], rel=1e-5)


def test_list_show_ps_version(found: dict[str, Any]) -> None:
    models = found["models"]
    assert models["names"] and "completion" in models["capabilities"] and models["format"] == "mlx"
    assert any(key.endswith("context_length") for key in models["model_info_keys"])
    assert models["running"] and all(row["expires_at"] and row["context_length"] for row in models["running"])
    assert models["version"].count(".") == 2


def test_refusal_is_a_response_error(found: dict[str, Any]) -> None:
    refusal = found["refusal"]
    assert refusal["refused"] and refusal["name"] == "ResponseError" and refusal["status_code"] == 400
    assert "options.mirostat" in refusal["error"]
