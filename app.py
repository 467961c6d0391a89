"""The app `hypercorn app:app` serves (and `mlx-relay serve`, in process).

The BLAS is chosen here, before anything imports mlx, then the app is built by edge/application.py in one
import: its routes, hooks, state and lifespan live in `edge/` (docs/STYLE.md, "Thin app"). The collector is
paused while the app's modules import, and their heap frozen after (pipeline/collector.py).
"""

from __future__ import annotations

from pipeline.collector import freeze_imports, pause_for_imports

pause_for_imports()

from stages.models.blas import preload_blas  # noqa: E402

# Before anything imports mlx: the BLAS is chosen when mlx first loads.
BLAS = preload_blas()

from edge import application  # noqa: E402

app = application.build_app(__name__, blas=BLAS)
# The app is built: what the imports made lives as long as the process (pipeline/collector.py).
freeze_imports()


def start_draining() -> None:
    """Refuse new work with 503 from now on (the server has been told to stop); a no-op before the engine is up."""
    application.start_draining(app)
