"""Model work besides generation: tokenizing, embeddings and relevance scores.

Tokenizing runs in the preparation threads under the tokenize reservation
(the one chat rendering takes for generation, so `/tokenize`,
`/v1/messages/count_tokens` and prompts share one bound). Embeddings and
scores tokenize the same way, then run on the model thread between decode
steps through the exclusive queue (`stages/exclusive.py`).

A score is the chat model's judgement: the judgement prompt below through
its template, then P(yes) / (P(yes) + P(no)) for the answer's first token
(the first token of each word where a vocabulary splits them; a model whose
two words start alike cannot score, and says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import json
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import attrs

from pipeline.errors import invalid
from pipeline.model_work import EmbeddingRequest, Embeddings, Input, ScoreRequest, Scores, TokenizeRequest
from pipeline.requests import ChatRequest, GenerationParams, Message, Role, Sampling
from stages.chat import render_chat_text
from stages.embed import EmbedWork, Pooling, ScoreWork
from stages.exclusive import ExclusiveQueue
from stages.families.base import Family
from stages.messages import PromptText
from stages.models.loading import ModelInfo, Tokenizer
from stages.prepare import Reservation, encode_bounded
from stages.tokenize import PIECE_CHARS, BoundedEncoder

T = TypeVar("T")
_JUDGE = 'Judge whether the Document meets the requirements based on the Query provided. Note that the answer can only be "yes" or "no".'


@attrs.define
class ModelWork:
    _queue: ExclusiveQueue = attrs.field(alias="queue")
    _tokenizer: Tokenizer = attrs.field(alias="tokenizer")
    _encoder: BoundedEncoder = attrs.field(alias="encoder")
    _reservation: Reservation = attrs.field(alias="reservation")
    _info: ModelInfo = attrs.field(alias="info")
    _preamble: Family | None = attrs.field(alias="preamble")
    _pooling: Pooling = attrs.field(alias="pooling")
    # Tokens one embedding input may have.
    _max_input_tokens: int = attrs.field(alias="max_input_tokens")
    # The embeddings' width (the model's hidden size), from its config.
    _hidden_size: int | None = attrs.field(alias="hidden_size")

    # -- tokenizing ---------------------------------------------------------

    async def tokenize_chat(self, request: ChatRequest, *, add_special_tokens: bool = False) -> list[int]:
        """A chat's prompt tokens, rendered as generation renders it.

        Raises:
            RequestError: the template refused the conversation, or the
                prompt is past the context window (counting stops there).
        """
        render = partial(render_chat_text, self._tokenizer, request, preamble=self._preamble)
        async with self._reservation.slots:
            text = await anyio.to_thread.run_sync(render, limiter=self._reservation.threads)
        window = self._info.context_window
        tokens = await encode_bounded(
            self._encoder, PromptText(text.text, add_special_tokens), self._reservation, at_most=window
        )
        if tokens is None:
            raise invalid(f"prompt is too long: more than {window} tokens, this model's maximum", param="messages",
                          code="context_length_exceeded")  # fmt: skip
        return tokens

    async def tokenize(self, request: TokenizeRequest) -> tuple[list[int], list[str] | None]:
        """Tokens for /tokenize, and each token's text when asked.

        Raises:
            RequestError: past the context window, or a template refusal.
        """
        if request.chat is not None:
            tokens = await self.tokenize_chat(request.chat, add_special_tokens=request.add_special_tokens)
        else:
            assert request.prompt is not None
            tokens = await self._encode(PromptText(request.prompt, request.add_special_tokens), "prompt", self._info.context_window)
        if not request.return_token_strs:
            return tokens, None
        return tokens, await self._in_thread(lambda: [self._tokenizer.decode([token]) for token in tokens])

    async def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens`.

        Raises:
            RequestError: an id outside the vocabulary.
        """
        self._check_ids(tokens, "tokens")
        return await self._in_thread(lambda: self._tokenizer.decode(list(tokens)))

    # -- exclusive work -----------------------------------------------------

    async def embed(self, request: EmbeddingRequest, *, request_id: str, trace_id: str) -> Embeddings:
        """One normalized vector per input.

        Raises:
            RequestError: a bad input (naming it), `dimensions` this model
                cannot give, 429/503 from the exclusive queue.
        """
        if request.dimensions is not None and request.dimensions != self._hidden_size:
            raise invalid(
                f"'dimensions' is not supported by this model: its embeddings have {self._hidden_size} dimensions",
                param="dimensions",
            )
        inputs = await self._inputs(request.inputs)
        work = EmbedWork(inputs=inputs, pooling=self._pooling)
        vectors = await self._queue.submit(work, kind="embed", request_id=request_id, trace_id=trace_id)
        return Embeddings(vectors=tuple(tuple(float(x) for x in vector) for vector in vectors), prompt_tokens=sum(map(len, inputs)))

    async def score(self, request: ScoreRequest, *, request_id: str, trace_id: str) -> Scores:
        """A relevance score in [0, 1] for each (query, document) pair.

        Raises:
            RequestError: this model cannot judge, a pair past the window, 429/503.
        """
        yes, no = self._answer_ids()
        inputs = [await self.tokenize_chat(_judgement(query, document)) for query, document in request.pairs]
        work = ScoreWork(inputs=inputs, yes=yes, no=no)
        scores = await self._queue.submit(work, kind="score", request_id=request_id, trace_id=trace_id)
        return Scores(scores=tuple(scores), prompt_tokens=sum(map(len, inputs)))

    def _answer_ids(self) -> tuple[int, int]:
        yes, no = (self._tokenizer.encode(word, add_special_tokens=False) for word in ("yes", "no"))
        if not yes or not no or yes[0] == no[0]:
            raise invalid(f"The model '{self._info.name}' cannot score: its vocabulary does not tell 'yes' from 'no' in one token",
                          param="model", code="model_not_supported")  # fmt: skip
        return yes[0], no[0]

    async def _inputs(self, inputs: Sequence[Input]) -> list[tuple[int, ...]]:
        # Short texts are encoded together in one thread call; a long one in bounded pieces.
        short = [i for i, item in enumerate(inputs) if isinstance(item, str) and len(item) <= PIECE_CHARS]
        encoded = await self._in_thread(lambda: [self._tokenizer.encode(str(inputs[i])) for i in short])
        tokens: dict[int, tuple[int, ...]] = dict(zip(short, map(tuple, encoded)))
        for i, item in enumerate(inputs):
            param = "input" if len(inputs) == 1 else f"input[{i}]"
            if isinstance(item, tuple):
                self._check_ids(item, param)
                tokens[i] = item
            elif i not in tokens:
                tokens[i] = tuple(await self._encode(PromptText(item, add_special_tokens=True), param, self._max_input_tokens))
            if len(tokens[i]) > self._max_input_tokens:
                raise self._too_long(param)
        return [tokens[i] for i in range(len(inputs))]

    async def _encode(self, prompt: PromptText, param: str, limit: int) -> list[int]:
        tokens = await encode_bounded(self._encoder, prompt, self._reservation, at_most=limit)
        if tokens is None:
            raise self._too_long(param, limit)
        return tokens

    def _too_long(self, param: str, limit: int | None = None) -> Exception:
        limit = self._max_input_tokens if limit is None else limit
        return invalid(f"'{param}' is too long: more than {limit} tokens, this model's maximum", param=param,
                       code="context_length_exceeded")  # fmt: skip

    def _check_ids(self, tokens: Sequence[int], param: str) -> None:
        vocab = self._info.vocab_size
        for token in tokens:
            if token >= vocab:
                raise invalid(f"'{param}' holds token id {token}, outside this model's vocabulary of {vocab}", param=param)

    async def _in_thread(self, call: Callable[[], T]) -> T:
        async with self._reservation.slots:
            return await anyio.to_thread.run_sync(call, limiter=self._reservation.threads)


def hidden_size(path: Path) -> int | None:
    """The width of the model's hidden states (its embeddings), from its config."""
    config = json.loads((path / "config.json").read_text())
    size = config.get("hidden_size", config.get("text_config", {}).get("hidden_size"))
    return size if isinstance(size, int) else None


def _judgement(query: str, document: str) -> ChatRequest:
    messages = (
        Message(role=Role.SYSTEM, content=_JUDGE),
        Message(role=Role.USER, content=f"<Query>: {query}\n<Document>: {document}"),
    )
    # Thinking off: the answer's first token is the judgement itself.
    return ChatRequest(messages=messages, params=GenerationParams(max_tokens=1, sampling=Sampling()), template_kwargs={"enable_thinking": False})
