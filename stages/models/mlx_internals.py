"""Every private or undocumented mlx-lm name the project relies on, in one place.

mlx-lm (pinned 0.32.2) is used through its public API everywhere else; what
it does not offer publicly is reached only through this module, and
`tests/stages/models/test_mlx_internals.py` checks each name here one by one, so an
mlx-lm upgrade that moves one fails there, naming it, rather than somewhere
deep in a request. Each function says which mlx-lm detail it leans on.

Cache layers: the prompt cache treats a model's per-layer caches as opaque
except here, where the layouts of `KVCache`, `RotatingKVCache` and
`ArraysCache` are known. Model thread only for the functions that make or
cut arrays.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stages.kv.tensors import Tensor

# -- tokenizers ---------------------------------------------------------------


def keep_leading_space(detokenizer: Any) -> None:
    """Stop mlx-lm's streaming detokenizer dropping the stream's first space.

    Leans on: `BPEStreamingDetokenizer.trim_space` and the
    `_maybe_trim_space` method (`SPMStreamingDetokenizer` has `trim_space`).
    """
    if hasattr(detokenizer, "trim_space"):
        detokenizer.trim_space = False
    if hasattr(detokenizer, "_maybe_trim_space"):
        detokenizer._maybe_trim_space = lambda text: text


def byte_decoder() -> dict[str, int]:
    """GPT-2's printable stand-ins for bytes, as mlx-lm's BPE detokenizer reads them.

    Leans on: `mlx_lm.tokenizer_utils._byte_decoder`.
    """
    from mlx_lm.tokenizer_utils import _byte_decoder

    decoder: dict[str, int] = _byte_decoder()
    return decoder


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's `TokenizerWrapper` (what llguidance reads).

    Leans on: `TokenizerWrapper._tokenizer`.
    """
    return getattr(tokenizer, "_tokenizer", tokenizer)


def special_token_ids(tokenizer: Any) -> frozenset[int]:
    """Ids of the added tokens the tokenizer marks special (what `decode(skip_special_tokens=True)` drops).

    Leans on: Hugging Face's `added_tokens_decoder` (its `AddedToken.special`), and
    `all_special_ids` where a tokenizer has no added-token table.
    """
    hf = hf_tokenizer(tokenizer)
    added = getattr(hf, "added_tokens_decoder", None)
    if isinstance(added, dict):
        return frozenset(int(i) for i, token in added.items() if getattr(token, "special", False))
    return frozenset(int(i) for i in getattr(hf, "all_special_ids", ()))


def tool_parser_kind(parser: Any) -> str:
    """The name mlx-lm knows a tool parser by (`qwen3_coder`, `glm47`, …).

    Leans on: mlx-lm naming the parser by its module, `mlx_lm.tool_parsers.<kind>`.
    """
    return str(getattr(parser, "__module__", "")).rpartition(".")[2]


def is_json_tool_parser(parser: Any) -> bool:
    """Whether mlx-lm picked its `json_tools` parser (a JSON object between the markers).

    Leans on: mlx-lm naming the parser by its module, `mlx_lm.tool_parsers.json_tools`.
    """
    return parser is not None and str(getattr(parser, "__module__", "")).endswith("json_tools")


def local_model_path(model: str) -> Path:
    """A local directory for `model`: as is when it exists, else a Hugging Face download.

    Leans on: `mlx_lm.utils._download`.
    """
    from mlx_lm.utils import _download

    path: Path = _download(model)
    return path


# -- cache layers -------------------------------------------------------------

PLAIN, ROTATING, RECURRENT, OTHER = "plain", "rotating", "recurrent", "other"


def layer_kind(layer: Any) -> str:
    """plain (`KVCache`), rotating (`RotatingKVCache`), recurrent (`ArraysCache`) or other."""
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    kinds = {KVCache: PLAIN, RotatingKVCache: ROTATING, ArraysCache: RECURRENT}
    return kinds.get(type(layer), OTHER)


def cache_kind(layers: Sequence[Any]) -> str:
    """The model's cache in one word: plain when every layer is, else the least trimmable kind present."""
    kinds = {layer_kind(layer) for layer in layers}
    for kind in (OTHER, RECURRENT, ROTATING):
        if kind in kinds:
            return kind
    return PLAIN


