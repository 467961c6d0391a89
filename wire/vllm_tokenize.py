"""vLLM's `POST /tokenize` and `POST /detokenize`.

Tokenize takes a `prompt` (text, `add_special_tokens` true by default) or
chat `messages` (through the model's template, as generation renders them;
`add_special_tokens` false by default, since the template writes its own);
it answers `count`, `max_model_len`, `tokens` and, when asked,
`token_strs`. Detokenize takes `tokens` and answers `prompt`.
"""

from __future__ import annotations

from pipeline.errors import invalid, unsupported
from pipeline.requests import JsonObject, JsonValue
from pipeline.work_requests import DetokenizeRequest, TokenizeRequest
from wire.field_reads import as_body, read_bool, read_str
from wire.openai_requests import decode_chat

_PROMPT_KNOWN = frozenset({"model", "prompt", "add_special_tokens", "return_token_strs"})
_CHAT_KNOWN = frozenset(
    {
        "model",
        "messages",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "chat_template_kwargs",
        "tools",
        "return_token_strs",
    }
)


def decode_tokenize(value: JsonValue) -> TokenizeRequest:
    body = as_body(value)
    chat = body.get("messages") is not None
    unknown = sorted(set(body) - (_CHAT_KNOWN if chat else _PROMPT_KNOWN))
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    token_strs = read_bool(body, "return_token_strs") is True
    special = read_bool(body, "add_special_tokens")
    model = read_str(body, "model")
    if not chat:
        prompt = read_str(body, "prompt")
        if prompt is None:
            raise invalid("Give 'prompt' (text) or 'messages' (a chat)", param="prompt")
        return TokenizeRequest(
            prompt=prompt, add_special_tokens=special is not False, return_token_strs=token_strs, model=model
        )
    if read_bool(body, "add_generation_prompt") is False and read_bool(body, "continue_final_message") is not True:
        raise unsupported("add_generation_prompt")
    chat_body: JsonObject = {
        key: body[key] for key in ("messages", "tools", "chat_template_kwargs", "continue_final_message") if key in body
    }
    return TokenizeRequest(
        chat=decode_chat(chat_body), add_special_tokens=special is True, return_token_strs=token_strs, model=model
    )


def decode_detokenize(value: JsonValue) -> DetokenizeRequest:
    body = as_body(value)
    unknown = sorted(set(body) - {"model", "tokens"})
    if unknown:
        raise invalid(f"Unrecognized request argument supplied: {unknown[0]}", param=unknown[0])
    tokens = body.get("tokens")
    if not isinstance(tokens, list):
        raise invalid("'tokens' must be an array of token ids", param="tokens")
    for i, token in enumerate(tokens):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise invalid(f"'tokens[{i}]' must be a non-negative integer token id", param="tokens")
    return DetokenizeRequest(tokens=tuple(t for t in tokens if isinstance(t, int)), model=read_str(body, "model"))


def tokenize_body(tokens: list[int], *, max_model_len: int, token_strs: list[str] | None) -> JsonObject:
    return {
        "count": len(tokens),
        "max_model_len": max_model_len,
        "tokens": list[JsonValue](tokens),
        "token_strs": list[JsonValue](token_strs) if token_strs is not None else None,
    }
