"""stages/model_thread/speculative_batch.py on the tiny demo model: speculation changes how fast, never what.

Each case runs the same rows through mlx-lm's `BatchGenerator` and through
one whose generation batch speculates: every row's tokens, logprobs,
finish reason and final cache must agree, greedy, seeded and with
penalties and bias, with stop tokens and max_tokens, with rows joining
mid-generation, for prompt lookup and for a draft model (the model itself,
so nearly every proposal is accepted). Each case also checks that
proposals were made and accepted, so a speculation that never ran cannot
pass.
"""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator

from pipeline.requests import Sampling
from stages.model_thread.draft_model import DraftModel
from stages.model_thread.drafters import CostGate, PromptLookup, RowPolicy
from stages.model_thread.single_row import SingleRow, single_row
from stages.model_thread.speculative_batch import Speculation, speculating
from stages.models.loading import ModelInfo, load_weights
from tests.stages.model_thread.drive import COPY, GREEDY, OTHER, PENALISED, SEEDED, drive


@pytest.fixture(scope="module")
def model(model_info: ModelInfo) -> Any:
    return load_weights(model_info)


def _batch(model: Any) -> BatchGenerator:
    return BatchGenerator(model, stop_tokens=[[0]], completion_batch_size=4, prefill_batch_size=4, prefill_step_size=16)


def _speculating(model: Any, drafter: Any, *, k: int = 4, max_rows: int = 8) -> tuple[Any, Speculation]:
    policy = RowPolicy(max_k=k, min_acceptance=0.0, max_rows=max_rows)
    speculation = Speculation(drafter=drafter, policy=policy, gate=CostGate(measured=False))
    return speculating(lambda: _batch(model), speculation)(), speculation


def _same(expected: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]]) -> None:
    assert expected.keys() == got.keys()
    for name in expected:
        want, have = expected[name], got[name]
        assert have["tokens"] == want["tokens"], name
        assert have["finish"] == want["finish"], name
        for a, b in zip(want["logprobs"], have["logprobs"]):
            assert mx.allclose(a, b, atol=1e-4).item(), name
        # The finished row's cache holds exactly the tokens it names: no rejected proposal is left in it.
        assert have["all_tokens"] == want["all_tokens"], name
        layer = have["cache"][0]
        assert layer.offset == len(have["all_tokens"]), name
        expected_keys = want["cache"][0].keys[..., : want["cache"][0].offset, :]
        assert mx.allclose(layer.keys[..., : layer.offset, :], expected_keys, atol=1e-4).item(), name


def _drafters(model: Any) -> list[Any]:
    return [PromptLookup(), DraftModel(model=model)]


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalties"])
@pytest.mark.parametrize("drafter", ["prompt_lookup", "draft_model"])
def test_one_row_gives_the_same_tokens_with_speculation(model: Any, sampling: Sampling, drafter: str) -> None:
    arrivals = {0: [("a", COPY, sampling, 48, [[0]])]}
    chosen = PromptLookup() if drafter == "prompt_lookup" else DraftModel(model=model)
    generator, speculation = _speculating(model, chosen)
    _same(drive(_batch(model), arrivals), drive(generator, arrivals))
    assert speculation.counts.proposed > 0
    # A random model's samples rarely repeat a proposal; its greedy tokens, or its own low-temperature ones, do.
    assert (
        speculation.counts.accepted > 0 or sampling is PENALISED or (sampling is SEEDED and drafter == "prompt_lookup")
    )


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalties"])
@pytest.mark.parametrize("drafter", ["prompt_lookup", "draft_model"])
def test_rows_joining_mid_generation_keep_their_tokens(model: Any, sampling: Sampling, drafter: str) -> None:
    """Rows of different lengths and acceptances share the verifying pass; each keeps its own KV."""
    arrivals = {
        0: [("a", COPY, sampling, 40, [[0]])],
        3: [("b", OTHER, sampling, 30, [[0]]), ("c", COPY[5:], sampling, 25, [[0]])],
        9: [("d", OTHER[:20] + OTHER[:20], sampling, 20, [[0]])],
    }
    chosen = PromptLookup() if drafter == "prompt_lookup" else DraftModel(model=model)
    generator, speculation = _speculating(model, chosen)
    _same(drive(_batch(model), arrivals), drive(generator, arrivals))
    assert speculation.counts.proposed > 0
    # Penalties make the target reject most proposals: the draft batch rolls rejected positions off each row.
    assert (
        speculation.counts.accepted > 0 or sampling is PENALISED or (sampling is SEEDED and drafter == "prompt_lookup")
    )
    # The draft model drafted for several rows in one forward pass (its own batch cache), rows joining and leaving it.
    assert not isinstance(chosen, DraftModel) or chosen.batched_passes > 0