def cut_layer(layer: Any, keep: int, held: int) -> Any | None:
    """A view of `layer` (holding `held` positions) holding its first `keep`; None if it cannot be cut.

    Nothing is copied: the view shares the layer's arrays, and the batch
    copies what it merges. A layer that holds exactly `keep` positions is
    always usable; cutting needs a trimmable layer (a `KVCache`, or a
    `RotatingKVCache` that has not yet wrapped around its window).
    Leans on: `KVCache.keys/values/offset`, `_BaseCache.is_trimmable/trim`.
    """
    view = copy.copy(layer)
    if keep == held:
        return view
    if keep > held or not layer.is_trimmable():
        return None
    if layer_kind(layer) == PLAIN:
        # Slice rather than trim: a KVCache's buffer is padded to 256-token blocks.
        view.keys, view.values, view.offset = layer.keys[..., :keep, :], layer.values[..., :keep, :], keep
    else:
        view.trim(held - keep)
    return view


def in_time_order(layers: Sequence[Any]) -> None:
    """Batch rotating layers laid out in time order before a pass of several tokens a row.

    Such a pass (`_update_concat`) orders the buffer itself, but the model makes its mask first, from the layer as
    it is: on a ring that decode steps rotated, the mask reads the write index as the length and puts each row's
    window one position off. mlx-lm never feeds a rotated ring more than one token (its generation batch decodes
    one a step); a verifying pass does. Leans on: `BatchRotatingKVCache._temporal_order`.
    """
    from mlx_lm.models.cache import BatchRotatingKVCache

    for layer in layers:
        if isinstance(layer, BatchRotatingKVCache):
            layer._temporal_order()


def cut_batch_layer(layer: Any, drop: int, shifts: Sequence[int]) -> None:
    """A batch layer after a verifying pass: its last `drop` positions gone, and each row rolled right by its
    shift (the positions it rejected beyond the others' become its left padding).

    A batch rotating layer takes a multi-token pass by laying its buffer out in time order (`_update_concat`),
    keeping its window's worth of older positions before the new ones, so dropping the newest is cutting the
    buffer's end: what the window needs next is still there. Its own `trim` leaves the buffer whole, and its next
    one-token update would keep the dropped positions in the ring; so the buffer is cut to its end here, and the
    roll is its own `finalize`'s (as for right-padded prompts: `_lengths` is where each row's tokens end).
    Leans on: `BatchRotatingKVCache.keys/values/_idx/_lengths/offset`, `BatchKVCache.prepare/finalize`.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import BatchRotatingKVCache

    layer.trim(drop)
    if isinstance(layer, BatchRotatingKVCache):
        rotating: Any = layer
        rotating.keys, rotating.values = (
            rotating.keys[..., : rotating._idx, :],
            rotating.values[..., : rotating._idx, :],
        )
        if any(shifts):
            rotating._lengths = rotating.offset - mx.array(list(shifts))
            rotating.finalize()
        return
    if any(shifts):
        layer.prepare(right_padding=list(shifts))
        layer.finalize()


def plain_kv(layer: Any) -> tuple[Any, Any] | None:
    """A `KVCache` layer's keys and values, cut to what it holds; None for any other layer.

    Leans on: `KVCache.keys/values/offset`.
    """
    if layer_kind(layer) != PLAIN or layer.keys is None:
        return None
    if layer.keys.shape[2] == layer.offset:
        return layer.keys, layer.values
    return layer.keys[..., : layer.offset, :], layer.values[..., : layer.offset, :]


def kv_layer(keys: Any, values: Any) -> Any:
    """A `KVCache` holding `keys` and `values` (arrays), evaluated.

    Leans on: writing `KVCache.keys/values/offset` directly.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    layer: Any = KVCache()
    layer.keys, layer.values, layer.offset = keys, values, keys.shape[2]
    mx.eval(layer.keys, layer.values)
    return layer


# The parts of a quantized tensor after its packed values, as the disk tier names them ("layers.0.keys.scales").
_QUANTIZED_PARTS = ("scales", "biases")


def layer_tensors(layer: Any) -> dict[str, Any] | None:
    """A layer's KV as named arrays, cut to what it holds: "keys" and "values", and for a quantized
    layer their "scales" and "biases" too; None for a layer of any other kind.

    Leans on: `QuantizedKVCache.keys/values` being `mx.quantize` triples
    (packed values, scales, biases), cut to `offset` like a `KVCache`.
    """
    from mlx_lm.models.cache import QuantizedKVCache

    if not isinstance(layer, QuantizedKVCache):
        kv = plain_kv(layer)
        return None if kv is None else {"keys": kv[0], "values": kv[1]}
    if layer.keys is None:
        return None
    named = {}
    for name, triple in (("keys", layer.keys), ("values", layer.values)):
        for suffix, part in zip(("", *(f".{p}" for p in _QUANTIZED_PARTS)), triple):
            named[name + suffix] = part if part.shape[2] == layer.offset else part[..., : layer.offset, :]
    if any(part.shape[2] != layer.offset for part in (*layer.keys, *layer.values)):
        import mlx.core as mx

        # A layer cut by `trim`, or still growing: the file format wants each tensor whole and contiguous.
        named = {name: mx.contiguous(part) for name, part in named.items()}
        mx.eval(list(named.values()))
    return named


