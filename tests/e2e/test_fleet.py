"""Several models behind one server (fleet/), through the real SDKs.

Three servers: tiny and demo by `MLX_RELAY_MODEL=tiny,demo` (behind a
key, for the admin routes); three tiny-shaped models from a models file
under a budget that holds two (eviction, ttl, defaults, a refusal); and
`mlx-relay serve --model tiny --model demo`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

import anthropic
import httpx
import openai
import pytest

from tests import loopback
from tests.conftest import REPO, STARTUP_TIMEOUT, Server, ServerFactory, _free_port

pytestmark = pytest.mark.slow
KEY = "unused"
HEADERS = {"authorization": f"Bearer {KEY}"}
MiB = 2**20


@pytest.fixture(scope="module")
def pair(server_factory: ServerFactory) -> Server:
    return server_factory(model="tiny,demo", api_key=KEY, pinned=True)


def chat(client: openai.OpenAI, model: str, **extra: object) -> openai.types.chat.ChatCompletion:
    messages: list[dict[str, str]] = [{"role": "user", "content": "Hi"}]
    create = client.chat.completions.create
    reply = create(model=model, messages=messages, max_tokens=3, **extra)  # type: ignore[call-overload]
    return cast(openai.types.chat.ChatCompletion, reply)


def models(server: Server) -> dict[str, dict[str, object]]:
    listed = loopback.get(f"{server.v1}/models", headers=HEADERS, timeout=10).json()["data"]
    return {card["id"]: card for card in listed}


def admin(server: Server, name: str, action: str, **kwargs: object) -> httpx.Response:
    # The edge takes JSON bodies only: an admin call sends an empty object.
    url = f"{server.base_url}/admin/models/{name}/{action}"
    return loopback.post(url, json={}, timeout=60, **kwargs)  # type: ignore[arg-type]


def test_two_models_are_chosen_by_model_in_every_api(pair: Server) -> None:
    client, claude = pair.client(), pair.anthropic_client()
    assert chat(client, "mlx-relay/tiny").model == "mlx-relay/tiny"
    # A built-in is also asked for by its bare name, and answered under it.
    assert chat(client, "demo").model == "demo"
    assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).model == "tiny"
    assert client.responses.create(model="demo", input="Hi", max_output_tokens=16).model == "demo"
    message = claude.messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert message.model == "tiny"
    assert claude.messages.count_tokens(model="demo", messages=[{"role": "user", "content": "Hi"}]).input_tokens > 0
    assert client.embeddings.create(model="demo", input="Hi").model == "demo"
    windows = {
        name: loopback.post(
            f"{pair.base_url}/tokenize", json={"model": name, "prompt": "Hi"}, headers=HEADERS, timeout=10
        ).json()["max_model_len"]
        for name in ("tiny", "demo")
    }
    # Each model's own tokenizer and window answer (tiny's config says 2048, demo's 4096).
    assert windows == {"tiny": 2048, "demo": 4096}
    cards = models(pair)
    assert {cards[name]["state"] for name in ("mlx-relay/tiny", "mlx-relay/demo")} == {"ready"}
    assert cards["tiny"]["root"] == "mlx-relay/tiny" and cards["mlx-relay/demo"]["context_window"] == 4096


def test_an_unknown_model_is_a_404_in_each_api_s_shape(pair: Server) -> None:
    client, claude = pair.client(), pair.anthropic_client()
    with pytest.raises(openai.NotFoundError) as chat_error:
        chat(client, "gpt-4o")
    assert chat_error.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-4o", input="Hi")
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="gpt-4o", input="Hi")
    with pytest.raises(anthropic.NotFoundError) as messages_error:
        claude.messages.create(model="claude-x", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert messages_error.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="claude-x", messages=[{"role": "user", "content": "Hi"}])
    for path, body in (
        ("/tokenize", {"model": "x", "prompt": "Hi"}),
        ("/v1/score", {"model": "x", "text_1": "a", "text_2": "b"}),
    ):
        assert loopback.post(f"{pair.base_url}{path}", json=body, headers=HEADERS, timeout=10).status_code == 404
    assert loopback.get(f"{pair.v1}/models/gpt-4o", headers=HEADERS, timeout=10).status_code == 404


def test_admin_routes_need_the_key_and_know_the_models(pair: Server) -> None:
    assert admin(pair, "demo", "load").status_code == 401
    assert admin(pair, "gpt-4o", "load", headers=HEADERS).json()["error"]["code"] == "model_not_found"
    assert (
        loopback.post(f"{pair.base_url}/admin/models/demo/reboot", json={}, headers=HEADERS, timeout=10).status_code
        == 404
    )
    assert admin(pair, "demo", "unload", headers=HEADERS).json()["state"] == "unloaded"
    assert models(pair)["mlx-relay/demo"]["state"] == "unloaded"
    assert admin(pair, "demo", "load", headers=HEADERS).json()["state"] == "ready"
    assert admin(pair, "demo", "drain", headers=HEADERS).json()["state"] == "unloaded"
    # Unloaded is not gone: the next request loads it again.
    assert chat(pair.client(), "demo").model == "demo"
    health = loopback.get(f"{pair.base_url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["models"]["mlx-relay/demo"]["state"] == "ready"
    stats = loopback.get(f"{pair.base_url}/stats", headers=HEADERS, timeout=10).json()["models"]["mlx-relay/demo"]
    assert stats["loads"] == stats["unloads"] + 1 and stats["engine"]["submitted"] >= 1


def test_stats_say_how_many_blas_threads_each_worker_has(pair: Server) -> None:
    told = loopback.get(f"{pair.base_url}/stats", headers=HEADERS, timeout=10).json()["worker_blas_threads"]
    # The suite sets one BLAS thread (tests/conftest.py), which every worker inherits as it is; without it, two
    # models' workers share the cores (tests/stages/remote/test_blas_share.py).
    variables = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    given = [f"{name}={os.environ[name]}" for name in variables if name in os.environ]
    assert told == "from the environment: " + ", ".join(given)


def test_a_load_leaves_the_other_model_s_streams_whole(pair: Server) -> None:
    """demo loads while tiny streams: every tiny stream runs to its max_tokens."""
    admin(pair, "demo", "unload", headers=HEADERS)
    client = pair.client()
    streaming = threading.Barrier(5, timeout=60)

    def stream() -> tuple[int, str | None]:
        chunks = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=400,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        finish, tokens, waited = None, 0, False
        for chunk in chunks:
            if not waited and chunk.choices and chunk.choices[0].delta.content:
                streaming.wait()
                waited = True
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return tokens, finish

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(stream) for _ in range(4)]
        streaming.wait()
        assert admin(pair, "demo", "load", headers=HEADERS).json()["state"] == "ready"
        assert [future.result(timeout=120) for future in futures] == [(400, "length")] * 4


@pytest.fixture(scope="module")
def trio(
    server_factory: ServerFactory,
    tiny_model: Path,
    lora_adapters: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Server:
    """alpha, beta and gamma (tiny-shaped) at 40 MiB each, under a 100 MiB budget; gamma ships a generation_config.

    alpha serves the adapter lora-a; beta serves lora-b, its default adapter.
    """
    root = tmp_path_factory.mktemp("fleet")
    shipped = root / "tiny-shipped"
    shutil.copytree(tiny_model, shipped)
    (shipped / "generation_config.json").write_text(json.dumps({"temperature": 0.0, "max_new_tokens": 4}))
    models_file = root / "models.toml"
    models_file.write_text(f"""
