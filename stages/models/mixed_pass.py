"""One forward pass over several segments of rows: decoding rows and a prompt's chunk share each weight read.

mlx-lm's `BatchGenerator` runs a step as separate passes: the decoding rows' token ([R, 1]), then a prompt's
chunk ([B, L]) with its own batch cache. Each pass reads every weight; on a CPU, where a pass of a few dozen
tokens costs about what one token does, a step that prefills beside decoding rows pays twice for what one pass
could do. A mixed pass lays every segment's tokens end to end as one sequence ([1, T]), so the per-token work
(embeddings, norms, the attention's projections and the MLP, which hold nearly all the weights) runs once over all
of them, and only attention itself runs per segment, each against its own cache and with the mask the model would
have made for it alone.

The model's own loop runs unchanged: for the pass, each layer's cache is a `_Segments`, which hands the model a
mask request instead of a mask, and each layer's attention is swapped (as the module's dict item, restored after)
for one that cuts the sequence back into segments. The final norm is swapped for one that keeps only the
positions whose logits are asked for, so the head never runs over a prompt chunk.

Only the families it was checked on mix: `mixable` says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

# Which positions' logits a segment asks for: every row's every position, each row's last, or none.
ALL, LAST, NONE = "all", "last", "none"


@attrs.frozen
class Segment:
    """Rows that run together: `tokens` [B, L] against `cache` (one per layer); `logits` is ALL, LAST or NONE."""

    tokens: Any
    cache: Sequence[Any]
    logits: str


@attrs.frozen
class _MaskRequest:
    return_array: bool
    window_size: int | None


@attrs.frozen
class _Segments:
    """One layer's caches, one per segment, and each segment's shape."""

    caches: tuple[Any, ...]
    shapes: tuple[tuple[int, int], ...]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None, **_: Any) -> Any:
        return _MaskRequest(return_array, window_size)


# mlx-lm's text models whose attention takes its projections of the layer's input and ends in `o_proj`, and whose
# layers are otherwise per token: each is checked against its separate passes in tests/stages/model_thread/
# test_mixed_steps.py. `llama` is also Mistral's, SmolLM2's and Llama 3's.
FAMILIES = frozenset({"mlx_lm.models.llama", "mlx_lm.models.qwen2", "mlx_lm.models.qwen3", "mlx_lm.models.gemma3_text"})


def mixable(model: Any) -> bool:
    """Whether `model` is of a family a mixed pass was checked on (a vision model's language model takes
    embeddings and arguments of its own, and is not), with the shape the pass relies on: an inner model of
    `layers`, each with a `self_attn`, and a final `norm`. Which caches its layers keep is the caller's to judge."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None) or ()
    return (
        type(model).__module__ in FAMILIES
        and isinstance(inner, dict)
        and "norm" in inner
        and bool(layers)
        and all(isinstance(layer, dict) and "self_attn" in layer for layer in layers)
    )


_PROJECTIONS = ("q_proj", "k_proj", "v_proj")


def _shares_projections(attention: Any) -> bool:
    return isinstance(attention, dict) and all(name in attention for name in (*_PROJECTIONS, "o_proj"))


def _given(value: Any) -> Any:
    def run(_: Any) -> Any:
        return value

    return run


def _identity(x: Any) -> Any:
    return x


def _split_attention(attention: Any) -> Any:
    import mlx.core as mx

    shared = _shares_projections(attention)

    def run(x: Any, mask: Any = None, cache: Any = None) -> Any:
        if not isinstance(cache, _Segments):
            return attention(x, mask, cache)
        # The projections run once over every segment's tokens; each segment's attention is handed its slice of
        # them, and its output goes through `o_proj` together with the others'.
        projected = {name: attention[name](x) for name in _PROJECTIONS} if shared else {}
        originals = {name: attention[name] for name in (*_PROJECTIONS, "o_proj")} if shared else {}
        outputs = []
        start = 0
        try:
            for seg_cache, (rows, length) in zip(cache.caches, cache.shapes):
                width = rows * length
                if shared:
                    for name, value in projected.items():
                        attention[name] = _given(value[:, start : start + width].reshape(rows, length, -1))
                    attention["o_proj"] = _identity
                part = x[:, start : start + width].reshape(rows, length, -1)
                start += width
                seg_mask = mask
                if isinstance(mask, _MaskRequest):
                    seg_mask = seg_cache.make_mask(length, return_array=mask.return_array, window_size=mask.window_size)
                outputs.append(attention(part, seg_mask, seg_cache).reshape(1, width, -1))
        finally:
            for name, module in originals.items():
                attention[name] = module
        output = mx.concatenate(outputs, axis=1)
        return originals["o_proj"](output) if shared else output

    return run


def _kept_norm(norm: Any, positions: Any) -> Any:
    def run(h: Any) -> Any:
        return norm(h[:, positions])

    return run


def mixed_forward(model: Any, segments: Sequence[Segment]) -> list[Any | None]:
    """Each segment's logits from one pass ([B, L, V] for ALL, [B, 1, V] for LAST, None for NONE); every
    segment's cache advances as its own pass would have advanced it."""
    import mlx.core as mx

    shapes = tuple((int(s.tokens.shape[0]), int(s.tokens.shape[1])) for s in segments)
    flat = mx.concatenate([s.tokens.reshape(1, -1) for s in segments], axis=1)
    wanted: list[int] = []
    start = 0
    for segment, (rows, length) in zip(segments, shapes):
        if segment.logits == ALL:
            wanted.extend(range(start, start + rows * length))
        elif segment.logits == LAST:
            wanted.extend(start + row * length + length - 1 for row in range(rows))
        start += rows * length
    inner = model.model
    layers = inner.layers
    caches = [_Segments(tuple(s.cache[i] for s in segments), shapes) for i in range(len(layers))]
    attentions = [layer["self_attn"] for layer in layers]
    norm = inner["norm"]
    try:
        for layer, attention in zip(layers, attentions):
            layer["self_attn"] = _split_attention(attention)
        inner["norm"] = _kept_norm(norm, mx.array(wanted or [0]))
        logits = model(flat, cache=caches)[0]
    finally:
        for layer, attention in zip(layers, attentions):
            layer["self_attn"] = attention
        inner["norm"] = norm
    results: list[Any | None] = []
    taken = 0
    for segment, (rows, length) in zip(segments, shapes):
        if segment.logits == NONE:
            results.append(None)
            continue
        width = length if segment.logits == ALL else 1
        results.append(logits[taken : taken + rows * width].reshape(rows, width, -1))
        taken += rows * width
    return results
