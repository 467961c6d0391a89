"""Jump-forward (stages/model_thread/jump_forward.py) on the tiny demo model: a grammar's forced tokens are taken in
one verifying pass, and the tokens are those of step-by-step decoding.

Each case runs the same rows through mlx-lm's `BatchGenerator` (a step a
token) and through the gateway's generator with jump-forward on: a forced
call (`tool_choice` naming a function) in every family's markup, rendered
by the family's real template (tests/families.py); a JSON-schema reply
beside rows without a grammar, greedy and seeded, with and without a
drafter; a forced call beside a drafter whose guesses the grammar's
state must judge; on the single-row path and in the batch. Every row's
tokens, finish and final cache must agree, the grammar rows must take fewer
steps, and forced tokens must have been taken, so a jump-forward that never
ran cannot pass.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import attrs
import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator

from pipeline.requests import (
    ChatRequest,
    Constraint,
    ConstraintKind,
    GenerationParams,
    Message,
    Role,
    Sampling,
    Tool,
    ToolChoice,
    ToolChoiceMode,
)
from stages.families import choose_family
from stages.model_thread.drafters import CostGate, PromptLookup, RowPolicy
from stages.model_thread.jump_forward import MAX_FORCED, JumpForward, forced_limit, grammar_of
from stages.model_thread.sampling import RowStops, make_row_processors, make_row_sampler
from stages.model_thread.single_row import SingleRow, single_row
from stages.model_thread.speculative_batch import Speculation, speculating
from stages.models.loading import ModelInfo, Tokenizer, load_tokenizer, load_weights, resolve_model
from stages.prompt.chat import render_chat
from stages.prompt.constraint_choice import constraint_of
from stages.prompt.constraints import ConstraintCompiler
from tests.families import CASES, FamilyCase

GREEDY = Sampling(temperature=0.0)
SEEDED = Sampling(temperature=0.7, seed=3)
WEATHER = Tool(
    name="get_weather",
    description="Weather in a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}, "unit": {"const": "celsius"}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "kind": {"const": "thing"},
        "count": {"type": "integer", "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 2},
    },
    "required": ["name", "kind", "count", "tags"],
    "additionalProperties": False,
}
# A prompt that repeats itself: prompt lookup has something to copy for the free rows.
COPY = [*range(3, 30), *range(3, 30), *range(3, 12)]


@attrs.frozen
class Arrival:
    name: str
    prompt: list[int]
    sampling: Sampling = GREEDY
    max_tokens: int = 48
    compiled: Any = None
    # The call before which the row is inserted.
    at: int = 0
    # The tokens that end it: its model's EOS.
    stops: tuple[int, ...] = (0, 2)


def drive(generator: Any, arrivals: Sequence[Arrival]) -> dict[str, dict[str, Any]]:
    """Each row's tokens, finish, final cache and steps (calls that gave it a token), its grammar a fresh matcher."""
    rows: dict[int, dict[str, Any]] = {}
    call = 0
    while call <= max(a.at for a in arrivals) or any(row["finish"] is None for row in rows.values()):
        for arrival in (a for a in arrivals if a.at == call):
            matcher = arrival.compiled.matcher() if arrival.compiled is not None else None
            (uid,) = generator.insert(
                [arrival.prompt],
                max_tokens=[arrival.max_tokens],
                caches=None,
                all_tokens=[[]],
                samplers=[make_row_sampler(arrival.sampling)],
                logits_processors=[make_row_processors(arrival.sampling, arrival.max_tokens, matcher)],
                stop_sequences=[RowStops([[token] for token in arrival.stops])],
            )
            rows[uid] = {"name": arrival.name, "tokens": [], "finish": None, "steps": 0}
        stepped: set[int] = set()
        for response in generator.next()[1]:
            row = rows[response.uid]
            assert row["finish"] is None, "a token after the row finished"
            row["tokens"].append(response.token)
            row["finish"] = response.finish_reason
            if response.uid not in stepped:
                stepped.add(response.uid)
                row["steps"] += 1
            if response.finish_reason is not None:
                row["cache"], row["all_tokens"] = response.prompt_cache, response.all_tokens
        call += 1
        assert call < 500
    return {row["name"]: row for row in rows.values()}


