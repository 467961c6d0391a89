"""A follower rank's whole life: join, load this rank's slice, replay rank 0's steps, stop when it says so.

`mlx-relay serve --shard …` runs this instead of the HTTP server on every
rank but 0 (mlx_relay.py). It reads the same settings (the model, the
shard mode); everything that shapes the batch comes from rank 0. It lives
in the engine's room, beside the start-up decisions it shares with rank 0
(`decisions.py`'s disk tier for this rank's slice), and above the replay in
`stages/shard/`: the engine imports that room, so that room imports nothing
of the engine's.
"""

from __future__ import annotations

from functools import partial

import structlog

from pipeline.logs import configure_logging
from pipeline.settings import Settings
from stages.models.loading import resolve_model

log = structlog.get_logger(stage="follower")


def serve_follower(settings: Settings) -> int:
    from stages.engine import decisions
    from stages.shard.cluster import join
    from stages.shard.follower import Follower

    assert settings.shard is not None
    configure_logging(settings.log_level, settings.log_format)
    cluster = join(settings.shard, timeout=settings.shard_timeout)
    info = resolve_model(settings.model, demo=settings.demo_model, name=settings.model_name)
    model = cluster.load(info.path)
    beating = cluster.beating

    def on_step(steps: int) -> None:
        if beating is not None:
            beating.steps = steps

    open_disk = partial(decisions.open_disk, settings, info.path, cluster, float32=cluster.float32_weights)
    doorbell = beating.wait_for_ring if beating is not None else None
    Follower(model, cluster.group, on_step=on_step, open_disk=open_disk, doorbell=doorbell).run()
    log.info("follower.exit", rank=cluster.rank)
    return 0
