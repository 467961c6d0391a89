"""pipeline/loop_library.py: the loop's thread names its library to sniffio, on asyncio and on trio alike."""

from __future__ import annotations

import asyncio
import os

import anyio
import sniffio

from pipeline.loop_library import named_async_library


async def test_the_library_running_is_named_while_the_block_runs_and_the_old_name_comes_back(
    anyio_backend_name: str,
) -> None:
    before = sniffio.thread_local.name
    with named_async_library():
        assert sniffio.thread_local.name == anyio_backend_name
        assert sniffio.current_async_library() == anyio_backend_name
        # anyio's calls still work from the named thread, and another thread is not named by this one.
        await anyio.lowlevel.checkpoint()
        assert await anyio.to_thread.run_sync(lambda: sniffio.thread_local.name) is None
    assert sniffio.thread_local.name == before


def test_a_process_forked_from_the_named_thread_can_start_its_own_loop() -> None:
    # As the front's zygote is forked from within the lifespan, under hypercorn's asyncio.run, and a worker then
    # runs anyio.run.
    async def fork_and_run() -> int:
        with named_async_library():
            pid = os.fork()
            if pid == 0:
                status = 1  # anyio.run refused: it found a loop named in this thread
                try:
                    unnamed = sniffio.thread_local.name is None
                    anyio.run(anyio.lowlevel.checkpoint)
                    status = 0 if unnamed else 2
                finally:
                    os._exit(status)
            return os.waitpid(pid, 0)[1]

    assert os.waitstatus_to_exitcode(asyncio.run(fork_and_run())) == 0