def _plain(model: Any) -> BatchGenerator:
    return BatchGenerator(
        model, stop_tokens=[[0], [2]], completion_batch_size=4, prefill_batch_size=4, prefill_step_size=16
    )


def _jumping(model: Any, *, drafter: Any = None) -> tuple[Any, Speculation]:
    """The gateway's generator with jump-forward (and `drafter`, if any): the single-row path over the batch."""
    policy = RowPolicy(max_k=4, min_acceptance=0.0, max_rows=8)
    speculation = Speculation(drafter=drafter, policy=policy, gate=CostGate(measured=False), jump_forward=JumpForward())
    batch = speculating(lambda: _plain(model), speculation)
    make = single_row(
        batch, enabled=True, model=model, stop_tokens=[[0], [2]], prefill_step_size=16, speculation=speculation
    )
    return make(), speculation


def _same(expected: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]]) -> None:
    assert expected.keys() == got.keys()
    for name, want in expected.items():
        have = got[name]
        assert have["tokens"] == want["tokens"], name
        assert have["finish"] == want["finish"], name
        # The finished row's cache holds exactly its tokens: no rejected forced token is left in it.
        assert have["all_tokens"] == want["all_tokens"], name
        layer, kept = have["cache"][0], want["cache"][0]
        assert layer.offset == kept.offset == len(have["all_tokens"]), name
        keys = layer.keys[..., : layer.offset, :]
        assert mx.allclose(keys, kept.keys[..., : kept.offset, :], atol=1e-4).item(), name


@pytest.fixture(scope="module")
def model(model_info: ModelInfo) -> Any:
    return load_weights(model_info)


@pytest.fixture(scope="module")
def schema(model_info: ModelInfo) -> Any:
    tokenizer = load_tokenizer(model_info)
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()))  # type: ignore[attr-defined]
    return compiler.compile(Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=SCHEMA, param="response_format"))


@attrs.frozen
class Family:
    tokenizer: Tokenizer
    model: Any
    prompt: list[int]
    compiled: Any
    eos: tuple[int, ...]


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def family(request: pytest.FixtureRequest, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Family:
    """A family's model (tiny's weights, its template and special tokens), a chat forcing a call, and its grammar."""
    case: FamilyCase = request.param
    info = resolve_model(str(case.build(tiny_model, tmp_path_factory.mktemp(case.name))))
    tokenizer = load_tokenizer(info)
    markup = choose_family(tokenizer)
    params = GenerationParams(max_tokens=64, sampling=GREEDY)
    chat = ChatRequest(
        messages=(Message(role=Role.USER, content="Weather in Paris?"),),
        params=params,
        tools=(WEATHER,),
        tool_choice=ToolChoice(mode=ToolChoiceMode.NAMED, name="get_weather"),
    )
    constraint = constraint_of(tokenizer, markup, chat)
    assert constraint is not None
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()), family=markup)  # type: ignore[attr-defined]
    eos = tuple(sorted(tokenizer.eos_token_ids))
    return Family(tokenizer, load_weights(info), render_chat(tokenizer, chat), compiler.compile(constraint), eos)


def _saved(plain: dict[str, dict[str, Any]], jumped: dict[str, dict[str, Any]], names: Sequence[str]) -> None:
    for name in names:
        assert jumped[name]["steps"] < plain[name]["steps"], name


@pytest.mark.parametrize("alone", [True, False], ids=["single_row", "batch"])
def test_a_forced_call_takes_fewer_steps_and_the_same_tokens(family: Family, alone: bool) -> None:
    """Alone on the single-row path, and in the batch beside a row without a grammar."""
    call = Arrival("call", family.prompt, max_tokens=64, compiled=family.compiled, stops=family.eos)
    arrivals = [call] if alone else [call, Arrival("free", COPY, max_tokens=24, at=1)]
    plain = drive(_plain(family.model), arrivals)
    generator, speculation = _jumping(family.model)
    jumped = drive(generator, arrivals)
    _same(plain, jumped)
    _saved(plain, jumped, ["call"])
    assert isinstance(generator, SingleRow) and generator.handovers == (0 if alone else 1)
    assert speculation.jump_forward is not None and speculation.jump_forward.accepted > 0
    # A forced call's markup and name are a long forced span: most of the call is taken a span at a time.
    assert jumped["call"]["steps"] * 2 <= plain["call"]["steps"], family.tokenizer.decode(plain["call"]["tokens"])
    # Without a drafter nothing else was proposed, and the free row never proposed a token.
    assert speculation.statistics() is None and speculation.counts.proposed == 0