def _lone(model: Any, drafter: Any) -> tuple[SingleRow, Speculation]:
    """The gateway's generator for speculation: a row alone on the single-row path, over the speculating batch."""
    policy = RowPolicy(max_k=4, min_acceptance=0.0, max_rows=8)
    speculation = Speculation(drafter=drafter, policy=policy, gate=CostGate(measured=False))
    batch = speculating(lambda: _batch(model), speculation)
    make = single_row(
        batch, enabled=True, model=model, stop_tokens=[[0]], prefill_step_size=16, speculation=speculation
    )
    generator = make()
    assert isinstance(generator, SingleRow)
    return generator, speculation


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalties"])
@pytest.mark.parametrize("drafter", ["prompt_lookup", "draft_model"])
def test_a_row_alone_speculates_on_the_single_row_path(model: Any, sampling: Sampling, drafter: str) -> None:
    """A lone row never enters the batch to speculate: it proposes, is verified and is cut back on its own cache."""
    arrivals = {0: [("a", COPY, sampling, 48, [[0]])]}
    generator, speculation = _lone(model, PromptLookup() if drafter == "prompt_lookup" else DraftModel(model=model))
    got = drive(generator, arrivals)
    _same(drive(_batch(model), arrivals), got)
    assert generator.solo_rows == 1 and generator.handovers == 0
    counts = speculation.counts
    assert counts.proposed > 0 and got["a"]["speculated"] == (counts.accepted, counts.proposed)
    assert counts.accepted > 0 or sampling is PENALISED or (sampling is SEEDED and drafter == "prompt_lookup")


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_lone_speculating_row_joins_the_batch_unchanged(model: Any, sampling: Sampling) -> None:
    arrivals = {0: [("a", COPY, sampling, 40, [[0]])], 6: [("b", OTHER, sampling, 20, [[0]])]}
    generator, _ = _lone(model, DraftModel(model=model))
    got = drive(generator, arrivals)
    _same(drive(_batch(model), arrivals), got)
    assert generator.solo_rows == 1 and generator.handovers == 1
    # What the row accepted alone is still counted when it finishes in the batch.
    assert got["a"]["speculated"] is not None and got["a"]["speculated"][1] > 0


def test_a_lone_row_ends_inside_an_accepted_proposal(model: Any) -> None:
    free = drive(_batch(model), {0: [("a", COPY, GREEDY, 40, [[0]])]})["a"]["tokens"]
    stop = next(token for token in free[4:] if token not in free[:4])
    for max_tokens, stops in ((7, [[0]]), (13, [[0]]), (40, [[0], [stop]])):
        arrivals = {0: [("a", COPY, GREEDY, max_tokens, stops)]}
        generator, speculation = _lone(model, DraftModel(model=model))
        _same(drive(_batch(model), arrivals), drive(generator, arrivals))
        assert speculation.counts.accepted > 0 and generator.handovers == 0


