"""Built-once model directories: a cache root and an atomic publish.

The project builds its own model directories (the random-weight demo
models, SmolLM2 converted from GGUF) the first time they are asked for and
keeps them under one cache root. A build is written into a temporary
sibling and renamed into place, so a directory exists only when complete;
racing builders all succeed and one build is kept.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

# Overrides the default cache root, ~/.cache/mlx-relay.
CACHE_ENV = "MLX_RELAY_DEMO_CACHE"


def default_cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "mlx-relay"


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`target`, first built by `build(staging_dir)` if it does not exist.

    Raises:
        OSError: the cache root cannot be written.
        Whatever `build` raises; its staging directory is removed.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        _publish(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _publish(staging: Path, target: Path) -> None:
    staging.chmod(0o755)
    try:
        os.rename(staging, target)
    except OSError:
        # A racing builder renamed its complete build into place first.
        if not target.is_dir():
            raise
