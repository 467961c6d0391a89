"""The project's own small model, built locally: no model hub, no network.

`ensure_demo_model(name)` returns an ordinary mlx-lm model directory that
`mlx_lm.load` reads exactly as it reads a real model (DESIGN.md, "The demo
model"). It holds:

- `config.json`, `model.safetensors`: mlx-lm's `llama` architecture with
  float32 random weights from a fixed seed. The output (`lm_head`) rows of
  the seven control tokens are zero, so their logit is always 0: greedy
  decoding rarely picks one, but sampling at temperature 1 meets an EOS
  every few hundred tokens, as a real model ends its answers. A caller that
  needs an exact length biases the EOS ids down (`logit_bias`).
- `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`: a
  byte-level BPE trained with `tokenizers` on a corpus made without the
  network (an embedded paragraph and the docstrings of a fixed list of
  stdlib modules), and a ChatML template (`stages/models/demo_template.py`).
  `<|endoftext|>`, `<|im_start|>` and `<|im_end|>` are special tokens;
  `<think>`, `</think>`, `<tool_call>`, `</tool_call>` are single
  non-special tokens (as in Qwen3), so decoded text keeps them and mlx-lm
  infers thinking and its `json_tools` tool parser. EOS ids are
  `<|im_end|>` and `<|endoftext|>`; there is no BOS.

Owns: `<cache root>/<name>-<BUILDER_VERSION>/`. A build is written into a
temporary sibling and renamed into place, so the directory exists only when
complete; racing builders all succeed and one build is kept.
On error: the temporary directory is removed and the error propagates.
Building reseeds MLX's global random generator. One environment (Python
minor version, tokenizers, mlx) always builds byte-identical files.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

import attrs

from stages.models.demo_template import CHAT_TEMPLATE
from stages.models.publish import CACHE_ENV, build_once, default_cache_root

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# Part of every build's directory name: bump it whenever the files built
# change, so no cache keeps serving an old build.
BUILDER_VERSION = "v3"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKER_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")
EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")
# Any fixed value: the weights only have to be the same on every build.
_SEED = 1234
# Stable, platform-independent stdlib modules with plenty of English prose.
_CORPUS_MODULES = (
    "argparse",
    "base64",
    "bisect",
    "calendar",
    "collections",
    "configparser",
    "contextlib",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "html",
    "http.client",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "math",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "shutil",
    "statistics",
    "string",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "zipfile",
)
_PARAGRAPH = """\
The server reads a request, renders the conversation with the model's chat
template, and streams the answer back one token at a time. Small models are
quick to load, easy to test, and cheap to run on a laptop; large models need
batching, caching, and care with memory. Every message has a role: system,
user, assistant, or tool. When the assistant wants to call a function, it
writes the name and the arguments as JSON, and the caller sends the result
back as a tool response. Numbers like 0, 1, 2, 42, 3.14 and 2024-06-01 appear
in logs, tables, and questions alike. "Hello, world!" said the example.
"""


@attrs.frozen(kw_only=True)
class DemoSpec:
    """The sizes of one demo model; the architecture is always mlx-lm's llama."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    # Random weights almost never end a turn; agent clients need turns that
    # end. With this set, one residual dimension is held high and feeds only
    # the end-of-turn logit, so answers end after a few dozen tokens.
    ends_turns: bool = False

    def parameter_count(self) -> int:
        """Parameters of the built model (untied embeddings, no biases)."""
        head_dim = self.hidden_size // self.num_attention_heads
        heads = self.num_attention_heads + self.num_key_value_heads
        attention = 2 * self.hidden_size * head_dim * heads
        mlp = 3 * self.hidden_size * self.intermediate_size
        layer = attention + mlp + 2 * self.hidden_size
        return self.num_hidden_layers * layer + (2 * self.vocab_size + 1) * self.hidden_size


# For tests: builds and loads in about a second.
_TINY = DemoSpec(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=1024,
    max_position_embeddings=2048,
)

DEMO_MODELS: Mapping[str, DemoSpec] = MappingProxyType(
    {
        # About 34M parameters: big enough that batching decode steps pays.
        "demo": DemoSpec(
            hidden_size=512,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1536,
            vocab_size=8192,
            max_position_embeddings=4096,
        ),
        "tiny": _TINY,
        # The tiny model with a window that fits agent clients' prompts (Claude Code, Codex: 10k–30k tokens),
        # and a larger vocabulary: fewer prompt tokens. One layer of one 64-wide head (tiny's KV per token): each
        # attention score costs a CPU an exp (13 ns in MLX's CPU kernel), so tiny's two layers of four heads took
        # 22 s to prefill Claude Code's 25,651-token prompt. A single layer's KV does not depend on its attention,
        # which then runs for the prompt's last chunk alone: 0.3 s.
        "tiny-64k": attrs.evolve(
            _TINY,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            vocab_size=8192,
            max_position_embeddings=65536,
            ends_turns=True,
        ),
        # Six heads, each its own KV head: splits evenly over two or three tensor-parallel ranks (tests of a sharded
        # ring).
        "tiny-6h": attrs.evolve(
            _TINY, hidden_size=96, num_attention_heads=6, num_key_value_heads=6, intermediate_size=192
        ),
        # Heads of 64 dimensions, as real models have: a quantized KV cache's groups of 64 fit them (tiny's heads
        # of 16 do not), at a tenth of demo's cost per step.
        "tiny-hd64": attrs.evolve(
            _TINY, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=256
        ),
    }
)


