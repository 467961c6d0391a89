"""One KV tensor as plain bytes: its name, safetensors dtype, shape and data.

The disk tier writes and reads entries as these (`stages/cache/kv_file.py`), and the model thread
rebuilds a cache layer from them (`stages/models/mlx_internals.py`'s `restore_layer`). The record
lives here, in the lowest room both import, so neither the cache nor model loading imports the other
for it. Pure data: no MLX array, no I/O.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: memoryview
