"""hypercorn's configuration for the mlx-relay the benches start (bench/servers.py `relay_command`).

The app loads its model in its lifespan start-up: the time hypercorn allows it matches the benches' own
wait for /health, so a slow load on a busy machine is waited for rather than cut at hypercorn's 60 s.
"""

startup_timeout = 300.0