@attrs.define
class Oracle:
    """A drafter that knows each row's step-by-step tokens and proposes them with the last one wrong, 2, 3, 4
    then 1 in turn: a row under a grammar takes a guess at a free place (a value, a name) and the target's own
    token lands after it, at every kind of place the grammar has (a token it names by id, `<[N]>`, among them)."""

    rows: list[list[int]]
    name: str = "oracle"
    caught_up: int = 0
    _sizes: Iterator[int] = attrs.field(factory=lambda: itertools.cycle((2, 3, 4, 1)), init=False)

    def propose(self, uid: int, history: Sequence[int], k: int) -> list[int]:
        size = min(k, next(self._sizes))
        for row in self.rows:
            if len(row) > len(history) and row[: len(history)] == list(history):
                right = row[len(history) : len(history) + size]
                return [*right[:-1], right[-1] + 1]
        return []

    def propose_many(self, requests: Sequence[tuple[int, Sequence[int], int]]) -> list[list[int]]:
        return [self.propose(*request) for request in requests]

    def forget(self, uids: Sequence[int]) -> None:
        pass


@pytest.mark.parametrize("alone", [True, False], ids=["single_row", "batch"])
def test_a_forced_call_takes_a_drafters_guesses_with_the_same_tokens(family: Family, alone: bool) -> None:
    """Issue #37's leftover: a drafter beside a forced call (Qwen3-Coder's failed mid-call with "token '>' doesn't
    satisfy the grammar"). Each guessed position is masked by the grammar's state after the accepted prefix."""
    call = Arrival("call", family.prompt, max_tokens=64, compiled=family.compiled, stops=family.eos)
    arrivals = [call] if alone else [call, Arrival("free", COPY, max_tokens=24, at=1)]
    plain = drive(_plain(family.model), arrivals)
    drafter = Oracle([[*arrival.prompt, *plain[arrival.name]["tokens"]] for arrival in arrivals])
    generator, speculation = _jumping(family.model, drafter=drafter)
    _same(plain, drive(generator, arrivals))
    assert speculation.jump_forward is not None and speculation.jump_forward.accepted > 0
    # The call row took the drafter's guesses too: not its forced spans alone.
    assert speculation.counts.accepted > 0 and speculation.counts.accepted < speculation.counts.proposed


def _walked(compiled: Any, tokens: Sequence[int], *, vocabulary: int, ahead: bool) -> list[mx.array]:
    """The masks a row's grammar gives along `tokens`; `ahead`: each token is first read by `forced_after` (the
    verifying pass's pending token), then preempted and resumed (`rewind`) after its call."""
    processor = grammar_of(make_row_processors(GREEDY, 64, compiled.matcher()))
    assert processor is not None
    logits = mx.zeros((1, vocabulary))
    masks = [processor(mx.array([0]), logits)]
    for calls, token in enumerate(tokens, start=1):
        if ahead:
            processor.forced_after(token, MAX_FORCED)
        masks.append(processor(mx.array([token]), logits))
        if ahead:
            processor.rewind(calls)
            assert mx.array_equal(processor(mx.array([token]), logits), masks[-1]).item()
    assert processor.fault is None, processor.fault
    return masks


