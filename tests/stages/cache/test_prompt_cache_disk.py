"""stages/cache/disk.py and cache_link.py: spill, restore, and never a wrong or damaged file.

Entries go through the same path the gateway uses: `DiskLink.spill` takes
memoryviews, `DiskTier.write` writes them (the worker's side), and
`DiskLink.restore` rebuilds layers with the gateway's `restore_layer`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from stages.cache.disk import DiskTier, SpillJob
from stages.cache.link import DiskLink
from stages.cache.tier import Entry
from stages.models.mlx_internals import restore_layer
from tests.stages.cache.test_prompt_cache import kv

FINGERPRINT = "f" * 64
TOKENS = tuple(range(500, 548))


def tier(root: Path, *, max_bytes: int = 1 << 24, fingerprint: str = FINGERPRINT) -> DiskTier:
    disk = DiskTier(root=root, max_bytes=max_bytes, fingerprint=fingerprint)
    disk.scan()
    return disk


def spill(disk: DiskTier, tokens: tuple[int, ...], *, dtype: Any = mx.float32) -> Entry:
    cache = kv(len(tokens))
    for layer in cache:
        layer.keys, layer.values = mx.contiguous(layer.keys.astype(dtype)), mx.contiguous(layer.values.astype(dtype))
        mx.eval(layer.keys, layer.values)
    entry = Entry(tokens=tokens, cache=cache, prompt_len=len(tokens) - 3, session="s")
    outbox: list[SpillJob] = []
    DiskLink(disk, outbox, restore_layer).spill(entry)
    (job,) = outbox
    disk.write(job)
    return entry


def restore(disk: DiskTier, tokens: tuple[int, ...]) -> Entry | None:
    return DiskLink(disk, [], restore_layer).restore(tokens)


def files(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16, mx.bfloat16], ids=str)
def test_spill_then_restore_gives_back_the_same_kv(tmp_path: Path, dtype: Any) -> None:
    disk = tier(tmp_path)
    original = spill(disk, TOKENS, dtype=dtype)
    assert disk.longest(TOKENS[:30] + (1, 2)) == (TOKENS, 30)
    restored = restore(disk, TOKENS)
    assert restored is not None and restored.on_disk and restored.prompt_len == len(TOKENS) - 3
    for mine, back in zip(original.cache, restored.cache, strict=True):
        assert back.offset == len(TOKENS) and back.keys.dtype == dtype
        assert mx.array_equal(mine.keys, back.keys).item() and mx.array_equal(mine.values, back.values).item()
    stats = disk.statistics()
    assert (stats.entries, stats.spills, stats.restores, stats.corrupt) == (1, 1, 1, 0)
    assert stats.bytes == files(tmp_path)[0].stat().st_size and stats.last_restore_seconds is not None


def test_files_are_valid_safetensors(tmp_path: Path) -> None:
    """mx.load reads them as they are: the format is a standard one, not ours alone."""
    disk = tier(tmp_path)
    original = spill(disk, TOKENS)
    arrays = mx.load(str(files(tmp_path)[0]))
    assert arrays["tokens"].tolist() == list(TOKENS)
    assert mx.array_equal(arrays["layers.1.values"], original.cache[1].values).item()


def test_a_restart_finds_the_files_and_deletes_partial_writes(tmp_path: Path) -> None:
    spill(tier(tmp_path), TOKENS)
    partial = tmp_path / ".deadbeef.123.tmp"
    partial.write_bytes(b"half a file")
    again = tier(tmp_path)
    assert not partial.exists()
    assert again.longest(TOKENS + (1,)) == (TOKENS, len(TOKENS))
    assert restore(again, TOKENS) is not None


@pytest.mark.parametrize("damage", ["flip-data", "truncate", "garbage"])
def test_a_damaged_file_is_detected_deleted_and_never_loaded(tmp_path: Path, damage: str) -> None:
    disk = tier(tmp_path)
    spill(disk, TOKENS)
    (path,) = files(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip-data":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) - 100]
    else:
        data = bytearray(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    path.write_bytes(bytes(data))
    assert restore(disk, TOKENS) is None
    assert not path.exists()
    stats = disk.statistics()
    assert (stats.entries, stats.bytes, stats.corrupt, stats.restores) == (0, 0, 1, 0)


def test_a_damaged_header_is_dropped_at_start(tmp_path: Path) -> None:
    spill(tier(tmp_path), TOKENS)
    (path,) = files(tmp_path)
    path.write_bytes(b"\xff" * 64)
    again = tier(tmp_path)
    assert again.longest(TOKENS) is None and not path.exists() and again.statistics().corrupt == 1


def test_a_file_swapped_under_the_index_is_not_loaded_into_the_wrong_context(tmp_path: Path) -> None:
    """A whole, valid file holding other tokens than its index entry says is refused."""
    other = tuple(range(900, 948))
    disk = tier(tmp_path)
    spill(disk, TOKENS)
    spill(disk, other)
    mine, theirs = (tmp_path / p.name for p in files(tmp_path))
    mine_bytes = mine.read_bytes()
    mine.write_bytes(theirs.read_bytes())
    theirs.write_bytes(mine_bytes)
    assert restore(disk, TOKENS) is None and restore(disk, other) is None
    assert disk.statistics().corrupt == 2


def test_another_models_files_are_not_used(tmp_path: Path) -> None:
    spill(tier(tmp_path), TOKENS)
    stranger = tier(tmp_path, fingerprint="0" * 64)
    assert stranger.longest(TOKENS) is None


def test_the_tier_is_bounded_in_bytes(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    spill(disk, TOKENS)
    size = disk.statistics().bytes
    bounded = tier(tmp_path / "bounded", max_bytes=2 * size + size // 2)
    for k in range(4):
        spill(bounded, tuple(range(k * 100, k * 100 + len(TOKENS))))
    stats = bounded.statistics()
    assert stats.entries == 2 and stats.bytes <= bounded.max_bytes and len(files(tmp_path / "bounded")) == 2
    assert bounded.longest(tuple(range(300, 348))) is not None and bounded.longest(tuple(range(0, 48))) is None


def test_a_write_that_fails_is_counted_not_raised(tmp_path: Path) -> None:
    disk = tier(tmp_path / "gone")
    (tmp_path / "gone").rmdir()
    spill(disk, TOKENS)
    assert disk.statistics().spill_errors == 1 and disk.longest(TOKENS) is None


def test_a_layout_the_format_cannot_take_is_not_spilled(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    cache = kv(len(TOKENS))
    cache[0].keys = cache[0].keys[:, :, ::2, :]  # strided: not contiguous
    outbox: list[SpillJob] = []
    DiskLink(disk, outbox, restore_layer).spill(Entry(tokens=TOKENS, cache=cache, prompt_len=1))
    assert outbox == []


def test_a_folder_replaced_by_a_file_fails_the_spill_quietly(tmp_path: Path) -> None:
    """Issue 10 repro 4: cleaning up after a failed write raised too; now the write is counted as an error."""
    disk = tier(tmp_path / "kv")
    (tmp_path / "kv").rmdir()
    (tmp_path / "kv").write_text("not a folder")
    spill(disk, TOKENS)
    stats = disk.statistics()
    assert (stats.spill_errors, stats.spills, stats.entries) == (1, 0, 0)


@pytest.mark.parametrize("restored", ["folder-made-again", "file-removed-only"])
def test_writes_resume_and_stats_count_the_disk_once_the_folder_is_back(tmp_path: Path, restored: str) -> None:
    """Issue 22 item 8: the folder was replaced by a file, then restored; spill_errors kept rising, nothing was
    written again, and /stats counted six entries of an empty folder. Now a failed write rebuilds the index from
    what is there, and the next write finds the folder usable again (making the model's folder if only it is gone)."""
    root = tmp_path / "kv"
    disk = tier(root)
    for k in range(3):
        spill(disk, tuple(range(k * 100, k * 100 + len(TOKENS))))
    assert disk.statistics().entries == 3
    for path in files(root):
        path.unlink()
    root.rmdir()
    root.write_text("not a folder")
    spill(disk, TOKENS)
    spill(disk, TOKENS)
    stats = disk.statistics()
    assert (stats.spill_errors, stats.entries, stats.bytes) == (2, 0, 0)
    assert disk.longest(tuple(range(0, 48))) is None
    root.unlink()
    if restored == "folder-made-again":
        root.mkdir()
    spill(disk, TOKENS)
    stats = disk.statistics()
    assert (stats.spill_errors, stats.spills, stats.entries) == (2, 4, 1)
    assert len(files(root)) == 1 and stats.bytes == files(root)[0].stat().st_size
    assert restore(disk, TOKENS) is not None


def test_a_rescan_finds_what_another_hand_put_back(tmp_path: Path) -> None:
    """After a failure the index is what the folder holds: files moved back in are served again."""
    root, aside = tmp_path / "kv", tmp_path / "aside"
    disk = tier(root)
    spill(disk, TOKENS)
    root.rename(aside)
    spill(disk, tuple(range(0, 48)))  # fails: the folder is gone
    assert disk.statistics().entries == 0
    aside.rename(root)
    spill(disk, tuple(range(1000, 1048)))
    assert disk.statistics().entries == 2 and restore(disk, TOKENS) is not None
