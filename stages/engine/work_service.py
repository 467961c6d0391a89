"""Model work besides generation: tokenizing, embeddings and relevance scores.

Tokenizing runs in the preparation threads under the tokenize reservation
(the one chat rendering takes for generation, so `/tokenize`,
`/v1/messages/count_tokens` and prompts share one bound). Embeddings and
scores tokenize the same way, then run on the model thread between decode
steps through the exclusive queue (`stages/model_thread/exclusive.py`).

A score is the model's judgement: Qwen3-Reranker's prompt (its model
card's system line and `<Instruct>: …\n<Query>: …\n<Document>: …` user
turn, through the model's template with thinking off, which for a Qwen3
template is the card's prefix and suffix exactly), then P(yes) / (P(yes) +
P(no)) for the answer's first token: softmax over the two logits, what
vLLM computes for Qwen3-Reranker (sigmoid of yes minus no). A vocabulary
that splits the words takes each one's first token; a model whose two
words start alike cannot score, and says so. A dedicated embedding model
with sentence-transformers files scores by cosine similarity of the two
texts' embeddings instead, as vLLM scores with an embedding model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
import attrs
import numpy as np

from pipeline.errors import invalid
from pipeline.requests import ChatRequest, GenerationParams, Message, Role, Sampling
from pipeline.settings import Settings
from pipeline.work_requests import EmbeddingRequest, Embeddings, Input, ScoreRequest, Scores, TokenizeRequest
from stages.families.base import Family
from stages.messages import PromptText
from stages.model_thread.embed import EmbedWork, LoadWork, Pooling, ScoreWork, SideModel
from stages.model_thread.exclusive import ExclusiveQueue
from stages.models.embedding import Matryoshka, allowed_dimensions, load_embedding_weights, read_embedding_model
from stages.models.loading import ModelInfo, Tokenizer, load_tokenizer
from stages.prompt.chat import render_chat_text
from stages.prompt.prepare import Reservation, encode_bounded
from stages.prompt.tokenize import PIECE_CHARS, BoundedEncoder
from stages.prompt.vision_chat import VisionPrompt

T = TypeVar("T")
# Qwen3-Reranker's system line and default instruction, from its model card.
_JUDGE = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
    'Note that the answer can only be "yes" or "no".'
)
_INSTRUCT = "Given a web search query, retrieve relevant passages that answer the query"
ScoreBy = Literal["judge", "cosine"]
Vector = np.ndarray[Any, Any]


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
    # A dedicated model beside the chat model; None: the chat model the gateway runs.
    _side: SideModel | None = attrs.field(default=None, alias="side")
    _matryoshka: Matryoshka | None = attrs.field(default=None, alias="matryoshka")
    _score_by: ScoreBy = attrs.field(default="judge", alias="score_by")
    # Tokens one request may run through the model, summed over its inputs (OpenAI's embeddings bound: 300,000).
    _max_request_tokens: int = attrs.field(default=300_000, alias="max_request_tokens")
    # A vision-language model's image side (stages/prompt/vision_chat.py); None: a text model.
    vision: VisionPrompt | None = None

    @property
    def name(self) -> str:
        """The served id of the model this work runs on."""
        return self._info.name

    @property
    def context_window(self) -> int:
        return self._info.context_window

    @property
    def side(self) -> SideModel | None:
        """The dedicated model this work runs on; None: the chat model."""
        return self._side

    def preload(self) -> None:
        """Queue the dedicated model's loading, so the model thread loads it before the first request."""
        if self._side is not None:
            self._queue.queue_unawaited(LoadWork(self._side), kind="load")

    # -- tokenizing ---------------------------------------------------------

    async def tokenize_chat(self, request: ChatRequest, *, add_special_tokens: bool = False) -> list[int]:
        """A chat's prompt tokens, rendered as generation renders it.

        Raises:
            RequestError: the template refused the conversation, or the
                prompt is past the context window (counting stops there).
        """
        if self.vision is not None:
            # Images are counted as the model reads them: each one's run of image tokens.
            vision = partial(self.vision.render, self._tokenizer, request, preamble=self._preamble)
            async with self._reservation.slots:
                return (await anyio.to_thread.run_sync(vision, limiter=self._reservation.threads)).tokens
        render = partial(render_chat_text, self._tokenizer, request, preamble=self._preamble)
        async with self._reservation.slots:
            text = await anyio.to_thread.run_sync(render, limiter=self._reservation.threads)
        window = self._info.context_window
        tokens = await encode_bounded(
            self._encoder, PromptText(text.text, add_special_tokens), self._reservation, at_most=window
        )
        if tokens is None:
            raise invalid(
                f"prompt is too long: more than {window} tokens, this model's maximum",
                param="messages",
                code="context_length_exceeded",
            )
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
            tokens = await self._encode(
                PromptText(request.prompt, request.add_special_tokens), "prompt", self._info.context_window
            )
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
        dimensions = request.dimensions
        width = self._hidden_size or 0
        if dimensions is not None and (reason := allowed_dimensions(self._matryoshka, dimensions, width)) is not None:
            raise invalid(f"'dimensions' {dimensions} is not supported: {reason}", param="dimensions")
        self._bound_request(sum(map(self._min_tokens, request.inputs)), "input")
        inputs = await self._inputs(request.inputs)
        self._bound_request(sum(map(len, inputs)), "input")
        vectors = await self._vectors(inputs, None if dimensions == width else dimensions, request_id, trace_id)
        # `tolist` converts in C: a Python loop over a batch's floats holds the GIL the model thread needs.
        return Embeddings(
            vectors=tuple(tuple(vector.tolist()) for vector in vectors), prompt_tokens=sum(map(len, inputs))
        )

    async def _vectors(
        self, inputs: Sequence[Sequence[int]], dimensions: int | None, request_id: str, trace_id: str
    ) -> list[Vector]:
        work = EmbedWork(inputs=inputs, pooling=self._pooling, dimensions=dimensions, side=self._side)
        vectors: list[Vector] = await self._queue.submit(
            work, kind="embed", request_id=request_id, trace_id=trace_id, rate_key=self.name
        )
        return vectors

    async def score(self, request: ScoreRequest, *, request_id: str, trace_id: str) -> Scores:
        """A relevance score in [0, 1] for each (query, document) pair.

        Raises:
            RequestError: this model cannot judge, a pair past the window, 429/503.
        """
        if self._score_by == "cosine":
            return await self._cosine(request, request_id=request_id, trace_id=trace_id)
        yes, no = self._answer_ids()
        self._bound_request(sum(self._min_tokens(text) for pair in request.pairs for text in pair), None)
        inputs = [await self.tokenize_chat(_judgement(query, document)) for query, document in request.pairs]
        self._bound_request(sum(map(len, inputs)), None)
        work = ScoreWork(inputs=inputs, yes=yes, no=no, side=self._side)
        scores = await self._queue.submit(
            work, kind="score", request_id=request_id, trace_id=trace_id, rate_key=self.name
        )
        return Scores(scores=tuple(scores), prompt_tokens=sum(map(len, inputs)))

    async def _cosine(self, request: ScoreRequest, *, request_id: str, trace_id: str) -> Scores:
        texts = list(dict.fromkeys(text for pair in request.pairs for text in pair))
        self._bound_request(sum(map(self._min_tokens, texts)), None)
        inputs = await self._inputs(texts)
        self._bound_request(sum(map(len, inputs)), None)
        vectors = dict(zip(texts, await self._vectors(inputs, None, request_id, trace_id)))
        # Unit vectors: the dot product is the cosine.
        scores = tuple(float(np.dot(vectors[q], vectors[d])) for q, d in request.pairs)
        return Scores(scores=scores, prompt_tokens=sum(map(len, inputs)))

    def _min_tokens(self, item: Input) -> int:
        """At least as many tokens as `item` has, known without tokenizing it."""
        return len(item) if isinstance(item, tuple) else self._encoder.min_tokens(PromptText(item, False))

    def _bound_request(self, tokens: int, param: str | None) -> None:
        """Refuse a request whose inputs add up past the bound, before its work is queued (checked first
        with a lower bound, so a request far past it is refused before it is tokenized)."""
        if tokens > self._max_request_tokens:
            message = f"Requested {tokens} tokens, max {self._max_request_tokens} tokens per request"
            raise invalid(f"{message} (MLX_RELAY_EXCLUSIVE_MAX_TOKENS)", param=param, code="max_tokens_per_request")

    def _answer_ids(self) -> tuple[int, int]:
        yes, no = (self._tokenizer.encode(word, add_special_tokens=False) for word in ("yes", "no"))
        if not yes or not no or yes[0] == no[0]:
            raise invalid(
                f"The model '{self._info.name}' cannot score: "
                "its vocabulary does not tell 'yes' from 'no' in one token",
                param="model",
                code="model_not_supported",
            )
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
                tokens[i] = tuple(
                    await self._encode(PromptText(item, add_special_tokens=True), param, self._max_input_tokens)
                )
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
        return invalid(
            f"'{param}' is too long: more than {limit} tokens, this model's maximum",
            param=param,
            code="context_length_exceeded",
        )

    def _check_ids(self, tokens: Sequence[int], param: str) -> None:
        vocab = self._info.vocab_size
        for token in tokens:
            if token >= vocab:
                raise invalid(
                    f"'{param}' holds token id {token}, outside this model's vocabulary of {vocab}", param=param
                )

    async def _in_thread(self, call: Callable[[], T]) -> T:
        async with self._reservation.slots:
            return await anyio.to_thread.run_sync(call, limiter=self._reservation.threads)