def test_stop_tokens_and_max_tokens_end_a_row_inside_an_accepted_proposal(model: Any) -> None:
    free = drive(_batch(model), {0: [("a", COPY, GREEDY, 40, [[0]])]})["a"]["tokens"]
    # A token the row produces after its start: the row must end on it, even where it was accepted mid-proposal.
    stop = next(token for token in free[4:] if token not in free[:4])
    for max_tokens in (7, 13, 40):
        arrivals = {
            0: [("a", COPY, GREEDY, max_tokens, [[0], [stop]])],
            2: [("b", COPY[3:], GREEDY, max_tokens, [[0]])],
        }
        generator, speculation = _speculating(model, DraftModel(model=model))
        got = drive(generator, arrivals)
        _same(drive(_batch(model), arrivals), got)
        assert got["b"]["finish"] == "length" and len(got["b"]["tokens"]) == max_tokens
        assert speculation.counts.accepted > 0


def test_above_max_rows_the_batch_decodes_without_proposals(model: Any) -> None:
    arrivals = {0: [(f"r{i}", COPY[i:], GREEDY, 12, [[0]]) for i in range(3)]}
    generator, speculation = _speculating(model, PromptLookup(), max_rows=2)
    _same(drive(_batch(model), arrivals), drive(generator, arrivals))
    assert speculation.counts.proposed == 0


def test_a_draft_model_tells_a_prefill_from_a_step(model: Any) -> None:
    """The gate must not time a step in which the draft model prefilled a row's history as a speculating step."""
    draft = DraftModel(model=model)
    first = draft.propose(0, COPY, 3)
    assert draft.caught_up == len(COPY)
    # All accepted, plus the target's next token: the draft feeds its last proposed token and that one.
    draft.propose(0, [*COPY, *first, 7], 3)
    assert draft.caught_up == 2
    proposals = draft.propose_many([(0, [*COPY, *first, 7, 9], 2), (1, OTHER, 2)])
    assert [len(p) for p in proposals] == [2, 2] and draft.caught_up > len(OTHER)
    # A new row with a prompt a row that left began with starts from its cache: one token to feed, the same proposal.
    draft.forget([0, 1])
    assert draft.propose(2, COPY, 3) == first and draft.caught_up == 1
    assert draft.propose(3, COPY, 3) == first and draft.caught_up == 1


def test_prompt_lookup_proposes_what_followed_the_latest_match() -> None:
    lookup = PromptLookup()
    assert lookup.propose(0, [1, 2, 3, 9, 1, 2, 3, 4, 5, 1, 2, 3], 3) == [4, 5, 1]
    assert lookup.propose(0, [1, 2, 3, 4], 3) == []
    assert lookup.propose(0, [7, 8, 7], 2) == [8, 7]


def test_prompt_lookup_follows_the_longest_match_not_the_latest_short_one() -> None:
    """In code a short n-gram recurs: the earlier occurrence that matches more of the tail is the one being copied."""
    lookup = PromptLookup()
    # The tail's last five tokens (5 6 7 8 9) match at the start; only its last three (7 8 9) match later.
    history = [5, 6, 7, 8, 9, 10, 11, 0, 7, 8, 9, 20, 21, 0, 5, 6, 7, 8, 9]
    assert lookup.propose(0, history, 2) == [10, 11]
    assert PromptLookup(max_ngram=3).propose(0, history, 2) == [20, 21]


