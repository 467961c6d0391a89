"""The quantized batch cache against mlx-lm's own quantized path, and its round trip through the disk tier.

The batch (rows of different lengths, right-padded prefill, rows leaving)
holds quantized KV at its real size and answers every row. A preempted row's
layers (`extract`) merge back into a batch; a quantized entry written to the
disk tier comes back quantized and equal, and a full-precision tier never
reads it.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator, generate_step

from stages.cache.disk import DiskTier, SpillJob
from stages.cache.link import DiskLink
from stages.cache.tier import Entry
from stages.kv.shape import KvScheme
from stages.models.loading import load_weights, resolve_model
from stages.models.mlx_internals import restore_layer
from stages.models.quantized_kv import BatchQuantizedKV, QuantizedBatchGenerator, RowQuantizedKV, refusal, row_cache

Q8 = KvScheme(bits=8)
PROMPTS = [[(3 * i + 7) % 400 + 20 for i in range(n)] for n in (31, 9, 4)]
TOKENS = 24


@pytest.fixture(scope="module")
def model() -> object:
    return load_weights(resolve_model("demo"))


def batched(model: object, generator: type, **options: object) -> tuple[list[list[int]], int]:
    """Every row's greedy tokens, and the most bytes the batch's caches held."""
    made = generator(
        model, stop_tokens=[], completion_batch_size=8, prefill_batch_size=8, prefill_step_size=16, **options
    )
    uids = made.insert(PROMPTS, max_tokens=[TOKENS] * len(PROMPTS))
    out: dict[int, list[int]] = {uid: [] for uid in uids}
    done, held = 0, 0
    while done < len(uids):
        for response in made.next_generated():
            out[response.uid].append(response.token)
            done += response.finish_reason is not None
        held = max(held, made.prompt_cache_nbytes)
    made.close()
    return [out[uid] for uid in uids], held


def test_the_quantized_batch_holds_a_quarter_of_the_bytes_and_answers_every_row(model: object) -> None:
    """demo is float32: 8 bits and a float32 scale and bias per 64 values are 72/256 of a full row."""
    assert refusal(model, Q8) is None
    rows, quantized = batched(model, QuantizedBatchGenerator, kv_scheme=Q8)
    full_rows, full = batched(model, BatchGenerator)
    assert all(len(row) == TOKENS for row in rows + full_rows)
    assert 0 < quantized <= full * 72 / 256 * 1.01


def test_the_quantized_batch_starts_as_mlx_lms_quantized_path(model: object) -> None:
    """The first token of the longest prompt is generate_step(kv_bits=8)'s; later ones may part, as a
    batched row's float32 logits differ from a lone row's by about 0.02 with or without quantized KV."""
    rows, _ = batched(model, QuantizedBatchGenerator, kv_scheme=Q8)
    steps = generate_step(mx.array(PROMPTS[0]), model, max_tokens=1, kv_bits=8, kv_group_size=64, quantized_kv_start=0)
    assert rows[0][:1] == [int(token) for token, _ in steps]


def test_quantized_rows_are_quantized_layers(model: object) -> None:
    layers = row_cache(model, Q8)
    assert layers and all(isinstance(layer, RowQuantizedKV) for layer in layers)
    model(mx.array([PROMPTS[0]]), cache=layers)  # type: ignore[operator]
    merged = RowQuantizedKV.merge([layers[0], row_cache(model, Q8)[0]])
    assert isinstance(merged, BatchQuantizedKV) and merged.bits == 8 and merged.size() == len(PROMPTS[0])
    back = merged.extract(0)
    assert back.offset == len(PROMPTS[0])
    held = len(PROMPTS[0])
    assert all(mx.array_equal(a, b[..., :held, :]).item() for a, b in zip(back.keys, layers[0].keys, strict=True))


def test_a_quantized_entry_round_trips_through_the_disk_tier_and_never_into_another_scheme(
    model: object, tmp_path: Path
) -> None:
    layers = row_cache(model, Q8)
    tokens = tuple(PROMPTS[0])
    model(mx.array([PROMPTS[0]]), cache=layers)  # type: ignore[operator]
    mx.eval([layer.state for layer in layers])
    disk = DiskTier(root=tmp_path, max_bytes=1 << 26, fingerprint="q" * 64, kv_scheme=Q8)
    disk.scan()
    outbox: list[SpillJob] = []
    DiskLink(disk, outbox, restore_layer).spill(Entry(tokens=tokens, cache=layers, prompt_len=len(tokens)))
    (job,) = outbox
    disk.write(job)
    assert b'"kv_scheme": "q8g64"' in next(tmp_path.glob("*.safetensors")).read_bytes()[:4096]
    restored = DiskLink(disk, [], restore_layer).restore(tokens)
    assert restored is not None
    for mine, back in zip(layers, restored.cache, strict=True):
        assert isinstance(back, RowQuantizedKV) and back.offset == mine.offset
        for a, b in zip((*mine.keys, *mine.values), (*back.keys, *back.values), strict=True):
            assert mx.array_equal(a[..., : mine.offset, :], b).item()
    # A full-precision tier over the same folder: another fingerprint, so the file is not its entry.
    full = DiskTier(root=tmp_path, max_bytes=1 << 26, fingerprint="f" * 64)
    full.scan()
    assert DiskLink(full, [], restore_layer).restore(tokens) is None
