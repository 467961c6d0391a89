"""`tiny-vl`: a random-weight vision-language model of SmolVLM's architecture, small enough for CI.

SmolVLM (HuggingFaceTB/SmolVLM-256M-Instruct) is Idefics3: a SigLIP vision
tower, a pixel-shuffle connector and a llama language model. The build
writes the directory mlx-vlm loads (its `idefics3` model, weights in the
layout `mlx_vlm.convert` writes), with SmolVLM's published processor
files scaled down: `preprocessor_config.json` (Idefics3's image processor:
tiles of `max_image_size` plus the global image), `processor_config.json`
(`image_seq_len`), and its chat template. Sizes: 128-pixel tiles of 16-pixel
patches, shuffled by 2, so each tile is 16 image tokens; an image of up to
256 pixels a side is at most 2×2 tiles and the global one (80 tokens).

The tokenizer is a byte-level BPE trained as the demo models train theirs
(`stages/models/demo.py`), with SmolVLM's special tokens: `<image>`,
`<fake_token_around_image>`, `<global-img>`, `<row_R_col_C>` and
`<end_of_utterance>` (the EOS). Built once into the cache
(`stages/models/publish.py`), byte-identical for one environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stages.models.publish import build_once, default_cache_root

NAME = "tiny-vl"
BUILDER_VERSION = "v1"
_SEED = 2468
_VOCAB = 1200
_CONTEXT = 8192

IMAGE_TOKEN = "<image>"
EOS_TOKEN = "<end_of_utterance>"
_GRID = 6
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    EOS_TOKEN,
    "<fake_token_around_image>",
    IMAGE_TOKEN,
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, _GRID + 1) for col in range(1, _GRID + 1)),
)

# SmolVLM-256M-Instruct's chat_template.json, as published.
CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n"
    "{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

TILE = 128
_PATCH = 16
_SCALE = 2
IMAGE_SEQ_LEN = (TILE // _PATCH) ** 2 // _SCALE**2


def ensure_tiny_vl(cache_root: Path | None = None) -> Path:
    """The directory of `tiny-vl`, built first if it is not cached."""
    root = cache_root if cache_root is not None else default_cache_root()
    return build_once(root / f"{NAME}-{BUILDER_VERSION}", _build)


def _build(dest: Path) -> None:
    vocab = _write_tokenizer(dest)
    config = model_config(vocab)
    _write_json(dest / "config.json", config)
    _write_json(dest / "preprocessor_config.json", _preprocessor_config())
    _write_json(
        dest / "processor_config.json", {"image_seq_len": IMAGE_SEQ_LEN, "processor_class": "Idefics3Processor"}
    )
    _write_json(dest / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    _write_json(
        dest / "generation_config.json", {"bos_token_id": vocab["<|im_start|>"], "eos_token_id": vocab[EOS_TOKEN]}
    )
    _write_weights(dest / "model.safetensors", config)


def _write_tokenizer(dest: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from stages.models.demo import _corpus as corpus

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    tokenizer.save(str(dest / "tokenizer.json"))
    _write_json(
        dest / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": "<|im_start|>",
            "eos_token": EOS_TOKEN,
            "pad_token": "<|endoftext|>",
            "unk_token": "<|endoftext|>",
            "model_max_length": _CONTEXT,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
            "additional_special_tokens": [EOS_TOKEN, "<fake_token_around_image>", IMAGE_TOKEN],
        },
    )
    vocab: dict[str, int] = tokenizer.get_vocab(with_added_tokens=True)
    return vocab


def model_config(vocab: Mapping[str, int]) -> dict[str, Any]:
    """Idefics3's config.json (SmolVLM-256M's keys), at tiny sizes."""
    eos = vocab[EOS_TOKEN]
    text = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": _CONTEXT,
        "vocab_size": len(vocab),
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    vision = {
        "model_type": "idefics3_vision",
        "hidden_size": 48,
        "intermediate_size": 96,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "patch_size": _PATCH,
        "image_size": TILE,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
    }
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "image_token_id": vocab[IMAGE_TOKEN],
        "scale_factor": _SCALE,
        "vocab_size": len(vocab),
        "tie_word_embeddings": False,
        "eos_token_id": [eos],
        "text_config": text,
        "vision_config": vision,
        "torch_dtype": "float32",
    }


def _preprocessor_config() -> dict[str, Any]:
    # SmolVLM-256M-Instruct's preprocessor_config.json with its sizes scaled from 512-pixel tiles to TILE.
    return {
        "do_convert_rgb": True,
        "do_image_splitting": True,
        "do_normalize": True,
        "do_pad": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_processor_type": "Idefics3ImageProcessor",
        "processor_class": "Idefics3Processor",
        "max_image_size": {"longest_edge": TILE},
        "size": {"longest_edge": 2 * TILE},
        "resample": 1,
        "rescale_factor": 1 / 255,
    }


def _write_weights(path: Path, config: dict[str, Any]) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.models.idefics3.config import ModelConfig, TextConfig, VisionConfig
    from mlx_vlm.models.idefics3.idefics3 import Model

    mx.random.seed(_SEED)
    model_config = ModelConfig.from_dict(config)
    model_config.text_config = TextConfig.from_dict(config["text_config"])
    model_config.vision_config = VisionConfig.from_dict(config["vision_config"])
    model = Model(model_config)
    weights = dict(tree_flatten(model.parameters()))
    mx.eval(weights)
    mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})


def _write_json(path: Path, value: Mapping[str, object]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
