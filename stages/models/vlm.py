"""A vision-language model on the model thread: mlx-lm's language model beside mlx-vlm's vision tower.

A directory whose config has a `vision_config` is a VLM. mlx-vlm loads it;
its language model's weights then move, unchanged and uncopied, into the
mlx-lm model of the same architecture (`text_config`'s `model_type`), so
the batch, the prompt cache, the KV plan and single rows serve it as any
text model. The vision tower and connector stay mlx-vlm's: `VisionTower`
turns one image's tiles into the embeddings its `<image>` tokens stand for
(`stages/model_thread/vision_rows.py` merges them into the prompt).
Only Idefics3-shaped models (SmolVLM; a llama language model with plain
RoPE positions) are served: models with multimodal positions (Qwen2-VL's
M-RoPE) would need per-row positions the batch does not keep.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from stages.models.mlx_internals import model_classes

# The VLM architectures whose language model decodes in the text batch unchanged.
SERVED = frozenset({"idefics3", "smolvlm"})


def vision_config(path: Path) -> dict[str, Any] | None:
    """The model's `config.json` when it is a vision-language model; None for a text model."""
    config_file = path / "config.json"
    if not config_file.is_file():
        return None
    config: dict[str, Any] = json.loads(config_file.read_text(encoding="utf-8"))
    return config if isinstance(config.get("vision_config"), dict) else None


class UnsupportedVisionModel(ValueError):
    """A VLM whose architecture the batch cannot serve (raised at load)."""


@attrs.define
class VisionTower:
    """mlx-vlm's vision model and connector: pixels of an image's tiles → its image-token embeddings."""

    vision: Any
    connector: Any
    patch_size: int
    image_token_id: int
    # The processor's normalization (preprocessor_config.json), applied here to the prompt side's uint8 tiles.
    scale: float = 1 / 255
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)

    def encode(self, pixels: Any) -> Any:
        """`pixels` (tiles, channels, height, width), uint8 → (tiles × image_seq_len, hidden), evaluated."""
        import mlx.core as mx

        mean, std = mx.array(self.mean)[:, None, None], mx.array(self.std)[:, None, None]
        tiles = (mx.array(pixels).astype(mx.float32) * self.scale - mean) / std
        count, _, height, width = tiles.shape
        patches = mx.ones((count, height // self.patch_size, width // self.patch_size), dtype=mx.bool_)
        hidden, *_ = self.vision(tiles.transpose(0, 2, 3, 1), patch_attention_mask=patches, output_hidden_states=True)
        features = self.connector(hidden.astype(tiles.dtype))
        features = features.reshape(-1, features.shape[-1])
        mx.eval(features)
        return features


def load_vision_language(path: Path, config: dict[str, Any]) -> Any:
    """The mlx-lm language model, weights evaluated, with its `VisionTower` as `vision_tower`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import load_model

    if config.get("model_type") not in SERVED:
        raise UnsupportedVisionModel(
            f"{path} is a {config.get('model_type')!r} vision-language model; served are {sorted(SERVED)}"
        )
    vlm = load_model(path)
    text_config = dict(config["text_config"])
    model_class, args_class = model_classes(text_config)
    # mlx-lm's ModelArgs classes all have from_dict; the pair is typed as plain classes.
    args_type: Any = args_class
    model = model_class(args_type.from_dict(text_config))
    flat = tree_flatten(vlm.language_model.parameters())
    moved = [(_text_name(name), value) for name, value in (flat.items() if isinstance(flat, dict) else flat)]
    model.load_weights(moved, strict=True)
    mx.eval(model.parameters())
    model.vision_tower = VisionTower(
        vision=vlm.vision_model,
        connector=vlm.connector,
        patch_size=int(config["vision_config"]["patch_size"]),
        image_token_id=int(config.get("image_token_id", config.get("image_token_index", -1))),
        **_normalization(path),
    )
    return model


def _normalization(path: Path) -> dict[str, Any]:
    processor_file = path / "preprocessor_config.json"
    config = json.loads(processor_file.read_text(encoding="utf-8")) if processor_file.is_file() else {}
    values: dict[str, Any] = {
        "scale": float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", True) else 1.0
    }
    if not config.get("do_normalize", True):
        values["mean"], values["std"] = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    elif "image_mean" in config:
        values["mean"], values["std"] = tuple(config["image_mean"]), tuple(config["image_std"])
    return values


def _text_name(name: str) -> str:
    # mlx-vlm's language model keeps the head beside the layers; mlx-lm's llama nests the layers under `model`.
    return name if name.startswith("lm_head") else f"model.{name}"
