"""What a quantized KV cache costs in quality: greedy agreement and drift against full-precision KV.

For each model and scheme (8 and 4 bits, groups of 64, quantized from the
first token as mlx-relay's batch does):
- agreement: the greedy tokens of a free run with quantized KV against
  the full-precision run, position by position over `--tokens`, and the
  first position where they part;
- drift: the full-precision greedy sequence is fed to both caches in
  lockstep (teacher-forced), and each decoder layer's output and the
  final logits are compared: mean and max absolute difference, the mean
  relative to the full-precision values' mean magnitude.
SmolLM2 (real weights) gives the agreement over `--prompts` chat prompts.

    python -m bench.kv_quality [--tokens 256] [--prompts 20] [--smollm2-tokens 64]

Prints one line per figure; docs/benchmarks.md carries a run's figures.
"""

from __future__ import annotations

import argparse
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.generate import generate_step

from stages.kv.shape import KvScheme
from stages.models.loading import load_tokenizer, load_weights, resolve_model
from stages.models.quantized_kv import row_cache

SCHEMES = (KvScheme(bits=8), KvScheme(bits=4))
PROMPTS = (
    "Explain how a hash map handles collisions.",
    "Write a haiku about autumn rain.",
    "What is the capital of France?",
    "Summarize the plot of Hamlet in three sentences.",
    "List five uses for a paperclip.",
    "How do vaccines train the immune system?",
    "Translate 'good morning' into Spanish and German.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What does a compiler do?",
    "Describe the water cycle.",
    "Write a limerick about a cat.",
    "What is 17 times 23?",
    "Name three planets and one fact about each.",
    "How does a bicycle stay upright?",
    "What is photosynthesis?",
    "Write a short apology email for a missed meeting.",
    "Explain recursion to a child.",
    "What are the rules of chess castling?",
    "Tell me a fun fact about octopuses.",
)


def greedy(model: Any, prompt: list[int], tokens: int, scheme: KvScheme | None) -> list[int]:
    cache = row_cache(model, scheme) if scheme is not None else None
    steps = generate_step(mx.array(prompt), model, max_tokens=tokens, prompt_cache=cache)
    return [int(token) for token, _ in steps]


def agreement(full: list[int], other: list[int]) -> tuple[float, int]:
    same = sum(a == b for a, b in zip(full, other)) / max(1, len(full))
    parted = next((i for i, (a, b) in enumerate(zip(full, other)) if a != b), len(full))
    return same, parted


class _Recorder:
    """Stands in for one decoder layer and keeps what it returned."""

    def __init__(self, layer: Any) -> None:
        self.layer, self.output = layer, None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.output = self.layer(*args, **kwargs)
        return self.output

    def __getattr__(self, name: str) -> Any:
        # The decoder reads its layers' attributes (llama's `use_sliding`).
        return getattr(self.layer, name)


def drift(
    model: Any, prompt: list[int], sequence: list[int], scheme: KvScheme
) -> tuple[list[tuple[float, float, float]], tuple[float, float]]:
    """Per layer (mean abs, max abs, mean relative) and the logits' (mean abs, max abs), teacher-forced."""
    from mlx_lm.models.cache import make_prompt_cache

    layers = model.model.layers
    recorders = [_Recorder(layer) for layer in layers]
    caches = {"full": make_prompt_cache(model), "quantized": row_cache(model, scheme)}
    sums = [[0.0, 0.0, 0.0] for _ in layers]
    logit_sum, logit_max, steps = 0.0, 0.0, 0
    try:
        model.model.layers = recorders
        inputs = [prompt] + [[token] for token in sequence[:-1]]
        for chunk in inputs:
            outputs = {}
            for name, cache in caches.items():
                logits = model(mx.array([chunk]), cache=cache)[:, -1, :]
                outputs[name] = (logits, [recorder.output[:, -1, :] for recorder in recorders])
            full_logits, full_hidden = outputs["full"]
            quant_logits, quant_hidden = outputs["quantized"]
            for index, (a, b) in enumerate(zip(full_hidden, quant_hidden)):
                difference = mx.abs(a.astype(mx.float32) - b.astype(mx.float32))
                scale = mx.mean(mx.abs(a.astype(mx.float32))).item()
                mean = difference.mean().item()
                sums[index][0] += mean
                sums[index][1] = max(sums[index][1], difference.max().item())
                sums[index][2] += mean / max(scale, 1e-12)
            difference = mx.abs(full_logits.astype(mx.float32) - quant_logits.astype(mx.float32))
            logit_sum += difference.mean().item()
            logit_max = max(logit_max, difference.max().item())
            steps += 1
    finally:
        model.model.layers = layers
    return [(s[0] / steps, s[1], s[2] / steps) for s in sums], (logit_sum / steps, logit_max)


def synthetic(name: str, tokens: int) -> None:
    info = resolve_model(name)
    model = load_weights(info)
    prompt = [(7 * i + 3) % 500 + 10 for i in range(32)]
    full = greedy(model, prompt, tokens, None)
    for scheme in SCHEMES:
        same, parted = agreement(full, greedy(model, prompt, tokens, scheme))
        print(f"{name} {scheme.describe()} agreement over {tokens} tokens: {same:.1%} (first difference at {parted})")
        per_layer, (logit_mean, logit_max) = drift(model, prompt, full, scheme)
        for index, (mean, most, relative) in enumerate(per_layer):
            print(
                f"{name} {scheme.describe()} layer {index}: mean |drift| {mean:.2e}"
                f" ({relative:.2%} of the mean |value|), max {most:.2e}"
            )
        print(f"{name} {scheme.describe()} logits: mean |drift| {logit_mean:.2e}, max {logit_max:.2e}")


def smollm2(prompts: int, tokens: int) -> None:
    # Dequantized to float32 as the server does on a CPU (its quantized matmuls are slow there).
    info = attrs.evolve(resolve_model("smollm2"), float32_weights=not mx.metal.is_available())
    model, tokenizer = load_weights(info), load_tokenizer(info)
    encoded = [
        tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        for text in PROMPTS[:prompts]
    ]
    fulls = [greedy(model, prompt, tokens, None) for prompt in encoded]
    for scheme in SCHEMES:
        figures = [agreement(full, greedy(model, prompt, tokens, scheme)) for prompt, full in zip(encoded, fulls)]
        identical = sum(parted == len(full) for (_, parted), full in zip(figures, fulls))
        mean = sum(same for same, _ in figures) / len(figures)
        print(
            f"smollm2 {scheme.describe()} over {len(encoded)} prompts x {tokens} tokens: {identical} identical, "
            f"{mean:.1%} of positions agree, first differences at {sorted(parted for _, parted in figures)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--smollm2-tokens", type=int, default=32)
    parser.add_argument("--models", default="demo,shaped:qwen3-0.6b-2l")
    args = parser.parse_args()
    for name in filter(None, args.models.split(",")):
        synthetic(name, args.tokens)
    if args.prompts:
        smollm2(args.prompts, args.smollm2_tokens)


if __name__ == "__main__":
    main()
