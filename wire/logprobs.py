"""Token logprobs in OpenAI's two shapes: chat's and the legacy completions one.

Chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}], "refusal": null}`.
Completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}`.
Both are None when the request did not ask for logprobs (no `Logprobs` events).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.events import CompletionEvent, Logprobs, TokenLogprob
from pipeline.requests import JsonObject, JsonValue


def chat_logprobs(events: Sequence[CompletionEvent]) -> JsonObject | None:
    scored = [event for event in events if isinstance(event, Logprobs)]
    if not scored:
        return None
    content: list[JsonValue] = [
        {**_entry(chosen), "top_logprobs": [_entry(alt) for alt in top]}
        for event in scored
        for chosen, top in zip(event.chosen, event.top, strict=True)
    ]
    return {"content": content, "refusal": None}


def legacy_logprobs(events: Sequence[CompletionEvent], offset: int) -> tuple[JsonObject | None, int]:
    """The completions shape, with text offsets counted from `offset`; and the offset after it."""
    scored = [event for event in events if isinstance(event, Logprobs)]
    if not scored:
        return None, offset
    tokens: list[JsonValue] = []
    token_logprobs: list[JsonValue] = []
    top_logprobs: list[JsonValue] = []
    offsets: list[JsonValue] = []
    for event in scored:
        for chosen, top in zip(event.chosen, event.top, strict=True):
            tokens.append(chosen.token)
            token_logprobs.append(chosen.logprob)
            top_logprobs.append({alt.token: alt.logprob for alt in top})
            offsets.append(offset)
            offset += len(chosen.token)
    body: JsonObject = {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }
    return body, offset


def _entry(scored: TokenLogprob) -> JsonObject:
    return {"token": scored.token, "logprob": scored.logprob, "bytes": list(scored.bytes)}
