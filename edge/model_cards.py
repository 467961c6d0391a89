"""`/v1/models` with several models: every configured model's card, with its state and defaults.

As vLLM's cards do, an alias or an adapter names what it stands for
(`root`) and the model it runs on (`parent`). Each card also carries the
model's state (unloaded, loading, ready, unloading, failed), as LM
Studio's model list does, while it loads how far (`loading`: its phase and
seconds, fleet/model_host.py's `progress`), the defaults a request gets (the models
file's over the model's generation_config.json, once loaded), once loaded
with a `ttl`, the seconds before it unloads unless used (`ttl_left`), and,
once loaded, what it reads (`input_modalities`: text, image, audio).
"""

from __future__ import annotations

import functools
from pathlib import Path

from fleet.fleet import Fleet
from fleet.model_host import ModelHost, State
from pipeline.requests import JsonObject, JsonValue
from stages.engine.speech import SpeechEngine
from stages.models.builtin import BUILTIN_MODELS
from stages.models.tiny_vl import NAME as TINY_VL
from stages.models.vlm import vision_config
from stages.models.whisper import TINY_WHISPER, is_speech_model


def fleet_cards(fleet: Fleet) -> list[JsonObject]:
    return [card(fleet, asked) for asked in fleet.known_names()]


def card(fleet: Fleet, asked: str) -> JsonObject:
    """The card of one name a client may ask by (KeyError for another)."""
    host = fleet.hosts[fleet.known_names()[asked]]
    body: JsonObject = {"id": asked, "object": "model", "created": 0, "owned_by": "mlx-relay", **_status(host)}
    if asked != host.name:
        body.update(root=_root(host, asked), parent=host.name)
    return body


def _status(host: ModelHost) -> JsonObject:
    status: JsonObject = {
        "state": host.state.value,
        "pinned": host.spec.pinned,
        "ttl": host.spec.ttl,
        "defaults": host.defaults.shown(),
    }
    if host.state is State.READY and host.spec.ttl and not host.spec.pinned:
        status["ttl_left"] = round(host.ttl_left(host.spec.ttl), 1)
    if host.error:
        status["error"] = host.error
    if (progress := host.progress()) is not None:
        status["loading"] = progress
    if host.engine is None:
        status.update(_reads_unloaded(host.spec.source or host.name))
    else:
        window = host.engine.info.context_window
        status.update(context_window=window, max_model_len=window)
        if isinstance(host.engine, SpeechEngine):
            # What it serves: /v1/audio/transcriptions and /v1/audio/translations, not chat.
            status["type"] = "speech-to-text"
            status["input_modalities"] = ["audio"]
        else:
            status["input_modalities"] = input_modalities(host.engine.work.vision is not None)
    return status


@functools.cache
def _reads_unloaded(source: str) -> JsonObject:
    """What a model not loaded yet reads, where its name or its directory's small config says (the chat page
    offers images or a microphone by it); nothing for a repository id, which only a load resolves."""
    if source in BUILTIN_MODELS:
        speech, vision = source == TINY_WHISPER, source == TINY_VL
    else:
        path = Path(source).expanduser()
        if not path.is_dir():
            return {}
        speech, vision = is_speech_model(path), vision_config(path) is not None
    if speech:
        return {"type": "speech-to-text", "input_modalities": ["audio"]}
    return {"input_modalities": input_modalities(vision)}


def input_modalities(vision: bool) -> list[JsonValue]:
    """What a chat model reads, as OpenRouter's cards name it: the chat page offers images only where "image" is."""
    return ["text", "image"] if vision else ["text"]


def _root(host: ModelHost, asked: str) -> str:
    """An alias stands for its model; an adapter or an embedding model for itself."""
    return host.name if asked in host.spec.aliases else asked
