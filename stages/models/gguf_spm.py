"""A GGUF SentencePiece vocabulary (`tokenizer.ggml.model = llama`) as a Hugging Face tokenizer.

GGUF keeps a SentencePiece BPE model as three parallel lists:
`tokenizer.ggml.tokens` (pieces, spaces written `▁`), `.scores` and
`.token_type` (SentencePiece's piece types). SentencePiece's BPE merges,
at each step, the adjacent pair whose joined piece scores highest; a
`tokenizers` BPE merges the pair of lowest rank. So the merges are every
split of a normal piece into two normal pieces, ranked by the joined
piece's score, and the rest is SentencePiece's normalization (a space is
`▁`, with a leading one when `add_space_prefix`) and byte fallback for
characters outside the vocabulary. User-defined pieces (Gemma's runs of
spaces, tabs and newlines, HTML tags) are added tokens matched in the raw
text before the model runs: llama.cpp's converter wrote their `▁` as
spaces, and llama.cpp matches them so. Control pieces (`<start_of_turn>`)
are special added tokens, as a rendered chat template needs them.
`tests/stages/models/test_gguf_spm.py` holds the result against
SentencePiece itself, built from the same lists.

Takes GGUF metadata; gives a `tokenizers.Tokenizer` and the special
tokens' names. Writes nothing itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# SentencePiece's ModelProto.SentencePiece.Type, as llama.cpp stores them.
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4
SPACE = "▁"


def build_spm_tokenizer(metadata: Mapping[str, Any]) -> Any:
    """The `tokenizers.Tokenizer` for a GGUF SentencePiece BPE vocabulary.

    Raises:
        ValueError: the vocabulary is not a SentencePiece one.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    if metadata.get("tokenizer.ggml.model") != "llama":
        raise ValueError(
            f"GGUF tokenizer model {metadata.get('tokenizer.ggml.model')!r} is not SentencePiece ('llama')"
        )
    tokens: Sequence[str] = metadata["tokenizer.ggml.tokens"]
    types: Sequence[int] = metadata["tokenizer.ggml.token_type"]
    unknown = tokens[int(metadata.get("tokenizer.ggml.unknown_token_id", 0))]
    model = models.BPE(
        vocab={token: i for i, token in enumerate(tokens)},
        merges=spm_merges(tokens, metadata["tokenizer.ggml.scores"], types),
        unk_token=unknown,
        fuse_unk=True,
        byte_fallback=True,
    )
    tokenizer = Tokenizer(model)
    prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    spaces = normalizers.Replace(" ", SPACE)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), spaces]) if prefix else spaces
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tokenizer.decoder = decoders.Sequence([*steps, decoders.Strip(" ", 1, 0)] if prefix else steps)
    tokenizer.add_tokens(
        [
            AddedToken(tokens[i], special=kind == CONTROL, normalized=False)
            for i, kind in enumerate(types)
            if kind in (CONTROL, USER_DEFINED)
        ]
    )
    _add_bos(tokenizer, metadata)
    return tokenizer


def spm_merges(tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]) -> list[tuple[str, str]]:
    """Each normal piece's splits into two normal pieces, best-scoring joined piece first.

    Ties (one piece reachable by several splits) go by the halves' ids, as
    transformers' own SentencePiece conversion orders them.
    """
    normal = {token: i for i, token in enumerate(tokens) if types[i] == NORMAL}
    found: list[tuple[float, int, int, str, str]] = []
    for piece, index in normal.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in normal and right in normal:
                found.append((-scores[index], normal[left], normal[right], left, right))
    found.sort()
    return [(left, right) for _, _, _, left, right in found]


def special_names(metadata: Mapping[str, Any]) -> dict[str, str | None]:
    """The bos, eos, unk and pad pieces by the ids GGUF names."""
    tokens: Sequence[str] = metadata["tokenizer.ggml.tokens"]
    keys = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}
    named = {role: metadata.get(f"tokenizer.ggml.{key}_token_id") for role, key in keys.items()}
    return {f"{role}_token": None if value is None else tokens[int(value)] for role, value in named.items()}


def _add_bos(tokenizer: Any, metadata: Mapping[str, Any]) -> None:
    """`add_special_tokens=True` puts BOS first when the GGUF asks for it (Gemma: `<bos>`)."""
    from tokenizers import processors

    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if bos is None or not metadata.get("tokenizer.ggml.add_bos_token", False):
        return
    piece = metadata["tokenizer.ggml.tokens"][int(bos)]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{piece} $A", pair=f"{piece} $A {piece} $B", special_tokens=[(piece, int(bos))]
    )