def chat_model_work(
    settings: Settings,
    queue: ExclusiveQueue,
    info: ModelInfo,
    encoder: BoundedEncoder,
    reservation: Reservation,
    preamble: Family | None,
    vision: VisionPrompt | None = None,
) -> ModelWork:
    """The chat model's own embeddings and scores (its last hidden states); reads its config, so off the loop."""
    return ModelWork(
        queue=queue,
        tokenizer=encoder.tokenizer,
        encoder=encoder,
        reservation=reservation,
        info=info,
        preamble=preamble,
        pooling="last" if settings.embedding_pooling == "last" else "mean",
        max_input_tokens=min(settings.embedding_max_tokens, info.context_window),
        hidden_size=hidden_size(info.path),
        max_request_tokens=settings.exclusive_max_tokens,
        vision=vision,
    )


def dedicated_work(settings: Settings, queue: ExclusiveQueue, reservation: Reservation) -> tuple[ModelWork, int]:
    """The work of `settings.embedding_model`, and its weights' bytes; off the loop and off the model thread.

    Raises:
        EmbeddingModelError: a model that cannot be served as an embedding model (stages/models/embedding.py).
    """
    assert settings.embedding_model is not None
    spec = read_embedding_model(
        settings.embedding_model,
        fallback="last" if settings.embedding_model_pooling == "last" else "mean",
        matryoshka=settings.embedding_matryoshka,
    )
    tokenizer = load_tokenizer(spec.info)
    sentence_transformers = (spec.info.path / "modules.json").is_file()
    score_by: ScoreBy = (
        "judge"
        if settings.embedding_score == "judge" or (settings.embedding_score is None and not sentence_transformers)
        else "cosine"
    )
    work = ModelWork(
        queue=queue,
        tokenizer=tokenizer,
        encoder=BoundedEncoder.of(tokenizer),
        reservation=reservation,
        info=spec.info,
        preamble=None,
        pooling=spec.pooling,
        max_input_tokens=min(settings.embedding_max_tokens, spec.info.context_window),
        hidden_size=spec.hidden_size,
        side=SideModel(load=partial(load_embedding_weights, spec)),
        matryoshka=spec.matryoshka,
        score_by=score_by,
        max_request_tokens=settings.exclusive_max_tokens,
    )
    return work, spec.nbytes


