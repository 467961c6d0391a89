"""`/v1/models` with several models: every configured model's card, with its state and defaults.

As vLLM's cards do, an alias or an adapter names what it stands for
(`root`) and the model it runs on (`parent`). Each card also carries the
model's state (unloaded, loading, ready, unloading, failed), as LM
Studio's model list does, and the defaults a request gets (the models
file's over the model's generation_config.json, once loaded).
"""

from __future__ import annotations

from fleet.fleet import Fleet
from fleet.host import ModelHost
from pipeline.requests import JsonObject
from stages.engine.speech import SpeechEngine


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
    if host.error:
        status["error"] = host.error
    if host.engine is not None:
        window = host.engine.info.context_window
        status.update(context_window=window, max_model_len=window)
        if isinstance(host.engine, SpeechEngine):
            # What it serves: /v1/audio/transcriptions and /v1/audio/translations, not chat.
            status["type"] = "speech-to-text"
    return status


def _root(host: ModelHost, asked: str) -> str:
    """An alias stands for its model; an adapter or an embedding model for itself."""
    return host.name if asked in host.spec.aliases else asked
