"""One test per mlx-lm detail that stages/models/mlx_internals.py leans on.

An mlx-lm upgrade that renames or reshapes one of them fails here, with a
message naming it, instead of deep inside a request.
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

from stages.models import mlx_internals as internals
from stages.models.loading import ModelInfo, Tokenizer

# What reaching into mlx-lm looks like: its private names, the wrapper's
# tokenizer (not our own `self._tokenizer`), parser detection by module name,
# and writes to a cache layer's offset.
PRIVATE = (
    r"_maybe_trim_space",
    r"_byte_decoder",
    r"\b_download\b",
    r"(?<!self)\._tokenizer\b",
    r"json_tools\b\"\)",
    r"\.offset\s*=[^=]",
    r"\b_get_classes\b",
)


def test_maybe_trim_space(tokenizer: Tokenizer) -> None:
    detokenizer = tokenizer.detokenizer
    assert callable(getattr(detokenizer, "_maybe_trim_space", None)), (
        "mlx-lm's BPE detokenizer lost `_maybe_trim_space`"
    )
    internals.keep_leading_space(detokenizer)
    detokenizer.reset()
    for token in tokenizer.encode(" Hello world"):
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert detokenizer.last_segment.startswith(" "), "the stream's leading space is still dropped"


def test_model_classes() -> None:
    model_class, args_class = internals.model_classes({"model_type": "qwen3"})
    assert model_class.__name__ == "Model" and args_class.__name__ == "ModelArgs", (
        "mlx-lm's `_get_classes` changed its answer"
    )
    with pytest.raises(ValueError):
        internals.model_classes({"model_type": "bert"})


def test_byte_decoder() -> None:
    decoder = internals.byte_decoder()
    assert len(decoder) == 256 and decoder["Ġ"] == 32, "mlx_lm.tokenizer_utils._byte_decoder changed"


def test_tokenizer_wrapper_tokenizer(tokenizer: Tokenizer) -> None:
    hf = internals.hf_tokenizer(tokenizer)
    assert hf is not tokenizer, "TokenizerWrapper._tokenizer is gone: llguidance would get the wrapper"
    assert hf.encode("Hello", add_special_tokens=False) == tokenizer.encode("Hello", add_special_tokens=False)


def test_json_tools_parser_module(tokenizer: Tokenizer) -> None:
    assert internals.is_json_tool_parser(tokenizer.tool_parser), (
        "mlx-lm's json_tools parser is no longer named by its module"
    )
    assert not internals.is_json_tool_parser(None)


def test_download_returns_a_local_directory_as_is(model_info: ModelInfo) -> None:
    assert internals.local_model_path(str(model_info.path)) == Path(model_info.path), "mlx_lm.utils._download changed"


def test_kvcache_keys_values_offset_writes() -> None:
    keys, values = mx.ones((1, 2, 5, 4)), mx.zeros((1, 2, 5, 4))
    layer = internals.kv_layer(keys, values)
    assert type(layer) is KVCache and layer.offset == 5 and layer.state[2] == 5, "KVCache.keys/values/offset changed"
    got_keys, _ = layer.update_and_fetch(mx.ones((1, 2, 1, 4)), mx.ones((1, 2, 1, 4)))
    assert got_keys.shape[2] == 6
    assert internals.plain_kv(layer) is not None and internals.plain_kv(layer)[0].shape[2] == 6  # type: ignore[index]


def _rotating(tokens: int, window: int = 8) -> RotatingKVCache:
    layer = RotatingKVCache(max_size=window)
    for _ in range(tokens):
        layer.update_and_fetch(mx.ones((1, 1, 1, 4)), mx.ones((1, 1, 1, 4)))
    return layer


def test_cache_trim_and_is_trimmable() -> None:
    """Only a KVCache, or a RotatingKVCache inside its window, can be cut back; ArraysCache never."""
    plain = internals.kv_layer(mx.ones((1, 1, 6, 4)), mx.ones((1, 1, 6, 4)))
    cut = internals.cut_layer(plain, 4, 6)
    assert cut is not None and cut.offset == 4 and cut.keys.shape[2] == 4 and plain.offset == 6
    inside, past = _rotating(6), _rotating(12)
    assert inside.is_trimmable() and not past.is_trimmable(), "RotatingKVCache.is_trimmable changed"
    cut = internals.cut_layer(inside, 4, 6)
    assert cut is not None and cut.offset == 4 and inside.offset == 6
    assert internals.cut_layer(past, 11, 12) is None
    assert internals.cut_layer(past, 12, 12) is not None
    recurrent = ArraysCache(size=2)
    assert not recurrent.is_trimmable() and internals.cut_layer(recurrent, 3, 4) is None


@pytest.mark.parametrize(
    ("layers", "kind"),
    [
        ([KVCache(), KVCache()], "plain"),
        ([RotatingKVCache(max_size=8), KVCache()], "rotating"),
        ([ArraysCache(size=2), KVCache()], "recurrent"),
    ],
)
def test_cache_classes(layers: list[object], kind: str) -> None:
    assert internals.cache_kind(layers) == kind


def test_no_other_module_reaches_into_mlx_lm_privately() -> None:
    """The adapter is the only place a private mlx-lm name appears (with its quantized cache layers,
    quantized_kv.py)."""
    from tests.conftest import REPO

    offenders = []
    for path in sorted((REPO / "stages").rglob("*.py")) + [REPO / "app.py"]:
        if path.name in ("mlx_internals.py", "quantized_kv.py"):
            continue
        text = path.read_text(encoding="utf-8")
        for pattern in PRIVATE:
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(REPO)}: {pattern}")
    assert offenders == []
    assert "mlx_lm" in inspect.getsource(internals)


def test_final_hidden_and_head_logits_rebuild_the_models_logits(model_info: ModelInfo) -> None:
    """`model.model(inputs, cache)` is the normed decoder and the head its projection; sliced over a cache, the same."""
    from mlx_lm.models.cache import make_prompt_cache

    from stages.models.loading import load_weights

    model = load_weights(model_info)
    inputs = mx.array([[5, 17, 42, 99, 3, 8]])
    hidden = internals.final_hidden(model, inputs)
    assert hidden is not None, "mlx-lm's model no longer keeps its decoder as `model.model`"
    logits = internals.head_logits(model, hidden)
    assert logits is not None and mx.allclose(logits, model(inputs), atol=1e-4).item()
    cache = make_prompt_cache(model)
    halves = [internals.final_hidden(model, inputs[:, :3], cache), internals.final_hidden(model, inputs[:, 3:], cache)]
    assert mx.allclose(mx.concatenate(halves, axis=1), hidden, atol=1e-4).item()


def test_what_the_quantized_batch_cache_leans_on() -> None:
    """stages/models/quantized_kv.py: mlx-lm's quantized layer, batch helpers and attention dispatch, name by name."""
    import mlx_lm.models.base as base
    import mlx_lm.models.cache as cache
    from mlx_lm.generate import BatchGenerator

    layer = cache.QuantizedKVCache(group_size=64, bits=8)
    assert (layer.keys, layer.values, layer.offset, layer.group_size, layer.bits) == (None, None, 0, 64, 8)
    assert callable(cache.dynamic_roll) and callable(cache.create_causal_mask) and hasattr(cache, "_BaseCache")
    # The batch's attention takes its quantized kernels for any cache that has `bits`.
    assert 'hasattr(cache, "bits")' in inspect.getsource(base.scaled_dot_product_attention)
    # Rows join a batch through their first layer's `merge`; insert passes caches third, positionally.
    assert ".merge(" in inspect.getsource(sys.modules[BatchGenerator.__module__]._merge_caches)
    parameters = list(inspect.signature(BatchGenerator.insert_segments).parameters)
    assert parameters[:4] == ["self", "segments", "max_tokens", "caches"]
