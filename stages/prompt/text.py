"""Text completions: a raw prompt → a tokenizing job for the preparation executor.

The parse stage calls `TextJobs` with each parsed `TextRequest`; the job's
`tokenize` encodes the prompt (or checks its ids) in a preparation thread.
Owns: the tokenizer reference and the model's vocabulary size.
On error: token ids outside the vocabulary (in the job), or a `suffix` for a
model that cannot fill in the middle (`stages/prompt/fim.py`, at once), fail
that reply (400).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs

from pipeline.errors import invalid
from pipeline.requests import TextRequest
from stages.messages import Parsed, PrepareJob, PrepKind, PromptText
from stages.models.loading import Tokenizer
from stages.prompt.fim import Infill, refuse_suffix

# The most token ids a prompt's check runs on the loop for (a longer list is checked in a preparation thread).
INLINE_IDS = 4_096


@attrs.frozen
class TextJobs:
    _vocab_size: int = attrs.field(alias="vocab_size")
    # The model's fill-in-the-middle format; None when it has none.
    _infill: Infill | None = attrs.field(default=None, alias="infill")

    def job(self, parsed: Parsed, request: TextRequest) -> PrepareJob:
        """The job that tokenizes `request`'s prompt in a preparation thread.

        Raises:
            RequestError: a `suffix` for a model that cannot fill in the middle.
        """
        tokenize: Callable[[], list[int] | PromptText] = partial(prompt_of, self._vocab_size, request.prompt)
        params = request.params
        if request.suffix is not None:
            if self._infill is None:
                raise refuse_suffix()
            prompt, params = self._infill.request_prompt(request)
            tokenize = partial(_as_is, prompt)
            request = attrs.evolve(request, params=params)
        return PrepareJob(
            request_id=parsed.request_id,
            kind=PrepKind.TOKENIZE,
            tokenize=tokenize,
            request=request,
            params=params,
            reply=parsed.reply,
            timeline=parsed.timeline,
            # Text needs no render, and checking a few thousand ids costs less than a thread's hand-off.
            inline=not isinstance(request.prompt, tuple) or len(request.prompt) <= INLINE_IDS,
        )


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