def restore_layer(parts: dict[str, Tensor], bits: int | None = None, group_size: int = 64) -> Any:
    """One layer's KV cache from the disk tier's tensors, evaluated: quantized when `bits` is set."""
    if bits is None:
        return kv_layer(_tensor_array(parts["keys"]), _tensor_array(parts["values"]))
    import mlx.core as mx

    from stages.models.quantized_kv import RowQuantizedKV

    layer: Any = RowQuantizedKV(group_size=group_size, bits=bits)

    def triple(name: str) -> tuple[Any, ...]:
        return tuple(_tensor_array(parts[name + suffix]) for suffix in ("", *(f".{p}" for p in _QUANTIZED_PARTS)))

    layer.keys, layer.values = triple("keys"), triple("values")
    layer.offset = layer.keys[0].shape[2]
    mx.eval(layer.keys, layer.values)
    return layer


def _tensor_array(item: Tensor) -> Any:
    import mlx.core as mx

    # memoryview.cast knows no 16-bit floats: read their bits as uint16, then view them.
    # (Typed loosely: the stubs know neither that nor mx.array's buffer support.)
    data: Any = item.data
    if item.dtype == "F32":
        return mx.array(data.cast("f", item.shape))
    if item.dtype == "U32":
        return mx.array(data.cast("I", item.shape), dtype=mx.uint32)
    return mx.array(data.cast("H", item.shape)).view(mx.float16 if item.dtype == "F16" else mx.bfloat16)


def allocator_memory() -> tuple[int, int]:
    """MLX's allocator: bytes in live arrays, and freed buffers it keeps for reuse."""
    import mlx.core as mx

    return mx.get_active_memory(), mx.get_cache_memory()


# -- a model's last hidden states ---------------------------------------------


def model_classes(config: dict[str, Any]) -> tuple[type, type]:
    """mlx-lm's model class and args class for a config (its `model_type`, remapped as mlx-lm remaps it).

    Leans on: `mlx_lm.utils._get_classes`, which `load_model` takes as its
    `get_model_classes` hook. Raises ValueError for a type mlx-lm lacks.
    """
    from mlx_lm.utils import _get_classes

    classes: tuple[type, type] = _get_classes(config)
    return classes


def final_hidden(model: Any, inputs: Any, cache: list[Any] | None = None) -> Any | None:
    """The last layer's hidden states (after the final norm), [batch, length, hidden]; None where unknown.

    With `cache` (`make_prompt_cache(model)`), `inputs` continue what the
    cache holds, as a chunked prefill does.
    Leans on: mlx-lm's text models keeping their decoder as `model.model`
    (multimodal wrappers as `language_model.model`), whose call takes
    `(inputs, cache)` and returns the normed hidden states before the head.
    """
    inner = _decoder(model)
    return None if inner is None else inner(inputs, cache)


def head_logits(model: Any, hidden: Any) -> Any | None:
    """The model's head applied to `hidden`: its logits; None where the head is not a plain projection.

    Leans on: `lm_head`, or a tied `embed_tokens.as_linear` when
    `args.tie_word_embeddings`; models that scale or cap their logits
    (`final_logit_softcapping`, `logits_scaling`) are refused.
    """
    text = getattr(model, "language_model", model)
    args = getattr(text, "args", None)
    if args is None or getattr(args, "final_logit_softcapping", None) or getattr(args, "logits_scaling", None):
        return None
    if getattr(args, "tie_word_embeddings", False) or not hasattr(text, "lm_head"):
        embed = getattr(getattr(text, "model", None), "embed_tokens", None)
        return None if embed is None else embed.as_linear(hidden)
    return text.lm_head(hidden)


def _decoder(model: Any) -> Any | None:
    text = getattr(model, "language_model", model)
    inner = getattr(text, "model", None)
    return inner if callable(inner) and hasattr(inner, "layers") else None