[models.alpha]
model = "tiny"
aliases = ["a"]
adapters = {{ "lora-a" = "{lora_adapters["lora-a"]}" }}
kv = {{ memory_budget = {40 * MiB} }}
defaults = {{ max_tokens = 2 }}
[models.beta]
model = "tiny"
adapters = {{ "lora-b" = "{lora_adapters["lora-b"]}" }}
kv = {{ memory_budget = {40 * MiB} }}
defaults = {{ adapter = "lora-b" }}
[models.gamma]
model = "{shipped}"
ttl = 2
kv = {{ memory_budget = {40 * MiB} }}
[models.huge]
model = "tiny"
kv = {{ memory_budget = {400 * MiB} }}
""")
    return server_factory(models_file=str(models_file), memory_budget=str(100 * MiB))


def states(server: Server) -> dict[str, object]:
    return {name: card["state"] for name, card in models(server).items() if name in ("alpha", "beta", "gamma")}


def wait_for(server: Server, expected: dict[str, str], timeout: float = 30.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while (current := states(server)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return current


def test_a_third_model_evicts_the_least_recently_used_and_ttl_unloads(trio: Server) -> None:
    client = trio.client()
    assert states(trio) == {"alpha": "unloaded", "beta": "unloaded", "gamma": "unloaded"}
    chat(client, "a")
    chat(client, "beta")
    assert states(trio) == {"alpha": "ready", "beta": "ready", "gamma": "unloaded"}
    chat(client, "gamma")
    assert states(trio) == {"alpha": "unloaded", "beta": "ready", "gamma": "ready"}
    chat(client, "alpha")
    # beta was used before gamma: it goes.
    assert states(trio)["beta"] == "unloaded"
    # gamma's ttl is 2 s; alpha has none.
    assert wait_for(trio, {"alpha": "ready", "beta": "unloaded", "gamma": "unloaded"}) == {
        "alpha": "ready",
        "beta": "unloaded",
        "gamma": "unloaded",
    }
    assert chat(client, "gamma").model == "gamma"
    assert states(trio)["gamma"] == "ready"
    gamma = loopback.get(f"{trio.base_url}/stats", timeout=10).json()["models"]["gamma"]
    assert (gamma["loads"], gamma["unloads"]) == (2, 1)


def test_a_model_that_cannot_fit_is_a_503_with_retry_after(trio: Server) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        chat(trio.client(), "huge")
    assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"]
    assert "budget" in refused.value.message
    # The others are untouched.
    assert chat(trio.client(), "a").model == "a"


def test_defaults_from_the_file_and_the_generation_config_and_the_request_wins(trio: Server) -> None:
    client = trio.client()
    # alpha's file default: 2 tokens; gamma's generation_config.json: 4; a request's own max_tokens wins.
    for model, default in (("alpha", 2), ("gamma", 4)):
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], extra_body={"ignore_eos": True}
        )
        assert reply.usage is not None and reply.usage.completion_tokens == default
    asked = chat(client, "alpha", extra_body={"ignore_eos": True}).usage
    assert asked is not None and asked.completion_tokens == 3
    gamma = models(trio)["gamma"]
    assert gamma["defaults"] == {"temperature": 0.0, "max_tokens": 4}
    fit = loopback.get(f"{trio.base_url}/fit", params={"model": "beta"}, timeout=30).json()
    assert fit["footprint"]["bytes"] == 40 * MiB and fit["budget_bytes"] == 100 * MiB


def test_an_adapter_is_a_model_and_a_default_adapter_answers_for_its_model(trio: Server) -> None:
    client = trio.client()

    def greedy(model: str) -> tuple[str, str | None]:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=8,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return reply.model, reply.choices[0].message.content

    assert greedy("lora-a")[0] == "lora-a"
    card = models(trio)["lora-a"]
    assert (card["root"], card["parent"], card["state"]) == ("lora-a", "alpha", "ready")
    # beta, asked by its name, runs its default adapter lora-b (and answers as beta); the bare base does not.
    (as_beta, by_default), (_, by_name) = greedy("beta"), greedy("lora-b")
    assert as_beta == "beta" and by_default == by_name
    assert greedy("alpha")[1] != by_default
    assert models(trio)["beta"]["defaults"] == {"adapter": "lora-b"}


def test_mlx_relay_serve_with_a_repeated_model_serves_both(tmp_path: Path) -> None:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_")}
    # `python -m mlx_relay` from this checkout: the installed console script may belong to another one.
    command = [sys.executable, "-m", "mlx_relay", "serve", "--port", str(port), "--model", "tiny", "--model", "demo"]
    with (tmp_path / "serve.log").open("wb") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _healthy(f"{base}/health"):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        listed = {card["id"] for card in loopback.get(f"{base}/v1/models", timeout=10).json()["data"]}
        assert {"mlx-relay/tiny", "mlx-relay/demo"} <= listed
        with openai.OpenAI(base_url=f"{base}/v1", api_key="x", max_retries=0) as client:
            assert [chat(client, name).model for name in ("tiny", "demo")] == ["tiny", "demo"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _healthy(url: str) -> bool:
    try:
        return loopback.get(url, timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_a_bad_models_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "models.toml").write_text("[models.a]\nmodle = 'tiny'\n")
    command = [
        sys.executable,
        "-m",
        "mlx_relay",
        "serve",
        "--port",
        str(_free_port()),
        "--models-file",
        str(tmp_path / "models.toml"),
    ]
    refused = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "unknown key 'modle'" in refused.stderr
