"""A model worker process: `python -m workers.main --socket PATH`, started by the front (stages/remote/).

It connects to the front's private socket, takes its engine's settings
from the first frame, and serves one model until the front drains it or
goes away.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import time
from typing import Any

from pipeline.collector import freeze_imports, pause_for_imports

pause_for_imports()

# Where a start's seconds go (`worker.ready` logs them): the interpreter's own start is before this line.
STARTED = time.perf_counter()
# A native crash (an import, a Metal abort) prints where the Python was to stderr, which the front keeps and
# quotes as the worker's reason (stages/remote/stderr_tail.py): a worker that dies this way has no frame to send.
faulthandler.enable()

from stages.remote.zygote import WORKER_NAME, name_process  # noqa: E402

# Its own name in ps and top, whether spawned or forked (whose command line is the front's).
name_process(WORKER_NAME)

from stages.models.blas import follow_thread_environment, preload_blas  # noqa: E402
from workers.priority import YIELD_FLAG, lower_while_loading, restore  # noqa: E402

# Before the imports, the costliest part of a start; WorkerHost goes back once the model is ready. Only when the front
# asks (other models' workers are serving beside this one): a worker alone starts at full speed.
LOADING_BASE_NICE = lower_while_loading() if YIELD_FLAG in sys.argv else None

# Before anything imports mlx: the BLAS is chosen when mlx first loads (as app.py does in the front).
preload_blas()
# A forked worker's BLAS was loaded by the front, with the front's thread count (stages/remote/zygote.py).
follow_thread_environment()

import anyio  # noqa: E402
import structlog  # noqa: E402

from pipeline.logs import configure_child_logging  # noqa: E402
from pipeline.loop_library import named_async_library  # noqa: E402
from pipeline.settings import Settings  # noqa: E402
from stages.remote.crossing import SettingsIn, ToWorker  # noqa: E402
from stages.remote.frames import FrameReader  # noqa: E402
from stages.remote.speech_crossing import SpeechSettingsIn, ToSpeechWorker  # noqa: E402
from workers.host import StartTimes, WorkerHost  # noqa: E402
from workers.speech_host import SpeechHost  # noqa: E402

IMPORTED = time.perf_counter()
freeze_imports()

log = structlog.get_logger(stage="worker")


async def _main(socket: str) -> None:
    # anyio's calls skip sniffio's sniffing from here on (pipeline/loop_library.py).
    with named_async_library():
        async with await anyio.connect_unix(socket) as stream:
            connected = time.perf_counter()
            # The first frame says which kind of worker this is: a chat model's (`SettingsIn`) or a speech model's.
            reader: FrameReader[Any] = FrameReader(stream, ToWorker | ToSpeechWorker)
            try:
                # A spare waits here, imported, until a start takes it (stages/remote/spare.py).
                first = await reader.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return  # a spare the front no longer needs
            if not isinstance(first, SettingsIn | SpeechSettingsIn):
                raise SystemExit(f"the front's first frame is {type(first).__name__}, not its settings")
            base_nice = LOADING_BASE_NICE
            if not first.yield_cpu:
                # A spare imported nicer; the model it was taken for loads alone, at full speed.
                restore(base_nice)
                base_nice = None
            settings = Settings(**first.values)
            # Its stderr is a pipe the front passes on: it writes as the front chose for its own (pipeline/logs.py).
            configure_child_logging(settings.log_level, settings.log_format)
            structlog.contextvars.bind_contextvars(worker_pid=os.getpid())
            times = StartTimes(
                imports_s=IMPORTED - STARTED, connect_s=connected - IMPORTED, waited_s=time.perf_counter() - connected
            )
            if isinstance(first, SpeechSettingsIn):
                beats = settings.worker_heartbeat_timeout / 8
                speech = SpeechHost(
                    settings=settings, info=first.info, beat_interval=beats, base_nice=base_nice, times=times
                )
                await speech.serve(stream, reader)
                log.info("worker.stopped")
                return
            host = WorkerHost(
                settings=settings,
                beat_interval=settings.worker_heartbeat_timeout / 8,
                base_nice=base_nice,
                times=times,
                start=first.start,
            )
            await host.serve(stream, reader)
        log.info("worker.stopped")


def main() -> None:
    # Ctrl-C and a SIGTERM to the process group reach the front too, which drains this worker: the worker ends
    # when the front closes its socket, never halfway through the rows the front is letting finish.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="workers.main", description=__doc__)
    parser.add_argument("--socket", required=True, help="the front's Unix socket")
    parser.add_argument(YIELD_FLAG, action="store_true", help="start nicer, until the model is ready")
    args = parser.parse_args()
    anyio.run(_main, args.socket)
    # Drained: nothing is left to run or write. mlx no longer ends the streams its threads made when the process
    # exits (ml-explore/mlx#4327 asks every thread that ran MLX to call `mx.clear_streams()` last, which a pooled
    # thread cannot), so a worker whose model thread ran could abort in the C++ destructors after a clean drain
    # ("terminate called without an active exception", SIGABRT). The worker leaves without running them.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
