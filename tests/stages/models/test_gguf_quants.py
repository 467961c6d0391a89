"""stages/models/gguf_file.py and gguf_quants.py against llama.cpp's own Python package, `gguf`.

The reader is held against a file `gguf`'s writer made; each block type's
decoding against `gguf.quants.dequantize`, to the bit, on random blocks and
on every type Gemma 3 270M's Q4_K_M file holds; the exact MLX triples
against the decoded values, dequantized by MLX itself.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize as reference_dequantize
from gguf.quants import quantize as reference_quantize

from stages.models.gguf import GGUFError
from stages.models.gguf_file import BLOCKS, F32, Q4_K, Q5_0, Q6_K, Q8_0, GGUFTensor, read_gguf_file
from stages.models.gguf_quants import dequantize, mlx_affine

# Where each block keeps its float16 scales: random bytes there could be NaN or infinite.
_HALF_AT = {Q8_0: (0,), Q5_0: (0,), Q4_K: (0, 2), Q6_K: (208,)}
ROWS, COLUMNS = 6, 512


def _random_tensor(kind: int, seed: int) -> GGUFTensor:
    values, size = BLOCKS[kind]
    generator = np.random.default_rng(seed)
    blocks = generator.integers(0, 256, (ROWS * COLUMNS // values, size), dtype=np.uint8)
    for at in _HALF_AT[kind]:
        halves = (generator.standard_normal(len(blocks)) * 0.02).astype(np.float16)
        blocks[:, at : at + 2] = halves.view(np.uint8).reshape(-1, 2)
    return GGUFTensor("random", kind, (ROWS, COLUMNS), blocks.reshape(-1))


def _theirs(tensor: GGUFTensor) -> np.ndarray:
    rows = tensor.data.reshape(tensor.shape[0], -1)
    return np.asarray(reference_dequantize(rows, GGMLQuantizationType(tensor.kind)))


@pytest.mark.parametrize("kind", [Q8_0, Q5_0, Q4_K, Q6_K], ids=["Q8_0", "Q5_0", "Q4_K", "Q6_K"])
def test_random_blocks_decode_to_the_gguf_packages_values(kind: int) -> None:
    for seed in range(3):
        tensor = _random_tensor(kind, seed)
        ours = dequantize(tensor)
        assert ours.dtype == np.float32 and ours.shape == (ROWS, COLUMNS)
        np.testing.assert_array_equal(ours, _theirs(tensor))


@pytest.mark.parametrize("kind", [Q8_0, Q5_0])
def test_q8_0_and_q5_0_become_mlx_triples_that_dequantize_exactly(kind: int) -> None:
    tensor = _random_tensor(kind, 11)
    triple = mlx_affine(tensor)
    assert triple is not None
    packed, scales, biases = triple
    assert scales.dtype == biases.dtype == np.float16 and scales.shape == (ROWS, COLUMNS // 32)
    bits = {Q8_0: 8, Q5_0: 5}[kind]
    assert packed.dtype == np.uint32 and packed.shape == (ROWS, COLUMNS * bits // 32)
    # In float32 arithmetic: the scales and biases themselves are exact, MLX's float16 sums would round.
    scales32, biases32 = mx.array(scales).astype(mx.float32), mx.array(biases).astype(mx.float32)
    back = mx.dequantize(mx.array(packed), scales32, biases32, group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(back), dequantize(tensor))


def test_k_quants_have_no_exact_triple() -> None:
    assert mlx_affine(_random_tensor(Q4_K, 0)) is None and mlx_affine(_random_tensor(Q6_K, 0)) is None


def test_an_undecoded_type_is_refused_by_name() -> None:
    q5_k = GGUFTensor("blk.0.ffn_down.weight", 13, (1, 256), np.zeros(176, dtype=np.uint8))
    with pytest.raises(GGUFError, match=r"blk\.0\.ffn_down\.weight.*Q5_K"):
        dequantize(q5_k)


def test_the_reader_reads_what_the_gguf_writer_wrote(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_uint32("gemma3.block_count", 18)
    writer.add_float32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_array("tokenizer.ggml.tokens", ["<pad>", "▁the", "日本"])
    writer.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.0])
    matrix = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    writer.add_tensor("output_norm.weight", matrix[0])
    q8 = reference_quantize(matrix, GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_v.weight", q8, raw_shape=q8.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file):
        write()
    writer.close()

    read = read_gguf_file(path)
    assert read.metadata["general.architecture"] == "gemma3" and read.metadata["gemma3.block_count"] == 18
    assert read.metadata["tokenizer.ggml.tokens"] == ["<pad>", "▁the", "日本"]
    assert read.metadata["tokenizer.ggml.scores"] == [0.0, -1.5, -2.0]
    assert read.metadata["tokenizer.ggml.add_bos_token"] is True
    norm, v = read.tensors["output_norm.weight"], read.tensors["blk.0.attn_v.weight"]
    assert (norm.kind, norm.shape, v.kind, v.shape) == (F32, (64,), Q8_0, (4, 64))
    np.testing.assert_array_equal(dequantize(norm), matrix[0])
    np.testing.assert_array_equal(dequantize(v), reference_dequantize(q8, GGMLQuantizationType.Q8_0))


def test_every_type_in_gemma3s_file_decodes_to_the_gguf_packages_values(gemma3_gguf: Path) -> None:
    tensors = read_gguf_file(gemma3_gguf).tensors
    kinds = {tensor.kind for tensor in tensors.values()}
    assert kinds == {F32, Q8_0, Q5_0, Q4_K, Q6_K}
    # The smallest tensor of each type; the embedding (the only big Q8_0) is left to the model's tests.
    for kind in kinds:
        tensor = min((t for t in tensors.values() if t.kind == kind), key=lambda t: t.data.size)
        np.testing.assert_array_equal(dequantize(tensor), _theirs(tensor).reshape(tensor.shape), err_msg=tensor.name)
