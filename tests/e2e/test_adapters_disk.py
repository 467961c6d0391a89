"""LoRA adapters and the prompt cache's disk tier, through a real server and the openai SDK.

The memory tier holds one entry, so each new prompt evicts the last one to
disk, filed under the adapter that computed it. A later request of that
adapter restores it and gets exactly the text of a cold run (and of
mlx-lm with the adapter loaded); the base model and the other adapter,
asking with the same tokens, never get it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats
from tests.e2e.test_adapters import MAX_TOKENS, cached, mlx_lm_texts

pytestmark = pytest.mark.slow

# Past RESTORE_GAIN (64) tokens, so a restore pays; distinct from the first token on.
PROMPT = [(7 * i + 3) % 400 + 5 for i in range(150)]
OTHER = [(11 * i + 5) % 400 + 5 for i in range(150)]
# The tiny model's KV is about 512 bytes a token, and the objects that key an entry ~272 (stages/cache/tier.py):
# room for one entry of ~170 tokens, not two.
MEMORY_BYTES = 200_000


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-adapters")


@pytest.fixture(scope="module")
def disk_server(server_factory: ServerFactory, lora_adapters: dict[str, Path], cache_dir: Path) -> Server:
    adapters = ",".join(f"{name}={path}" for name, path in lora_adapters.items())
    return server_factory(adapters=adapters, prompt_cache_bytes=str(MEMORY_BYTES), cache_dir=str(cache_dir))


def complete(server: Server, model: str, prompt: list[int]) -> Any:
    return server.client().completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)


def disk(server: Server) -> dict[str, Any]:
    value = stats(server)["prompt_cache"]
    assert isinstance(value, dict) and isinstance(value["disk"], dict)
    return value["disk"]


def adapter_files(cache_dir: Path, count: int) -> list[Path]:
    """The adapters' files on disk; spills are written in the background, so wait (bounded) for `count`."""
    deadline = time.monotonic() + 30
    while True:
        found = sorted(cache_dir.glob("*/adapters/*/*.safetensors"))
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_an_adapters_kv_comes_back_from_disk_for_it_alone(
    disk_server: Server, cache_dir: Path, tiny_model: Path, lora_adapters: dict[str, Path], tokenizer: Tokenizer
) -> None:
    (expected,) = mlx_lm_texts(tiny_model, lora_adapters["lora-a"], (PROMPT,), tokenizer)
    cold = complete(disk_server, "lora-a", PROMPT)
    assert cached(cold) == 0 and cold.choices[0].text == expected
    complete(disk_server, "lora-b", OTHER)  # evicts lora-a's entry: it spills under lora-a
    assert len(adapter_files(cache_dir, 1)) == 1
    base_id = disk_server.client().models.list().data[0].id
    # The same tokens under the base model and the other adapter: no hit, in memory or on disk.
    for model in (base_id, "lora-b"):
        before = disk(disk_server)["restores"]
        assert cached(complete(disk_server, model, PROMPT)) == 0
        assert disk(disk_server)["restores"] == before
    # lora-a's entry is on disk only (the memory tier holds the last request's): a disk hit.
    before = disk(disk_server)
    warm = complete(disk_server, "lora-a", PROMPT)
    after = disk(disk_server)
    assert after["restores"] == before["restores"] + 1 and after["corrupt"] == 0
    assert cached(warm) == len(PROMPT) - 1 and warm.choices[0].text == cold.choices[0].text
