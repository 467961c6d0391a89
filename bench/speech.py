"""Speech to text on `tiny-whisper`: its real-time factor, and a chat model's streams while transcriptions run.

    python -m bench.speech [--chat demo] [--streams 4] [--rounds 3] [--seconds 10] [--in-process]

One server serves both models (MLX_RELAY_MODEL=<chat>,tiny-whisper; each
in its worker process unless `--in-process`). First the
real-time factor: wall seconds per second of audio for a clip of
`--seconds` (speech-like, made with numpy), transcribed alone. Then rounds
of `--streams` streaming chats, each round once alone and once while
transcriptions run back to back beside them: the figure is the p95 gap
between a stream's chunks with transcriptions running against alone (rounds
alternate, so a machine whose load drifts weighs on both sides). A random
model's transcripts are arbitrary, and so is how many windows it decodes:
the factor is of this model, not of a real Whisper. Writes bench/out/speech.json.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.fleet import _gaps, _quantiles
from bench.load import chunk_arrivals
from bench.servers import free_port, relay_command, started
from tests.speech_clips import clip

OUT = Path(__file__).resolve().parent / "out"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.speech", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chat", default="demo", help="the chat model that streams")
    parser.add_argument("--streams", type=int, default=4, help="concurrent streams")
    parser.add_argument("--max-tokens", type=int, default=200, help="tokens per stream")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each alone then beside transcriptions")
    parser.add_argument("--seconds", type=float, default=10.0, help="the clip's length")
    parser.add_argument("--repeats", type=int, default=3, help="transcriptions timed for the real-time factor")
    parser.add_argument("--in-process", action="store_true", help="both models in the HTTP process")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def _transcribe(url: str, audio: bytes) -> float:
    began = time.perf_counter()
    response = httpx.post(
        f"{url}/v1/audio/transcriptions",
        files={"file": ("clip.wav", audio, "audio/wav")},
        data={"model": "tiny-whisper", "language": "en", "temperature": "0.2"},
        timeout=3600,
    )
    response.raise_for_status()
    return time.perf_counter() - began


def _round(url: str, args: argparse.Namespace, audio: bytes, *, beside: bool) -> tuple[list[float], int]:
    stop = threading.Event()
    done: list[float] = []

    def transcriptions() -> None:
        while not stop.is_set():
            done.append(_transcribe(url, audio))

    thread = threading.Thread(target=transcriptions) if beside else None
    if thread is not None:
        thread.start()
        time.sleep(0.5)  # the first transcription is running when the streams start
    with ThreadPoolExecutor(args.streams) as pool:
        futures = [
            pool.submit(chunk_arrivals, url, args.chat, i, args.max_tokens, {"seed": i}) for i in range(args.streams)
        ]
        streams = [future.result() for future in futures]
    stop.set()
    if thread is not None:
        thread.join()
    return [gap for arrivals in streams for gap in _gaps(arrivals)], len(done)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_")}
    env["MLX_RELAY_MODEL"] = f"{args.chat},tiny-whisper"
    if args.in_process:
        env["MLX_RELAY_IN_PROCESS"] = "1"
    audio = clip("WAV", seconds=args.seconds)
    alone: list[float] = []
    beside: list[float] = []
    transcribed = 0
    with started("relay-speech", relay_command(port), port, env, args.out / "logs") as server:
        _round(server.url, argparse.Namespace(**{**vars(args), "streams": 1, "max_tokens": 8}), audio, beside=False)
        _transcribe(server.url, clip("WAV", seconds=1.0))  # loads the speech model
        seconds = sorted(_transcribe(server.url, audio) for _ in range(args.repeats))
        for _ in range(args.rounds):
            alone += _round(server.url, args, audio, beside=False)[0]
            gaps, count = _round(server.url, args, audio, beside=True)
            beside += gaps
            transcribed += count
    factor = seconds[len(seconds) // 2] / args.seconds
    result: dict[str, Any] = {
        "chat": args.chat,
        "in_process": args.in_process,
        "clip_seconds": args.seconds,
        "transcription_seconds": [round(value, 3) for value in seconds],
        "real_time_factor": round(factor, 3),
        "streams": args.streams,
        "rounds": args.rounds,
        "transcriptions_beside": transcribed,
        "gaps_alone_ms": _quantiles(alone),
        "gaps_beside_transcriptions_ms": _quantiles(beside),
    }
    rise = result["gaps_beside_transcriptions_ms"]["p95"] / result["gaps_alone_ms"]["p95"] - 1
    result["p95_rise"] = round(rise, 3)
    print(
        f"tiny-whisper: {args.seconds:g} s of audio in {seconds[len(seconds) // 2]:.2f} s (real-time factor "
        f"{factor:.2f}); {args.streams} streams on {args.chat}, p95 gap {result['gaps_alone_ms']['p95']} ms alone, "
        f"{result['gaps_beside_transcriptions_ms']['p95']} ms beside {transcribed} transcriptions ({rise:+.0%})"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speech.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