def test_prompt_lookup_goes_on_copying_a_loop_past_its_end() -> None:
    """A match just behind the tail has fewer than k tokens after it: the copy overlaps itself, as a loop does."""
    lookup = PromptLookup()
    assert lookup.propose(0, [4, 5, 5, 5], 4) == [5, 5, 5, 5]
    assert lookup.propose(0, [9, 1, 2, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]
    # Three tokens follow the match in the text, then the copy goes on from the tokens it proposed.
    assert lookup.propose(0, [3, 1, 2, 3, 4, 5, 6, 1, 2, 3], 8) == [4, 5, 6, 1, 2, 3, 4, 5]


def test_the_policy_adapts_k_and_turns_a_row_off() -> None:
    policy = RowPolicy(max_k=8, min_acceptance=0.3, max_rows=4)
    # A row starts small (fresh text's first proposal is rejected) and doubles while its proposals are accepted.
    assert policy.budget(1, 1) == 2 and policy.budget(1, 5) == 0
    policy.record(1, 2, 2)
    assert policy.budget(1, 1) == 4
    policy.record(1, 4, 4)
    assert policy.budget(1, 1) == 8
    # A miss shrinks k to what was accepted and one more; each whole acceptance doubles it back, up to max_k.
    policy.record(1, 8, 0)
    assert policy.budget(1, 1) == 1
    policy.record(1, 1, 1)
    assert policy.budget(1, 1) == 2
    policy.record(1, 2, 2)
    policy.record(1, 4, 4)
    assert policy.budget(1, 1) == 8
    policy.record(1, 8, 1)
    assert policy.budget(1, 1) == 2
    for _ in range(10):
        policy.record(1, 2, 0)
    assert policy.budget(1, 1) == 0


def test_the_gate_learns_both_ways_then_takes_the_faster_and_probes_the_other() -> None:
    gate = CostGate()
    # A few steps of each way, in turns, before it chooses: the first step alone decides nothing.
    for _ in range(4):
        assert gate.speculate(2)
        gate.record(2, True, 10, 1.0)
        assert not gate.speculate(2)
        gate.record(2, False, 2, 1.0)
    # Speculating measured faster: it stays on, but a plain step is probed now and then.
    choices = [gate.speculate(2) for _ in range(100)]
    assert choices.count(False) in (3, 4) and choices.count(True) > 90
    for _ in range(4):
        gate.record(1, True, 1, 1.0)
        gate.record(1, False, 5, 1.0)
    choices = [gate.speculate(1) for _ in range(100)]
    assert choices.count(True) in (3, 4)


def test_the_gate_weighs_a_way_by_its_tokens_over_its_seconds() -> None:
    """A copy's steps accept unevenly: a speed is the tokens over the seconds, not a mean of each step's speed."""
    gate = CostGate()
    # Speculating: 1 token in 0.1 s then 17 in 0.9 s, 18 tokens a second; a mean of the steps' speeds reads 14.4.
    # Plain: 15 tokens a second. So speculating is the faster way.
    for tokens, seconds in ((1, 0.1), (17, 0.9)) * 2:
        gate.record(1, True, tokens, seconds)
        gate.record(1, False, 3, 0.2)
    assert gate.speculate(1)


def test_quantized_kv_rows_speculate_with_the_same_tokens() -> None:
    """The batch's quantized layers (stages/models/quantized_kv.py) are cut back and rolled like plain ones (on demo:
    tiny's head dim is below a quantization group)."""
    from stages.kv.shape import KvScheme
    from stages.models.demo import ensure_demo_model
    from stages.models.loading import resolve_model
    from stages.models.quantized_kv import QuantizedBatchGenerator

    model = load_weights(resolve_model(str(ensure_demo_model("demo"))))
    scheme = KvScheme(bits=8, group_size=64)

    def quantized() -> Any:
        return QuantizedBatchGenerator(
            model,
            kv_scheme=scheme,
            stop_tokens=[[0]],
            completion_batch_size=4,
            prefill_batch_size=4,
            prefill_step_size=16,
        )

    arrivals = {
        0: [("a", COPY, GREEDY, 16, [[0]])],
        2: [("b", OTHER, GREEDY, 12, [[0]]), ("c", COPY[4:], GREEDY, 10, [[0]])],
    }
    speculation = Speculation(
        drafter=PromptLookup(), policy=RowPolicy(max_k=4, min_acceptance=0.0, max_rows=8), gate=CostGate(measured=False)
    )
    expected, got = drive(quantized(), arrivals), drive(speculating(quantized, speculation)(), arrivals)
    for name in expected:
        assert got[name]["tokens"] == expected[name]["tokens"], name
        assert got[name]["all_tokens"] == expected[name]["all_tokens"], name
    assert speculation.counts.accepted > 0


def test_set_ups_that_cannot_speculate_are_named() -> None:
    from pipeline.settings import Settings
    from stages.engine.speculation import SpeculationError, speculation_factory

    lookup = Settings(prompt_lookup=True)
    with pytest.raises(SpeculationError, match="MLX_RELAY_SHARD=tensor"):
        speculation_factory(attrs.evolve(lookup, shard="tensor"), None, sharded=True, adapters=False)  # type: ignore[arg-type]
    with pytest.raises(SpeculationError, match="MLX_RELAY_ADAPTERS"):
        speculation_factory(lookup, None, sharded=False, adapters=True)  # type: ignore[arg-type]
    off = Settings(prompt_lookup=False)
    assert speculation_factory(off, None, sharded=True, adapters=True) is None  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="choose one drafter"):
        Settings(prompt_lookup=True, draft_model="tiny")