def test_a_grammar_reads_a_token_ahead_and_rewinds_without_rolling_back(family: Family) -> None:
    """The masks along a forced call are a step a token's, whatever was read ahead or rewound: llguidance's
    rollback is not exact after a token the grammar names by id (Qwen3-Coder's `>` and newline)."""
    tokens = drive(_plain(family.model), [Arrival("call", family.prompt, compiled=family.compiled)])["call"]["tokens"]
    vocabulary = len(family.tokenizer.get_vocab())  # type: ignore[attr-defined]
    plain = _walked(family.compiled, tokens[:-1], vocabulary=vocabulary, ahead=False)
    ahead = _walked(family.compiled, tokens[:-1], vocabulary=vocabulary, ahead=True)
    assert all(mx.array_equal(want, have).item() for want, have in zip(plain, ahead, strict=True))


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("drafter", [None, "prompt_lookup"])
def test_json_schema_rows_beside_free_rows(model: Any, schema: Any, sampling: Sampling, drafter: str | None) -> None:
    """Grammar rows and free rows share the verifying pass; with a drafter, its tokens follow the forced span."""
    arrivals = [
        Arrival("json", COPY[:20], sampling, 60, schema),
        Arrival("free", COPY, sampling, 30, at=1),
        Arrival("json2", COPY[5:30], sampling, 50, schema, at=3),
    ]
    plain = drive(_plain(model), arrivals)
    generator, speculation = _jumping(model, drafter=PromptLookup() if drafter else None)
    jumped = drive(generator, arrivals)
    _same(plain, jumped)
    _saved(plain, jumped, ["json", "json2"])
    assert speculation.jump_forward is not None and speculation.jump_forward.accepted > 0
    assert drafter is None or speculation.counts.proposed > 0


def test_a_lone_json_reply_with_a_drafter(model: Any, schema: Any) -> None:
    arrivals = [Arrival("json", COPY[:20], GREEDY, 60, schema)]
    plain = drive(_plain(model), arrivals)
    generator, speculation = _jumping(model, drafter=PromptLookup())
    jumped = drive(generator, arrivals)
    _same(plain, jumped)
    _saved(plain, jumped, ["json"])
    assert speculation.jump_forward is not None and speculation.jump_forward.accepted > 0


@pytest.mark.parametrize("max_tokens", [3, 9, 14])
def test_max_tokens_ends_a_row_inside_a_forced_span(family: Family, max_tokens: int) -> None:
    arrivals = [Arrival("call", family.prompt, max_tokens=max_tokens, compiled=family.compiled, stops=family.eos)]
    for beside in ([], [Arrival("free", COPY, max_tokens=24, at=1)]):
        plain = drive(_plain(family.model), [*arrivals, *beside])
        jumped = drive(_jumping(family.model)[0], [*arrivals, *beside])
        _same(plain, jumped)
        assert jumped["call"]["finish"] == "length" and len(jumped["call"]["tokens"]) == max_tokens


def test_forced_after_holds_the_pending_token_for_the_next_call(schema: Any) -> None:
    """The grammar's forced span after the pending token, which the matcher takes and the next call brings."""
    processor = grammar_of(make_row_processors(GREEDY, 60, schema.matcher()))
    assert processor is not None
    logits = mx.zeros((1, 1024))
    # Before the first call no token was sampled under the grammar.
    assert processor.forced_after(5, 8) == []
    first = mx.array(processor(mx.array([7]), logits))
    # A token the grammar forbids here is not taken, and leaves no error behind.
    forced = processor.forced_after(cast(int, mx.argmin(first[0]).item()), 8)
    # `{` opens every object of this schema; then `"name"` and its colon are forced.
    brace = cast(int, mx.argmax(first[0]).item())
    spans = [processor.forced_after(brace, limit) for limit in (1, 8, 32)]
    assert forced == [] and len(spans[0]) == 1 and spans[1][:1] == spans[0] and len(spans[2]) >= len(spans[1]) > 1
    # The next call brings `brace`, taken once: it masks as a fresh matcher would.
    fresh = grammar_of(make_row_processors(GREEDY, 60, schema.matcher()))
    assert fresh is not None
    fresh(mx.array([7]), logits)
    after, expected = processor(mx.array([7, brace]), logits), fresh(mx.array([7, brace]), logits)
    assert mx.array_equal(after, expected).item()


def test_the_forced_span_shrinks_as_the_batch_grows() -> None:
    assert forced_limit(1) == forced_limit(4) == 32
    assert forced_limit(16) == 8 and forced_limit(1000) == 2