def open_embedder(
    settings: Settings, queue: ExclusiveQueue, reservation: Reservation, *, chat: str, sharded: bool
) -> tuple[ModelWork | None, int]:
    """`dedicated_work` when an embedding model is set, refused where it cannot be served; (None, 0) when none is.

    Raises:
        ValueError: under --shard, or served under the chat model's id.
    """
    if settings.embedding_model is None:
        return None, 0
    if sharded:
        raise ValueError(
            "MLX_RELAY_EMBEDDING_MODEL cannot be served with --shard (exclusive work runs on one process only)"
        )
    work, nbytes = dedicated_work(settings, queue, reservation)
    if work.name == chat:
        raise ValueError(f"MLX_RELAY_EMBEDDING_MODEL is served as {work.name!r}, the chat model's id too")
    return work, nbytes


def hidden_size(path: Path) -> int | None:
    """The width of the model's hidden states (its embeddings), from its config."""
    config = json.loads((path / "config.json").read_text())
    size = config.get("hidden_size", config.get("text_config", {}).get("hidden_size"))
    return size if isinstance(size, int) else None


def _judgement(query: str, document: str) -> ChatRequest:
    messages = (
        Message(role=Role.SYSTEM, content=_JUDGE),
        Message(role=Role.USER, content=f"<Instruct>: {_INSTRUCT}\n<Query>: {query}\n<Document>: {document}"),
    )
    # Thinking off: the answer's first token is the judgement itself.
    return ChatRequest(
        messages=messages,
        params=GenerationParams(max_tokens=1, sampling=Sampling()),
        template_kwargs={"enable_thinking": False},
    )