def test_prompt_lookup_by_default_stays_off_quietly_where_it_cannot_run() -> None:
    """On by default, never refused: sharded, adapters and recurrent cache layers keep it off, saying why."""
    from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

    from pipeline.settings import Settings
    from stages.engine.speculation import SpeculationError, speculation_factory

    default = Settings()
    assert (
        default.prompt_lookup is None and Settings.from_env({"MLX_RELAY_PROMPT_LOOKUP": "auto"}).prompt_lookup is None
    )
    sharded = speculation_factory(attrs.evolve(default, shard="tensor"), None, sharded=True, adapters=False)  # type: ignore[arg-type]
    assert sharded is not None and sharded(None) is None
    assert sharded.off is not None and "MLX_RELAY_SHARD=tensor" in sharded.off
    adapters = speculation_factory(default, None, sharded=False, adapters=True)  # type: ignore[arg-type]
    assert adapters is not None and adapters(None) is None
    assert adapters.off is not None and "MLX_RELAY_ADAPTERS" in adapters.off

    class Sliding:
        """A model whose cache has a sliding-window layer, as Gemma 3's has (mlx-lm reads `make_cache`)."""

        def make_cache(self) -> list[Any]:
            return [RotatingKVCache(max_size=8), KVCache()]

    class Recurrent:
        """A model whose cache has a recurrent layer (Qwen3.5's), whose state cannot be cut back."""

        def make_cache(self) -> list[Any]:
            return [ArraysCache(size=2), KVCache()]

    builder = speculation_factory(default, None, sharded=False, adapters=False)  # type: ignore[arg-type]
    assert builder is not None and builder.off is None
    assert builder(Recurrent()) is None
    assert builder.off is not None and "recurrent" in builder.off
    asked = speculation_factory(Settings(prompt_lookup=True), None, sharded=False, adapters=False)
    assert asked is not None
    with pytest.raises(SpeculationError, match="recurrent"):
        asked(Recurrent())
    # Sliding-window layers are cut back after a verifying pass: lookup runs for them, by default too.
    sliding = speculation_factory(default, None, sharded=False, adapters=False)  # type: ignore[arg-type]
    assert sliding is not None and sliding(Sliding()) is not None and sliding.off is None
    # A draft model named takes the place of prompt lookup by default, and says nothing of it.
    draft = speculation_factory(Settings(draft_model="tiny"), None, sharded=False, adapters=False)
    assert draft is not None and draft.default is False and draft.off is None


def test_the_rows_that_speculate_follow_the_backend_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # Unset, a CPU speculates only for a row alone (a verifying pass beside others is compute-bound there); Metal and
    # CUDA up to 4 rows; a value the operator sets is taken as it is, on any backend.
    from pipeline.settings import Settings
    from stages.engine import speculation

    unset, set_to_3 = Settings.from_env({}), Settings.from_env({"MLX_RELAY_SPECULATION_MAX_ROWS": "3"})
    for device, rows in (("cpu", 1), ("metal", 4), ("cuda", 4)):
        monkeypatch.setattr(speculation, "backend", lambda device=device: device)
        assert (speculation.speculation_rows(unset), speculation.speculation_rows(set_to_3)) == (rows, 3)
