"""One model sharded over several hosts (mx.distributed): rank 0 serves, the others replay its steps."""

import os


def launched_rank() -> int:
    """This process's rank as the launcher set it (`mlx.launch` exports MLX_RANK for ring and JACCL)."""
    return int(os.environ.get("MLX_RANK", "0"))
