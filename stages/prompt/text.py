"""Text stage: a raw prompt → a tokenizing job for the preparation executor.

Inbox: `Parsed` carrying a `TextRequest`.
Outbox: `PrepareJob` whose `tokenize` encodes the prompt (or checks ids).
Owns: the tokenizer reference and the model's vocabulary size.
On cancel: a request whose reply is closed is dropped.
On error: token ids outside the vocabulary, or a `suffix` for a model that
cannot fill in the middle (`stages/prompt/fim.py`), fail that reply (400).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import anyio
import attrs
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from pipeline.actor import serve_items
from pipeline.errors import invalid
from pipeline.requests import TextRequest
from stages.messages import Parsed, PrepareJob, PrepKind, PromptText
from stages.models.loading import Tokenizer
from stages.prompt.fim import Infill, refuse_suffix


@attrs.define
class TextStage:
    _inbox: MemoryObjectReceiveStream[Parsed] = attrs.field(alias="inbox")
    _out: MemoryObjectSendStream[PrepareJob] = attrs.field(alias="out")
    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")
    _vocab_size: int = attrs.field(alias="vocab_size")
    # The model's fill-in-the-middle format; None when it has none.
    _infill: Infill | None = attrs.field(default=None, alias="infill")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with self._inbox, self._out:
            task_status.started()
            await serve_items(self._inbox, self._on_parsed, stage="text")

    async def _on_parsed(self, parsed: Parsed) -> None:
        request = parsed.request
        if not isinstance(request, TextRequest):
            return
        tokenize: Callable[[], list[int] | PromptText] = partial(prompt_of, self._vocab_size, request.prompt)
        params = request.params
        if request.suffix is not None:
            if self._infill is None:
                raise refuse_suffix()
            prompt, params = self._infill.request_prompt(request)
            tokenize = partial(_as_is, prompt)
            request = attrs.evolve(request, params=params)
        job = PrepareJob(
            request_id=parsed.request_id,
            kind=PrepKind.TOKENIZE,
            tokenize=tokenize,
            request=request,
            params=params,
            reply=parsed.reply,
            timeline=parsed.timeline,
        )
        await self._out.send(job)


def encode_prompt(tokenizer: Tokenizer, vocab_size: int, prompt: str | tuple[int, ...]) -> list[int]:
    """Prompt tokens for a text completion, in one piece.

    Raises:
        RequestError: a token id is outside the model's vocabulary.
    """
    checked = prompt_of(vocab_size, prompt)
    return checked if isinstance(checked, list) else tokenizer.encode(checked.text)


def prompt_of(vocab_size: int, prompt: str | tuple[int, ...]) -> list[int] | PromptText:
    """A text completion's prompt: its checked token ids, or its text to tokenize.

    Raises:
        RequestError: a token id is outside the model's vocabulary.
    """
    if isinstance(prompt, str):
        return PromptText(prompt, add_special_tokens=True)
    for token in prompt:
        if not 0 <= token < vocab_size:
            raise invalid(f"Token id {token} is outside the vocabulary (0..{vocab_size - 1})", param="prompt")
    return list(prompt)


def _as_is(prompt: PromptText) -> PromptText:
    return prompt
