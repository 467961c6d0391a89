"""The speech model's worker killed in a chat + speech fleet: its transcription fails alone, chat goes on.

A private `tiny,tiny-whisper` server with the prompt cache off, so a chat stream run twice is computed the same way
twice. kill -9 of the speech worker while a long transcription runs in it and a greedy `tiny` stream runs in its own
worker: the transcription fails with 503 `worker_lost` in OpenAI's error shape, the stream ends with the text it had
before the kill, and the next transcription is served by a new worker. The chat helpers are
tests/e2e/test_fleet_worker_kill.py's.
"""

from __future__ import annotations

import io
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import openai
import pytest
import soundfile

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.test_fleet_worker_kill import Stream, run_all
from tests.speech_clips import clip, speechlike

pytestmark = pytest.mark.slow

CHAT, SPEECH = "tiny", "tiny-whisper"
# Long enough to be still running after the transcription beside it is admitted and its first token is seen.
CHAT_TOKENS = 1000
# Ten 30-second windows with word timing and Whisper's temperature fallback (a random model's windows decode badly
# and are decoded again warmer): seconds of work on any machine, still running when the stream beside it starts and
# the worker is killed. The kill fails it at once, so its length costs the test nothing; its audio is a 10-second
# clip over and over, since making 300 seconds of it costs seconds of CPU.
LONG_SECONDS = 300


def speech_engine(server: Server) -> dict[str, Any]:
    """The speech model's engine figures as `/stats` reports them (its worker's state, pid and restarts in it)."""
    report = loopback.get(f"{server.base_url}/stats", timeout=10).json()["models"][f"mlx-relay/{SPEECH}"]["engine"]
    assert isinstance(report, dict) and isinstance(report["worker"], dict), report
    return report


def chat_pid(server: Server) -> object:
    return loopback.get(f"{server.base_url}/health", timeout=10).json()["models"][f"mlx-relay/{CHAT}"]["pid"]


def short_clip() -> tuple[str, bytes, str]:
    return ("clip.wav", clip("WAV", seconds=1.0), "audio/wav")


def transcribe_long(server: Server, failures: list[openai.APIStatusError]) -> None:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.tile(speechlike(10.0), LONG_SECONDS // 10), 16_000, format="WAV", subtype="PCM_16")
    audio = ("long.wav", buffer.getvalue(), "audio/wav")
    try:
        server.client(timeout=120).audio.transcriptions.create(
            file=audio, model=SPEECH, response_format="verbose_json", timestamp_granularities=["word"]
        )
    except openai.APIStatusError as error:
        failures.append(error)


def test_kill_9_of_the_speech_worker_fails_its_transcription_alone(server_factory: ServerFactory) -> None:
    server = server_factory(
        private=True, model=f"{CHAT},{SPEECH}", worker_restart_backoff="0.05", prompt_cache_bytes="0"
    )
    client = server.client(timeout=120)
    assert isinstance(client.audio.transcriptions.create(file=short_clip(), model=SPEECH, temperature=0.2).text, str)
    # The reference: the same greedy stream, alone, before the kill.
    before = Stream(CHAT, CHAT_TOKENS)
    run_all(server, [before])
    assert before.error is None and before.finish == "length" and before.text, before
    worker, chat_worker = speech_engine(server)["worker"], chat_pid(server)
    assert isinstance(worker, dict) and worker["state"] == "ready" and isinstance(worker["pid"], int), worker
    assert worker["pid"] not in (chat_worker, server.process.pid)

    failures: list[openai.APIStatusError] = []
    long_one = threading.Thread(target=transcribe_long, args=(server, failures), daemon=True)
    long_one.start()
    deadline = time.monotonic() + 30
    while speech_engine(server)["admission"]["in_flight"] < 1:
        assert time.monotonic() < deadline and long_one.is_alive(), ("never admitted", failures)
        time.sleep(0.02)
    chat = Stream(CHAT, CHAT_TOKENS)
    streaming = threading.Thread(target=run_all, args=(server, [chat]), daemon=True)
    streaming.start()
    assert chat.started.wait(60) and chat.arrivals, chat.error
    assert long_one.is_alive(), "the transcription ended before the kill"
    killed_at = time.monotonic()
    os.kill(worker["pid"], signal.SIGKILL)
    long_one.join(60)
    streaming.join(120)
    assert not long_one.is_alive() and not streaming.is_alive()

    (failure,) = failures
    assert failure.status_code == 503 and failure.code == "worker_lost", failure
    body = failure.response.json()["error"]
    assert set(body) >= {"message", "type", "param", "code"} and body["type"], body
    assert chat.error is None, chat.error
    assert [t for t in chat.arrivals if t > killed_at], "the chat stream was still running at the kill"
    assert chat.text == before.text and chat.finish == "length"
    assert chat_pid(server) == chat_worker

    after = client.audio.transcriptions.create(
        file=short_clip(), model=SPEECH, response_format="verbose_json", temperature=0.2
    )
    assert after.duration == pytest.approx(1.0)
    restarted = speech_engine(server)["worker"]
    assert isinstance(restarted, dict) and restarted["state"] == "ready", restarted
    assert restarted["pid"] not in (worker["pid"], None) and restarted["restarts"] == 1, restarted
    # /health lists the speech model's worker as it lists a chat model's.
    health = loopback.get(f"{server.base_url}/health", timeout=10).json()["models"][f"mlx-relay/{SPEECH}"]
    assert (health["pid"], health["restarts"]) == (restarted["pid"], 1), health

    # Unloaded while a transcription runs in its worker: the transcription fails with 503 at once, never waits
    # on a worker that is gone, and the worker ends.
    failures.clear()
    long_two = threading.Thread(target=transcribe_long, args=(server, failures), daemon=True)
    long_two.start()
    deadline = time.monotonic() + 30
    while speech_engine(server)["admission"]["in_flight"] < 1:
        assert time.monotonic() < deadline and long_two.is_alive(), ("never admitted", failures)
        time.sleep(0.02)
    unloaded = loopback.post(f"{server.base_url}/admin/models/{SPEECH}/unload", json={}, timeout=30)
    assert unloaded.status_code == 200, unloaded.text
    long_two.join(30)
    assert not long_two.is_alive()
    (stopped,) = failures
    assert stopped.status_code == 503 and stopped.code == "shutting_down", stopped
    with pytest.raises(ProcessLookupError):
        os.kill(restarted["pid"], 0)
