"""vLLM / llama.cpp extension fields of Chat Completions and Completions.

Those the server honours (`min_tokens`, `ignore_eos`, `stop_token_ids`,
`typical_p`; `skip_special_tokens` with the sampling fields) are read here; every other extension that would change the
output is refused by name unless it holds its neutral value, so none is
ever accepted and then ignored.
"""

from __future__ import annotations

from pipeline.errors import invalid, unsupported
from pipeline.requests import JsonValue
from wire.field_reads import Body, as_list, read_bool, read_int, read_number

# A generous bound on stop ids; a longer list is a mistake, not a request.
_MAX_STOP_TOKEN_IDS = 256

# Extensions that would change the output, with the value that leaves it as
# it is (None: only absent is neutral).
REFUSED: dict[str, JsonValue] = {
    "chat_template": None,
    "prompt_logprobs": None,
    "draft_model": None,
    "guided_decoding_backend": None,
    "include_stop_str_in_output": False,
    "spaces_between_special_tokens": True,
    "truncate_prompt_tokens": None,
    "add_generation_prompt": True,
    "use_beam_search": False,
    "length_penalty": 1.0,
    "bad_words": [],
    "allowed_token_ids": None,
    "logits_processors": None,
    "return_tokens_as_token_ids": False,
    "structural_tag": None,
    "mirostat": 0,
    "n_probs": 0,
    "tfs_z": 1.0,
    "dynatemp_range": 0,
    "xtc_probability": 0,
    "dry_multiplier": 0,
    "grammar": None,
    "json_schema": None,
}


def refuse_extensions(body: Body) -> None:
    continuing = body.get("continue_final_message") is True
    for key, neutral in REFUSED.items():
        value = body.get(key)
        # A continued message has no generation prompt: vLLM asks for both flags together.
        if key == "add_generation_prompt" and continuing and value is False:
            continue
        if value is not None and value != neutral:
            raise unsupported(key)


def read_min_tokens(body: Body) -> int:
    return read_int(body, "min_tokens", minimum=0) or 0


def read_ignore_eos(body: Body) -> bool:
    return read_bool(body, "ignore_eos") is True


def read_typical_p(body: Body) -> float:
    value = read_number(body, "typical_p", minimum=0, maximum=1)
    if value == 0:
        # No mass keeps no token: nothing could be sampled.
        raise invalid("'typical_p' must be greater than 0", param="typical_p")
    return 1.0 if value is None else value


def read_stop_token_ids(body: Body) -> tuple[int, ...]:
    """Token ids that end the completion; the vocabulary bound is checked once the model is known."""
    raw = body.get("stop_token_ids")
    if raw is None:
        return ()
    items = as_list(raw, "stop_token_ids")
    if len(items) > _MAX_STOP_TOKEN_IDS:
        raise invalid(f"'stop_token_ids' may hold at most {_MAX_STOP_TOKEN_IDS} ids", param="stop_token_ids")
    ids = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise invalid("'stop_token_ids' must be an array of non-negative token ids", param="stop_token_ids")
        ids.append(item)
    return tuple(dict.fromkeys(ids))