def ensure_demo_model(name: str = "demo", cache_root: Path | None = None) -> Path:
    """The directory of demo model `name`, built first if it is not cached.

    Args:
        name: a key of `DEMO_MODELS`.
        cache_root: where builds are kept; defaults to `$MLX_RELAY_DEMO_CACHE`,
            else `~/.cache/mlx-relay`.

    Returns:
        `<cache_root>/<name>-<BUILDER_VERSION>`, complete.

    Raises:
        ValueError: `name` is not a demo model.
        OSError: the cache root cannot be written.
    """
    if name not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {name!r}; choose from {sorted(DEMO_MODELS)}")
    root = cache_root if cache_root is not None else default_cache_root()
    return build_once(root / f"{name}-{BUILDER_VERSION}", partial(_build, DEMO_MODELS[name]))


def _build(spec: DemoSpec, dest: Path) -> None:
    vocab = write_tokenizer(dest, spec.vocab_size, spec.max_position_embeddings)
    config = _model_config(spec, vocab)
    _write_json(dest / "config.json", config)
    turn_end = vocab["<|im_end|>"] if spec.ends_turns else None
    _write_weights(dest / "model.safetensors", config, [vocab[t] for t in SPECIAL_TOKENS + MARKER_TOKENS], turn_end)


def write_tokenizer(dest: Path, vocab_size: int, context_window: int) -> dict[str, int]:
    """The demo tokenizer, its config and chat template, written into `dest`; its vocabulary.

    Shared with the shape-true models (`stages/models/shaped.py`), which
    need a tokenizer and template but no real vocabulary.
    """
    tokenizer = _train_tokenizer(vocab_size)
    tokenizer.save(str(dest / "tokenizer.json"))
    _write_json(dest / "tokenizer_config.json", _tokenizer_config(context_window))
    (dest / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    return vocab


def _train_tokenizer(vocab_size: int) -> Tokenizer:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(MARKER_TOKENS),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"the corpus yields {tokenizer.get_vocab_size()} tokens, not {vocab_size}")
    return tokenizer


def _corpus() -> list[str]:
    texts = {_PARAGRAPH}
    # Walking `typing` touches its deprecated `io`/`re` aliases; under
    # `-W error` (the test suite) that warning would abort the build.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for module_name in _CORPUS_MODULES:
            texts.update(_docstrings(importlib.import_module(module_name)))
    return sorted(texts)


def _docstrings(module: object) -> Iterator[str]:
    yield inspect.cleandoc(getattr(module, "__doc__", None) or "")
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        yield inspect.getdoc(obj) or ""
        if inspect.isclass(obj):
            for member_name, member in sorted(vars(obj).items()):
                if not member_name.startswith("_") and (inspect.isroutine(member) or isinstance(member, property)):
                    yield inspect.cleandoc(member.__doc__ or "")


def _tokenizer_config(context_window: int) -> dict[str, object]:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": context_window,
        "clean_up_tokenization_spaces": False,
    }


def _model_config(spec: DemoSpec, vocab: Mapping[str, int]) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.hidden_size // spec.num_attention_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "vocab_size": len(vocab),
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": vocab["<|endoftext|>"],
        "eos_token_id": [vocab[t] for t in EOS_TOKENS],
        "torch_dtype": "float32",
    }


# The held dimension's value in every embedding, and its weight toward the end-of-turn token.
_TURN_END_CARRIER = 8.0
_TURN_END_GAIN = 0.5


def _write_weights(path: Path, config: dict[str, object], silenced_ids: list[int], turn_end: int | None = None) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    mx.random.seed(_SEED)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    lm_head = model.lm_head.weight
    lm_head[mx.array(silenced_ids)] = 0.0
    if turn_end is not None:
        embed = model.model.embed_tokens.weight
        embed[:, 0] = _TURN_END_CARRIER
        model.model.embed_tokens.weight = embed
        lm_head[:, 0] = 0.0
        lm_head[turn_end, 0] = _TURN_END_GAIN
    model.lm_head.weight = lm_head
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})


def _write_json(path: Path, value: Mapping[str, object]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    """Build (if needed) one demo model and print its directory."""
    parser = argparse.ArgumentParser(prog="python -m stages.models.demo", description=main.__doc__)
    parser.add_argument("--name", choices=sorted(DEMO_MODELS), default="demo")
    parser.add_argument("--cache-root", type=Path, default=None, help=f"default: ${CACHE_ENV} or ~/.cache/mlx-relay")
    args = parser.parse_args(argv)
    print(ensure_demo_model(args.name, args.cache_root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
