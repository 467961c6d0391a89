"""stages/shard/caches.py on one rank: a follower's disk tier spills what it is told, votes on a restore, and serves
only what was agreed.

The group is MLX's own group of one (no launcher): its `all_sum` is the
real collective, so a vote here is this rank's vote. The two-rank paths,
where one rank's no outvotes another's yes, run in tests/e2e/test_shard_tiers.py.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generation_stream

from pipeline.settings import Settings
from stages.cache.link import DiskLink
from stages.cache.prompt import PromptCache
from stages.cache.tier import Entry
from stages.engine.decisions import open_disk
from stages.models.mlx_internals import restore_layer
from stages.shard.caches import FollowerDisk
from stages.shard.cluster import Cluster
from stages.shard.transport import Broadcast
from tests.stages.cache.test_prompt_cache import kv
from tests.stages.cache.test_prompt_cache_disk import spill, tier

TOKENS = tuple(range(500, 620))


@pytest.fixture
def channel() -> Broadcast:
    return Broadcast(mx.distributed.init(), generation_stream)


def entry(tokens: tuple[int, ...]) -> Entry:
    cache = kv(len(tokens))
    mx.eval([layer.state for layer in cache])
    return Entry(tokens=tokens, cache=cache, prompt_len=len(tokens))


def follower_cache(root: Path) -> tuple[PromptCache, FollowerDisk]:
    disk = FollowerDisk(DiskLink(tier(root), [], restore_layer))
    cache = PromptCache(max_bytes=2**62)
    cache.attach(disk)
    return cache, disk


def test_a_dropped_entry_rank_0_spilled_is_written_and_a_restore_is_agreed_then_served(
    tmp_path: Path, channel: Broadcast
) -> None:
    cache, disk = follower_cache(tmp_path)
    cache.store(entry(TOKENS))
    cache.drop(TOKENS, spill=True)
    assert cache.keys() == set()
    # The vote waits for the queued write: the file is there to read.
    disk.vote(TOKENS, channel)
    disk.decision = (TOKENS, len(TOKENS))
    hit = cache.fetch([*TOKENS, 7])
    assert hit is not None and hit.tokens == len(TOKENS) and hit.source == TOKENS
    assert cache.keys() == {TOKENS}
    disk.close()


def test_a_copy_that_does_not_check_out_is_voted_down_deleted_and_not_served(
    tmp_path: Path, channel: Broadcast
) -> None:
    cache, disk = follower_cache(tmp_path)
    cache.store(entry(TOKENS))
    cache.drop(TOKENS, spill=True)
    disk.close()  # every write done
    (path,) = tmp_path.glob("*.safetensors")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    disk.vote(TOKENS, channel)
    assert not path.exists() and disk.link.disk.longest(TOKENS) is None
    disk.decision = (TOKENS, len(TOKENS))
    assert cache.fetch([*TOKENS, 7]) is None


def test_an_entry_dropped_without_a_spill_stays_off_disk(tmp_path: Path) -> None:
    cache, disk = follower_cache(tmp_path)
    cache.store(entry(TOKENS))
    cache.drop(TOKENS)
    disk.close()
    assert list(tmp_path.glob("*.safetensors")) == []


def test_each_rank_has_a_folder_and_a_fingerprint_of_its_own(tmp_path: Path, tiny_model: Path) -> None:
    """One process's files and a rank's slice never serve each other, even in one cache folder."""
    settings = Settings(cache_dir=str(tmp_path))
    cluster = Cluster(group=mx.distributed.init(), mode="tensor", heartbeats=None, beating=None, backend_sockets=[])
    whole, piece = open_disk(settings, tiny_model, None), open_disk(settings, tiny_model, cluster)
    assert whole is not None and piece is not None
    assert piece.root == whole.root / "tensor-rank0-of-1" and piece.fingerprint != whole.fingerprint
    whole.scan()
    spill(whole, TOKENS)
    piece.scan()
    assert piece.longest(TOKENS) is None
    # The slice's folder inside the model's is not one of its files either.
    whole.scan()
    assert whole.longest(TOKENS) == (TOKENS, len(TOKENS))
