"""The disk tier as the prompt cache's lower tier: entries to files and back.

`DiskLink` satisfies `prompt_cache.LowerTier`. Spilling turns an entry into
memoryviews of its (evaluated) arrays and queues them for the gateway's
spill worker; restoring reads a checked file and rebuilds each layer with
the gateway's `make_layer`, which owns the MLX calls. An entry goes to its
adapter's space on disk and comes back only to that adapter (the disk
tier's `space_of`). Model thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import structlog

from stages.cache.disk import DiskTier, SpillJob
from stages.cache.kv_file import tensor, token_tensor
from stages.cache.tier import DiskStatistics, Entry, Key
from stages.kv.tensors import Tensor
from stages.models.mlx_internals import layer_tensors

log = structlog.get_logger(stage="gateway")

# A layer from its named tensors ("keys", "values", a quantized layer's ".scales" and ".biases"),
# quantized with (bits, group_size) when bits is set.
MakeLayer = Callable[[dict[str, Tensor], int | None, int], Any]


@attrs.define
class DiskLink:
    disk: DiskTier
    # Spills for the gateway to hand to its worker at the next step.
    outbox: list[SpillJob]
    make_layer: MakeLayer

    def longest(self, tokens: Sequence[int], adapter: str | None = None) -> tuple[Key, int] | None:
        space = self.disk.space_of(adapter)
        return None if space is None else self.disk.longest(tokens, space)

    def spill(self, entry: Entry) -> None:
        space = self.disk.space_of(entry.adapter)
        if space is None or self.disk.has(entry.tokens, space):
            return
        # The worker reads these views without calling MLX.
        tensors = [token_tensor(entry.tokens)]
        for index, layer in enumerate(entry.cache):
            named = layer_tensors(layer)
            parts = [tensor(f"layers.{index}.{name}", array) for name, array in named.items()] if named else [None]
            if any(part is None for part in parts):
                # A sliding-window or recurrent layer, or a dtype the file format has no name for.
                self.disk.note_unsupported()
                return
            tensors += [part for part in parts if part is not None]
        self.outbox.append(
            SpillJob(tokens=entry.tokens, prompt_len=entry.prompt_len, tensors=tuple(tensors), space=space)
        )

    def restore(self, key: Key, adapter: str | None = None) -> Entry | None:
        started = time.perf_counter()
        entry = self.load(key, adapter)
        if entry is not None:
            self.count_restore(key, started, adapter)
        return entry

    def load(self, key: Key, adapter: str | None = None) -> Entry | None:
        """The entry's file as cache layers, checked; None (the file deleted if damaged) when it does not check out."""
        space = self.disk.space_of(adapter)
        restored = None if space is None else self.disk.read(key, space)
        if restored is None:
            return None
        layers: dict[int, dict[str, Tensor]] = {}
        try:
            for name, item in restored.tensors.items():
                _, index, part = name.split(".", 2)
                layers.setdefault(int(index), {})[part] = item
        except ValueError:
            return None
        # The checksum proved the bytes; this proves they are KV for exactly these tokens.
        if (
            not layers
            or sorted(layers) != list(range(len(layers)))
            or any(item.shape[2:3] != (len(key),) for parts in layers.values() for item in parts.values())
        ):
            return None
        scheme = self.disk.kv_scheme
        try:
            cache = [self.make_layer(layers[index], scheme.bits, scheme.group_size) for index in range(len(layers))]
        except KeyError:
            return None
        return Entry(tokens=key, cache=cache, prompt_len=restored.prompt_len, adapter=adapter, on_disk=True)

    def count_restore(self, key: Key, started: float, adapter: str | None = None) -> None:
        seconds = time.perf_counter() - started
        self.disk.record_restore(seconds)
        log.info("prompt_cache.restore", tokens=len(key), adapter=adapter, seconds=round(seconds, 4))

    def statistics(self) -> DiskStatistics:
        return self.disk.statistics()
