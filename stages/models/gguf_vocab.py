"""A GGUF file's tokenizer as Hugging Face `tokenizer.json` and its config.

GGUF keeps a GPT-2-style vocabulary as lists: `tokenizer.ggml.tokens`
(byte-level strings, id = position), `.merges` (`"Ġ t"`, in rank order),
`.token_type` (llama.cpp's `LLAMA_TOKEN_TYPE_*`) and the special ids. The
same BPE is rebuilt with `tokenizers`; the pre-tokenizer follows
`tokenizer.ggml.pre`, as llama.cpp's `llama-vocab.cpp` chooses its split
regex. The chat template is `tokenizer.chat_template`, unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# llama.cpp's LLAMA_TOKEN_TYPE_CONTROL and _USER_DEFINED.
CONTROL, USER_DEFINED = 3, 4


def build_tokenizer(metadata: Mapping[str, Any]) -> Any:
    """The `tokenizers.Tokenizer` for a GGUF GPT-2 BPE vocabulary.

    Raises:
        ValueError: not a GPT-2 BPE vocabulary, or a pre-tokenizer whose
            split rules are not known here.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors

    if metadata.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"GGUF tokenizer model {metadata.get('tokenizer.ggml.model')!r} is not supported; only 'gpt2'")
    tokens: Sequence[str] = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = _pre_tokenizer(str(metadata.get("tokenizer.ggml.pre", "default")))
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    types = _ints(metadata.get("tokenizer.ggml.token_type", []))
    tokenizer.add_tokens(
        [
            AddedToken(tokens[i], special=kind == CONTROL, normalized=False)
            for i, kind in enumerate(types)
            if kind in (CONTROL, USER_DEFINED)
        ]
    )
    return tokenizer


def _pre_tokenizer(kind: str) -> Any:
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if kind in ("default", "gpt2"):
        return byte_level
    if kind == "smollm":
        # llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM: every digit alone, then GPT-2's split.
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    raise ValueError(f"GGUF pre-tokenizer {kind!r} is not supported; only 'gpt2' and 'smollm'")


def tokenizer_config(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`tokenizer_config.json`: the special tokens by name, as transformers reads them."""
    tokens: Sequence[str] = metadata["tokenizer.ggml.tokens"]

    def named(key: str) -> str | None:
        value = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return None if value is None else tokens[_ints(value)[0]]

    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": named("bos"),
        "eos_token": named("eos"),
        "pad_token": named("padding"),
        "unk_token": named("unknown"),
        "add_bos_token": bool(_ints(metadata.get("tokenizer.ggml.add_bos_token", [False]))[0]),
        "model_max_length": _ints(metadata.get("llama.context_length", [2048]))[0],
        "clean_up_tokenization_spaces": False,
    }


def write_tokenizer(metadata: Mapping[str, Any], dest: Path) -> None:
    """`tokenizer.json`, `tokenizer_config.json` and `chat_template.jinja` into `dest`."""
    build_tokenizer(metadata).save(str(dest / "tokenizer.json"))
    config = json.dumps(tokenizer_config(metadata), indent=2, ensure_ascii=False)
    (dest / "tokenizer_config.json").write_text(config + "\n", encoding="utf-8")
    template = metadata.get("tokenizer.chat_template")
    if isinstance(template, str):
        (dest / "chat_template.jinja").write_text(template, encoding="utf-8")


def _ints(value: Any) -> list[int]:
    # mx.load gives GGUF numbers as MLX arrays (scalars or vectors).
    listed = value.tolist() if hasattr(value, "tolist") else value
    return [int(x) for x in (listed if isinstance(listed, list) else [listed])]
