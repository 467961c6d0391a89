"""The encoder-output cache: each image's vision-tower output, kept for the next request that shows it.

Keyed by the image's digest (a hash of its decoded pixels and tiling,
`stages/prompt/vision_chat.py`), so the same picture sent as base64 or as
a URL, in this conversation or another, is one entry. Least recently used
entries go first once the bytes held pass `max_bytes`; an output larger than
the whole cap is not kept. Model thread only; `statistics()` is read from the
event loop as plain integers.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class EncoderCacheStatistics:
    entries: int
    bytes: int
    max_bytes: int
    hits: int
    misses: int
    evictions: int
    # Images run through the vision tower, and the seconds it took them (on the model thread, between steps).
    encoded_images: int
    encode_seconds: float


@attrs.define
class EncoderCache:
    max_bytes: int
    _entries: OrderedDict[bytes, Any] = attrs.field(factory=OrderedDict, init=False)
    _bytes: int = attrs.field(default=0, init=False)
    hits: int = attrs.field(default=0, init=False)
    misses: int = attrs.field(default=0, init=False)
    evictions: int = attrs.field(default=0, init=False)
    encoded_images: int = attrs.field(default=0, init=False)
    encode_seconds: float = attrs.field(default=0.0, init=False)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._entries

    def get(self, digest: bytes) -> Any | None:
        features = self._entries.get(digest)
        if features is None:
            self.misses += 1
            return None
        self._entries.move_to_end(digest)
        self.hits += 1
        return features

    def put(self, digest: bytes, features: Any) -> None:
        size = int(features.nbytes)
        if size > self.max_bytes or digest in self._entries:
            return
        self._entries[digest] = features
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, gone = self._entries.popitem(last=False)
            self._bytes -= int(gone.nbytes)
            self.evictions += 1

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def statistics(self) -> EncoderCacheStatistics:
        return EncoderCacheStatistics(
            entries=len(self._entries),
            bytes=self._bytes,
            max_bytes=self.max_bytes,
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            encoded_images=self.encoded_images,
            encode_seconds=round(self.encode_seconds, 6),
        )
