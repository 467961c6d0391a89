"""A chat with images, rendered for a vision-language model: its pictures checked and tiled, its prompt expanded.

The model's own processor files decide the tiles: `preprocessor_config.json`
through transformers' image processor (its Pillow backend; no torch), and
`processor_config.json`'s `image_seq_len`. Each image becomes the token run
Idefics3's processor writes (a row/column marker and `image_seq_len`
`<image>` tokens per tile, then the global image), so usage, the context
check and `count_tokens` count image tokens as the model reads them. OpenAI's
`detail: "low"` reads the image as the one global tile.
Runs in the preparation threads (`stages/prompt/prepare.py` calls `render`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from pipeline.errors import invalid
from pipeline.requests import ChatRequest, ImageDetail, ImagePart
from pipeline.settings import Settings
from stages.families.base import Family
from stages.messages import PromptImage, Rendered
from stages.models.loading import Tokenizer
from stages.prompt.chat import render_chat_text
from stages.prompt.images import ImageLimits, decode

IMAGE_TOKEN = "<image>"
_FAKE = "<fake_token_around_image>"
_GLOBAL = "<global-img>"


@attrs.define
class VisionPrompt:
    processor: Any
    image_seq_len: int
    image_token_id: int
    limits: ImageLimits
    max_images: int
    # What the model side holds for images beside the weights (the encoder cache's cap), for the memory plan.
    held_bytes: int = 0

    @classmethod
    def load(cls, path: Path, tokenizer: Tokenizer, settings: Settings) -> VisionPrompt | None:
        """The image side of the model at `path`; None when it is a text model."""
        from stages.models.vlm import vision_config

        config = vision_config(path)
        if config is None:
            return None
        from transformers import AutoImageProcessor

        processor = AutoImageProcessor.from_pretrained(str(path), backend="pil")
        extra = path / "processor_config.json"
        published = json.loads(extra.read_text(encoding="utf-8")) if extra.is_file() else {}
        ids = tokenizer.encode(IMAGE_TOKEN, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{path}: the tokenizer does not hold {IMAGE_TOKEN} as one token")
        return cls(
            processor=processor,
            image_seq_len=int(published.get("image_seq_len", 169)),
            image_token_id=ids[0],
            limits=ImageLimits.of(settings),
            max_images=settings.max_images,
            held_bytes=settings.encoder_cache_bytes,
        )

    def render(
        self,
        tokenizer: Tokenizer,
        request: ChatRequest,
        *,
        preamble: Family | None = None,
        think: tuple[str, str] | None = None,
    ) -> Rendered:
        """The prompt's tokens with each image's run of image tokens, and the images they stand for.

        Raises:
            RequestError: a bad image (400 naming its part), too many images, or a
                prompt whose text holds the image token itself.
        """
        parts = [image for message in request.messages for image in message.images]
        if len(parts) > self.max_images:
            extra = parts[self.max_images]
            message = (
                f"The image at '{extra.param}' is one too many: this server reads at most {self.max_images} per request"
            )
            raise invalid(message, param=extra.param, code="too_many_images")
        if request.context_edits or request.truncate_to_fit:
            field = "context_management" if request.context_edits else "truncation"
            raise invalid(f"'{field}' cannot edit a conversation with images yet", param=field)
        images, runs = zip(*(self._tile(part) for part in parts), strict=True) if parts else ((), ())
        prompt = render_chat_text(tokenizer, request, preamble=preamble, parts=True, think=think)
        text = prompt.text
        pieces = text.split(IMAGE_TOKEN)
        if len(pieces) != len(parts) + 1:
            message = f"The messages' text may not hold {IMAGE_TOKEN} itself; send images as image parts"
            raise invalid(message, param="messages")
        expanded = pieces[0] + "".join(run + piece for run, piece in zip(runs, pieces[1:]))
        tokens = tokenizer.encode(expanded, add_special_tokens=False)
        if tokens.count(self.image_token_id) != sum(image.tokens for image in images):
            raise invalid("The messages' text holds tokens the model keeps for images", param="messages")
        return Rendered(
            tokens=tokens, original_tokens=len(tokens), images=tuple(images), opens_reasoning=prompt.opens_reasoning
        )

    def _tile(self, part: ImagePart) -> tuple[PromptImage, str]:
        picture = decode(part, self.limits)
        split = part.detail is not ImageDetail.LOW and bool(getattr(self.processor, "do_image_splitting", False))
        # Resized, tiled and padded, but not rescaled nor normalized: uint8 tiles, a quarter of float32's bytes to
        # the model side, which normalizes them (stages/models/vlm.py).
        out = self.processor(
            [[picture.image]],
            return_row_col_info=True,
            do_image_splitting=split,
            return_tensors="np",
            do_rescale=False,
            do_normalize=False,
        )
        pixels = out["pixel_values"][0].astype("uint8", copy=False)
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        # The same picture tiled otherwise is other pixels for the tower: its own entry in the encoder cache.
        digest = hashlib.sha256(picture.digest + (b"tiled" if split else b"global")).digest()
        image = PromptImage(digest=digest, tokens=len(pixels) * self.image_seq_len, pixels=pixels)
        return image, image_prompt(rows, cols, self.image_seq_len)


def image_prompt(rows: int, cols: int, seq_len: int) -> str:
    """Idefics3's text for one image: a marker and `seq_len` image tokens per tile, then the global image."""
    run = IMAGE_TOKEN * seq_len
    glob = f"{_FAKE}{_GLOBAL}{run}{_FAKE}"
    if rows == 0 and cols == 0:
        return glob
    grid = "".join("".join(f"{_FAKE}<row_{r + 1}_col_{c + 1}>{run}" for c in range(cols)) + "\n" for r in range(rows))
    return f"{grid}\n{glob}"
