"""Which model's engine a request runs on: the fleet's choice by the body's `model`, kept for the request.

A route calls `chosen(model)` around handing its request over; inside it,
`current_engine()` is that model's engine (the reply's echo, the model
list and the tokenizer routes read it), and `current_defaults()` its
per-model defaults. Outside a choice, the first configured model's engine
answers (with one model, the only one).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

from quart import g

from edge.state import app_state
from fleet.defaults import with_defaults
from fleet.fleet import Fleet
from fleet.model_host import unavailable
from fleet.spec import Defaults
from pipeline.errors import invalid
from pipeline.requests import JsonValue
from stages.engine.engine import Engine
from stages.engine.speech import SpeechEngine
from stages.messages import Decoder, ReadBody, Reply
from stages.prompt.parse import load_json


def fleet() -> Fleet:
    return app_state().running.fleet


def current_engine() -> Engine:
    """The engine chosen for this request, else the first model's.

    Raises:
        RequestError: 503 when that model is not loaded (several models, none chosen).
    """
    chosen_engine = g.get("engine")
    if chosen_engine is not None:
        return cast(Engine, chosen_engine)
    host = fleet().default
    if host.engine is None:
        raise unavailable(host, 1.0)
    return language_model(host.engine)


def language_model(engine: Engine | SpeechEngine) -> Engine:
    """`engine` when it serves a language model.

    Raises:
        RequestError: 400 `model_not_supported` naming `model` for a speech-to-text model.
    """
    if isinstance(engine, SpeechEngine):
        served = "/v1/audio/transcriptions and /v1/audio/translations only"
        message = f"The model '{engine.info.name}' is a speech-to-text model: it serves {served}"
        raise invalid(message, param="model", code="model_not_supported")
    return engine


def current_defaults() -> Defaults:
    defaults = g.get("defaults")
    return cast(Defaults, defaults) if defaults is not None else fleet().default.defaults


@asynccontextmanager
async def chosen(model: str | None) -> AsyncIterator[Engine]:
    """The engine of the model `model` names (loaded if need be), current for this request.

    Raises:
        RequestError: 404 `model_not_found`; 503 with Retry-After when it cannot be loaded now.
    """
    current = fleet()
    host = current.host_named(model)
    async with current.use(model) as engine:
        g.engine, g.defaults = language_model(engine), host.defaults
        yield g.engine


@asynccontextmanager
async def chosen_speech(model: str | None) -> AsyncIterator[SpeechEngine]:
    """The speech-to-text model `model` names (loaded if need be), held for this request.

    Raises:
        RequestError: 404 `model_not_found`; 400 `model_not_supported` for a language model; 503 as `chosen`.
    """
    async with fleet().use(model) as engine:
        if not isinstance(engine, SpeechEngine):
            message = f"The model '{engine.info.name}' is not a speech-to-text model: name one (see /v1/models)"
            raise invalid(message, param="model", code="model_not_supported")
        yield engine


async def submit_chosen(body: bytes | ReadBody, *, request_id: str, trace_id: str, decode: Decoder) -> Reply:
    """Hands a request to the model its body names, with that model's defaults: the one way a route submits
    (the generation entry, edge/generation.py; background responses; each MCP round).

    Raises:
        RequestError: as `chosen` and `model_named`, and as the engine's admission refuses.
    """
    model, body = model_named(body)
    async with chosen(model) as engine:
        return await engine.submit(
            request_id=request_id, trace_id=trace_id, body=body, decode=with_defaults(decode, current_defaults())
        )


def model_named(body: bytes | ReadBody) -> tuple[str | None, bytes | ReadBody]:
    """The body's `model`, and the body as the parse stage is then to take it.

    The body is read only when several models are served (one model answers every name), and carried as
    read, so the parse stage does not read it again.

    Raises:
        RequestError: 400 for a body that is not JSON (as the parse stage would refuse it).
    """
    if not fleet().several:
        return None, body
    read = body if isinstance(body, ReadBody) else ReadBody(load_json(body))
    return model_field(read.value), read


def model_field(value: JsonValue) -> str | None:
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) and model else None
