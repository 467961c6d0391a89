"""A row with images, made ready for the text batch on the model thread.

Before a row with images is inserted (`stages/model_thread/batch_rows.py`, at admission,
between two steps), its images are encoded (vision tower and connector, or
the encoder-output cache) and its prompt is prefilled from embeddings up to
its last image token: each `<image>` token's embedding is the next row of its
image's features, every other token's is the language model's own. The row
then enters the batch with that KV as its cache and the rest of its prompt
(text) as tokens, and decodes beside the text rows as one of them; this is
how vllm-mlx's MLLM batch generator runs a multimodal row's language model.

The prompt cache sees an image as its digest: `key` gives each image token an
id made from its image's digest and its place in the image (above any real
vocabulary, within the disk tier's int32), so a prefix matches only where
the same pictures sit at the same places, and turn 2 of a conversation
reuses turn 1's KV, images and all, without encoding them again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import attrs

from stages.messages import PromptImage
from stages.model_thread.encoder_cache import EncoderCache, EncoderCacheStatistics

# Image-token keys lie in [2**30, 2**31): past any vocabulary, inside the disk tier's int32 token ids.
_KEY_BASE = 1 << 30


def image_keys(image: PromptImage) -> list[int]:
    """The prompt cache's ids for one image's tokens: its digest and each token's place in it."""
    ids = []
    for place in range(image.tokens):
        mixed = hashlib.blake2b(image.digest + place.to_bytes(4, "little"), digest_size=4).digest()
        ids.append(_KEY_BASE + int.from_bytes(mixed, "little") % _KEY_BASE)
    return ids


def keyed(tokens: Sequence[int], images: Sequence[PromptImage], image_token: int) -> tuple[int, ...]:
    """`tokens` with each image token replaced by its image's key (the prompt cache's view of the prompt)."""
    keys = [key for image in images for key in image_keys(image)]
    out, taken = list(tokens), 0
    for index, token in enumerate(out):
        if token == image_token and taken < len(keys):
            out[index] = keys[taken]
            taken += 1
    return tuple(out)


@attrs.define
class VisionRows:
    model: Any
    tower: Any
    cache: EncoderCache
    chunk: int = 512
    # The share of the decoding rows' time that encoding may add while they run (MLX_RELAY_EXCLUSIVE_SHARE's rule).
    share: float = 0.15
    # Seconds of encoding earned (share × time passed) and not yet spent; the last tile's cost; when last earned.
    _credit: float = attrs.field(default=0.0, init=False)
    _tile_cost: float = attrs.field(default=0.0, init=False)
    _earned_at: float | None = attrs.field(default=None, init=False)
    # Tiles encoded so far of images not yet whole, and whole images no row has taken yet, by digest.
    _partial: dict[bytes, list[Any]] = attrs.field(factory=dict, init=False)
    _ready: dict[bytes, Any] = attrs.field(factory=dict, init=False)

    @classmethod
    def of(cls, model: Any, *, cache_bytes: int, chunk: int, share: float = 0.15) -> VisionRows | None:
        """The model thread's image side for `model`; None for a text model."""
        tower = getattr(model, "vision_tower", None)
        if tower is None:
            return None
        return cls(model=model, tower=tower, cache=EncoderCache(cache_bytes), chunk=chunk, share=share)

    @property
    def image_token(self) -> int:
        return int(self.tower.image_token_id)

    def statistics(self) -> EncoderCacheStatistics:
        return self.cache.statistics()

    def prefill(
        self, tokens: Sequence[int], images: Sequence[PromptImage], start: int, layers: list[Any] | None
    ) -> tuple[list[Any], int]:
        """The row's KV from `start` through its last image token, and where the batch takes over.

        `layers` hold the KV of `tokens[:start]` (a prompt-cache hit), or None for none.
        """
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        # The images' own tokens: the first ones of that id (a resumed row's generated tokens may hold it too).
        positions = [index for index, token in enumerate(tokens) if token == self.image_token]
        positions = positions[: sum(image.tokens for image in images)]
        # The batch prefills the rest: at least the prompt's last token, whose logits start the answer.
        end = min(positions[-1] + 1 if positions else 0, len(tokens) - 1)
        if layers is None:
            layers = make_prompt_cache(self.model)
        if end <= start:
            return layers, start
        # An image wholly inside the cached prefix is not encoded again: its rows are never read.
        pieces, taken = [], 0
        for image in images:
            needed = positions[taken + image.tokens - 1] >= start
            pieces.append(self._features(image) if needed else mx.zeros((image.tokens, self._hidden)))
            taken += image.tokens
        features = mx.concatenate(pieces, axis=0)
        for low in range(start, end, self.chunk):
            high = min(low + self.chunk, end)
            ids = mx.array(list(tokens[low:high]))
            embeddings = self.model.model.embed_tokens(ids)
            inside = [(place - low, row) for row, place in enumerate(positions) if low <= place < high]
            if inside:
                local, rows = zip(*inside, strict=True)
                embeddings[mx.array(local)] = features[mx.array(rows)].astype(embeddings.dtype)
            self.model(ids[None], cache=layers, input_embeddings=embeddings[None])
            mx.eval([layer.state for layer in layers])
        return layers, end

    @property
    def _hidden(self) -> int:
        return int(self.model.model.embed_tokens.weight.shape[-1])

    def encode_step(self, images: Sequence[PromptImage]) -> bool:
        """One tile of the row's first image not yet encoded; True once every image is ready.

        While other rows decode, a row's images are encoded a tile at a time, and
        only once `share` of the time passed since pays for a tile: no gap between
        their tokens holds more than one tile's encode, and few gaps hold one.
        """
        now = time.perf_counter()
        if self._earned_at is not None:
            # Capped at two tiles' worth: credit saved while idle never buys a burst.
            self._credit = min(self._credit + (now - self._earned_at) * self.share, 2 * self._tile_cost)
        self._earned_at = now
        if self._credit < self._tile_cost:
            return False
        for image in images:
            if image.digest in self._ready or image.digest in self.cache:
                continue
            tiles = self._partial.setdefault(image.digest, [])
            if not tiles:
                self.cache.misses += 1
            began = time.perf_counter()
            tiles.append(self._encode(image.pixels[len(tiles) : len(tiles) + 1]))
            self._tile_cost = time.perf_counter() - began
            self._credit -= self._tile_cost
            if len(tiles) == len(image.pixels):
                import mlx.core as mx

                features = mx.concatenate(self._partial.pop(image.digest), axis=0)
                self._ready[image.digest] = features
                self.cache.encoded_images += 1
                if self.cache.max_bytes:
                    self.cache.put(image.digest, features)
            return False
        return True

    def forget(self, images: Sequence[PromptImage]) -> None:
        """A row that left before its prefill: what was encoded for it alone goes (the cache keeps its own)."""
        for image in images:
            self._partial.pop(image.digest, None)
            self._ready.pop(image.digest, None)

    def _features(self, image: PromptImage) -> Any:
        features = self._ready.pop(image.digest, None)
        if features is not None:
            return features
        features = self.cache.get(image.digest) if self.cache.max_bytes else None
        if features is None:
            features = self._encode(image.pixels)
            self.cache.encoded_images += 1
            if self.cache.max_bytes:
                self.cache.put(image.digest, features)
        return features

    def _encode(self, pixels: Any) -> Any:
        began = time.perf_counter()
        features = self.tower.encode(pixels)
        self.cache.encode_seconds += time.perf_counter() - began
        return features
