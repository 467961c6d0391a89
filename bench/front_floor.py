"""The least CPU an event-loop server spends per streamed token on this machine, beside what the front spends.

    python -m bench.front_floor [--model smollm2] [--concurrency 1,16] [--rounds 3] [--loops asyncio,uvloop]
                                [--started-as hypercorn|serve]

Issue #37 asks the front for at most 0.3 ms of CPU per streamed token at N=1 and 0.10 ms at N=16. Part of
any server's cost per token is the machine's: the wake when the worker's step arrives, the read, and a send
to each client, which on loopback also delivers it and wakes the reader. The *floor* is a bare relay that
does only that: a forked "worker" writes one frame a step, at the front's own step period; the relay reads
it on an event loop and writes one SSE-sized chunk to each of N loopback TCP clients (a forked process that
reads them all). Its CPU per chunk is what no server built on that loop can go below here.

Each round first streams N completions from mlx-relay (`--max-tokens` each, `ignore_eos`) and reads its
front's CPU per streamed token from /proc, then runs the floor at the step period that round measured, so
the ratio front / floor is taken within its round. `--started-as hypercorn` runs the relay as the other
benches do, `hypercorn app:app`, whose spawned worker process polls hypercorn's shutdown event ten times a
second; `serve` runs the README's `mlx-relay serve`, one process. Linux only (/proc, fork).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from bench.servers import REPO, Server, free_port, relay_command, relay_env, serve_command, stop, wait_healthy
from bench.worker_ab import _round as front_round
from mlx_relay import loop_factory
from stages.models.demo import DEMO_MODELS

# A streamed completion chunk as the front writes it: an SSE event of about this many bytes.
_CHUNK = b"data: " + b'{"choices":[{"text":" word","index":0}]}'.ljust(140) + b"\n\n"
_FRAME_BYTES_PER_ROW = 16


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.front_floor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=2, help="requests each client sends in turn, a round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--loops", default="asyncio,uvloop", help="the event loops the floor runs on")
    parser.add_argument("--steps", type=int, default=200, help="the floor's steps a round")
    parser.add_argument("--started-as", choices=("hypercorn", "serve"), default="hypercorn")
    parser.add_argument("--out", type=Path, default=Path("bench/out/front_floor"))
    return parser


def floor_per_chunk(streams: int, period_s: float, steps: int, loop: str) -> float:
    """CPU seconds the bare relay spends per chunk written: `steps` frames `period_s` apart, one chunk to each of
    `streams` clients per frame, on `loop` ("asyncio" or "uvloop")."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(streams)
    port = listener.getsockname()[1]
    relay_end, worker_end = socket.socketpair()
    worker = _fork(lambda: _write_frames(worker_end, streams, period_s, steps), close=(listener, relay_end))
    clients = _fork(lambda: _read_streams(port, streams), close=(listener, relay_end, worker_end))
    worker_end.close()
    try:
        runner = asyncio.Runner(loop_factory=loop_factory(loop))
        with runner:
            cpu, chunks = runner.run(_relay(listener, relay_end, streams))
    finally:
        listener.close()
        for pid in (worker, clients):
            os.waitpid(pid, 0)
    return cpu / max(chunks, 1)


async def _relay(listener: socket.socket, frames: socket.socket, streams: int) -> tuple[float, int]:
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    connections = [(await loop.sock_accept(listener))[0] for _ in range(streams)]
    writers = []
    for connection in connections:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        writers.append((await asyncio.open_connection(sock=connection))[1])
    reader, frame_writer = await asyncio.open_connection(sock=frames)
    started, chunks = time.process_time(), 0
    while await reader.read(65536):
        for writer in writers:
            writer.write(_CHUNK)
            await writer.drain()
            chunks += 1
    cpu = time.process_time() - started
    for writer in (*writers, frame_writer):
        writer.close()
    return cpu, chunks


def _write_frames(end: socket.socket, streams: int, period_s: float, steps: int) -> None:
    frame = b"f" * (_FRAME_BYTES_PER_ROW * streams)
    deadline = time.monotonic()
    for _ in range(steps):
        end.sendall(frame)
        deadline += period_s
        time.sleep(max(0.0, deadline - time.monotonic()))
    end.close()


def _read_streams(port: int, streams: int) -> None:
    import selectors

    selector = selectors.DefaultSelector()
    for _ in range(streams):
        selector.register(socket.create_connection(("127.0.0.1", port)), selectors.EVENT_READ)
    while selector.get_map():
        for key, _ in selector.select():
            connection = key.fileobj
            assert isinstance(connection, socket.socket)
            if not connection.recv(65536):
                selector.unregister(connection)
                connection.close()


def _fork(body: Callable[[], None], *, close: tuple[socket.socket, ...]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            for sock in close:
                sock.close()
            body()
        finally:
            os._exit(0)
    return pid


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    loops = args.loops.split(",")
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = args.out / "relay.log"
    with log_path.open("wb") as log:
        command = relay_command(port) if args.started_as == "hypercorn" else serve_command(port)
        process = subprocess.Popen(
            command, cwd=REPO, env=relay_env(args.model, DEMO_MODELS), stdout=log, stderr=subprocess.STDOUT
        )
    server = Server("relay", f"http://127.0.0.1:{port}", process, log_path)
    try:
        wait_healthy(server)
        asyncio.run(front_round(server, 1, 10_000, argparse.Namespace(**{**vars(args), "requests": 1})))  # warm-up
        print(
            f"ms of CPU per streamed token, median of {args.rounds} rounds "
            f"({args.model}, {args.max_tokens} tokens, started as {args.started_as}):"
        )
        for level in levels:
            fronts, floors, periods = [], {loop: [] for loop in loops}, []
            for index in range(args.rounds):
                started = time.monotonic()
                tokens, front, _ = asyncio.run(front_round(server, level, index, args))
                # The step period the clients saw: each stream's tokens arrived this far apart on average.
                period = (time.monotonic() - started) / (tokens / level)
                fronts.append(front / tokens * 1000)
                periods.append(period * 1000)
                for loop in loops:
                    floors[loop].append(floor_per_chunk(level, period, args.steps, loop) * 1000)
            front_ms = statistics.median(fronts)
            line = f"N={level:<3} step {statistics.median(periods):.0f} ms: front {front_ms:.3f}"
            for loop in loops:
                floor_ms = statistics.median(floors[loop])
                line += f"; floor on {loop} {floor_ms:.3f} (front {front_ms / floor_ms:.2f}x)"
            print(line)
    finally:
        stop(process)


if __name__ == "__main__":
    main()
