"""The models file and the model list (fleet/spec.py): what is served, and one-line errors for what cannot be."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.spec import Defaults, KvSpec, ModelsFileError, ModelSpec, read_models_file, specs_from_settings
from pipeline.settings import Settings

FULL = """
[models.chat]
model = "smollm2"
aliases = ["default", "assistant"]
adapters = { support = "/adapters/support" }
pinned = true
ttl = 600
[models.chat.kv]
memory_budget = 4294967296
max_batch = 8
[models.chat.defaults]
temperature = 0.7
top_k = 40
max_tokens = 512
adapter = "support"
context_limit = 4096

[models.tiny]
ttl = 30
[models.tiny.kv]
context = 1024
kv_bits = 8
kv_group_size = 32
quantized_kv_start = 0
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_every_key_of_a_model_is_read(tmp_path: Path) -> None:
    chat, tiny = read_models_file(write(tmp_path, FULL))
    assert chat == ModelSpec(
        name="chat",
        source="smollm2",
        aliases=("default", "assistant"),
        adapters="support=/adapters/support",
        pinned=True,
        ttl=600.0,
        kv=KvSpec(memory_budget=4294967296, max_batch=8),
        defaults=Defaults(temperature=0.7, top_k=40, max_tokens=512, adapter="support", context_limit=4096),
    )
    # A model with no `model` key is the built-in (or directory) of its name.
    assert tiny == ModelSpec(
        name="tiny", source="tiny", ttl=30.0, kv=KvSpec(context=1024, kv_bits=8, kv_group_size=32, quantized_kv_start=0)
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param("[models.a]\nmodle = 'tiny'\n", "unknown key 'modle'", id="misspelt-key"),
        pytest.param("[models.a.defaults]\ntemprature = 1\n", "unknown key 'temprature'", id="misspelt-default"),
        pytest.param("[models.a]\nttl = -1\n", "ttl must be a positive", id="negative-ttl"),
        pytest.param("[models.a]\npinned = 'yes'\n", "pinned must be true or false", id="pinned-string"),
        pytest.param("[models.a.kv]\nmax_batch = 1.5\n", "max_batch must be an integer", id="float-batch"),
        pytest.param("[models.a]\naliases = ['b']\n[models.b]\n", "'b' is given to both", id="alias-names-a-model"),
        pytest.param(
            "[models.a.defaults]\nadapter = 'x'\n",
            "default adapter 'x' is not one of its adapters",
            id="unknown-default-adapter",
        ),
        pytest.param("[models.a.kv]\nkv_bits = 6\n", "kv_bits must be 4 or 8", id="kv-bits-6"),
        pytest.param("models = 1\n", "at least one [models.<name>]", id="no-models"),
        pytest.param("[other]\n", "unknown key 'other'", id="unknown-table"),
        pytest.param("[models.a\n", "not TOML", id="not-toml"),
    ],
)
def test_a_file_that_cannot_be_served_is_one_line(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ModelsFileError, match=None) as error:
        read_models_file(write(tmp_path, text))
    assert says in str(error.value) and "\n" not in str(error.value)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelsFileError, match="cannot be read"):
        read_models_file(tmp_path / "nowhere.toml")


def test_a_comma_list_serves_each_under_its_usual_id_and_a_builtin_by_its_bare_name() -> None:
    specs = specs_from_settings(Settings(model="tiny, demo,/models/qwen", model_aliases="fast=mlx-relay/tiny"))
    assert [(spec.name, spec.source, spec.aliases, spec.pinned) for spec in specs] == [
        ("mlx-relay/tiny", "tiny", ("tiny", "fast"), False),
        ("mlx-relay/demo", "demo", ("demo",), False),
        ("/models/qwen", "/models/qwen", (), False),
    ]


def test_adapters_with_several_models_need_a_file() -> None:
    with pytest.raises(ModelsFileError, match="models file"):
        specs_from_settings(Settings(model="tiny,demo", adapters="a=/x"))


def test_one_model_is_todays_pinned_model_with_the_settings_defaults() -> None:
    (spec,) = specs_from_settings(
        Settings(model="tiny", default_temperature=0.2, default_max_tokens=64, context_limit=512)
    )
    assert spec.name == "mlx-relay/tiny" and spec.source == "tiny" and spec.pinned
    assert spec.defaults == Defaults(temperature=0.2, max_tokens=64, context_limit=512)
    assert specs_from_settings(Settings())[0].source is None


def test_the_file_wins_over_the_model_setting(tmp_path: Path) -> None:
    specs = specs_from_settings(Settings(model="demo", models_file=str(write(tmp_path, FULL))))
    assert [spec.name for spec in specs] == ["chat", "tiny"]


def test_a_models_kv_scheme_reaches_its_engine_settings() -> None:
    from fleet.fleet import engine_settings
    from fleet.footprint import Footprint

    spot = Footprint(bytes=1 << 30, source="planned", kv_tokens=1024, weights_bytes=0)
    mine = engine_settings(Settings(), ModelSpec(name="a", source="tiny", kv=KvSpec(kv_bits=4, kv_group_size=32)), spot)
    assert (mine.kv_bits, mine.kv_group_size, mine.quantized_kv_start) == (4, 32, 0)
    server_wide = engine_settings(Settings(kv_bits=8), ModelSpec(name="b", source="tiny"), spot)
    assert (server_wide.kv_bits, server_wide.kv_group_size) == (8, 64)
