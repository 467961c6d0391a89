"""Random-weight models of other families: the demo model's tokenizer with a
family's special tokens added and that family's chat template.

`derive_demo_model(base, dest, template=…, special_tokens=…)` reads a demo
model directory (`stages/models/demo.py`), adds the tokens (special, so
one id each, as in the family's real vocabulary), writes the template as
`chat_template.jinja` and fresh random weights sized to the new vocabulary,
with the same fixed seed. The result is an ordinary mlx-lm model
directory; the tests build one per family from real templates.
On error: the destination may be left incomplete; callers build into a
fresh folder.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from stages.models import demo


def derive_demo_model(
    base: Path, dest: Path, *, template: str, special_tokens: Sequence[str], bos: str | None, eos: Sequence[str]
) -> Path:
    """Build the family model in `dest` (created) and return it.

    Args:
        base: a demo model directory.
        special_tokens: the family's tokens; added where the base lacks them.
        bos, eos: among the vocabulary after adding; the first `eos` is the tokenizer's EOS.
    """
    from tokenizers import AddedToken, Tokenizer

    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in special_tokens])
    tokenizer.save(str(dest / "tokenizer.json"))
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    config.update(vocab_size=len(vocab), eos_token_id=[vocab[token] for token in eos])
    if bos is not None:
        config["bos_token_id"] = vocab[bos]
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": bos,
        "eos_token": eos[0],
        "pad_token": eos[0],
        "clean_up_tokenization_spaces": False,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2), encoding="utf-8")
    (dest / "chat_template.jinja").write_text(template, encoding="utf-8")
    (dest / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    # Special tokens get a zero output row, as the demo's control tokens do: sampled rarely.
    demo._write_weights(dest / "model.safetensors", config, [vocab[token] for token in special_tokens])
    return dest
