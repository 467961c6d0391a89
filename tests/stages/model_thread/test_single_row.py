"""stages/model_thread/single_row.py on the tiny demo model: a row alone gives the batch's tokens, and keeps
them when it joins the batch.

Each case runs the same rows, arriving at the same calls, through mlx-lm's
`BatchGenerator` and through `SingleRow` over one: every row's tokens, finish
reason and logprobs must agree, greedy and seeded, with penalties and bias,
with stop tokens, and with a second row arriving while the first prefills or
decodes (it moves into the batch with its KV). What leaves with a row (its
cache and tokens, when it finishes or is removed) must describe the same
sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import BatchGenerator

from pipeline.requests import Sampling
from stages.model_thread.sampling import make_row_sampler
from stages.model_thread.single_row import SingleRow, single_row
from stages.models.loading import ModelInfo, load_weights
from tests.stages.model_thread.drive import drive

GREEDY = Sampling(temperature=0.0)
SEEDED = Sampling(temperature=0.9, seed=5)
PENALISED = Sampling(
    temperature=0.8, seed=11, repetition_penalty=1.3, presence_penalty=0.5, logit_bias={5: 3.0, 7: -100.0}
)
PROMPT = list(range(3, 40))
OTHER = list(range(50, 95))
STEP = 16  # prefill chunk: the long prompt takes several calls


@pytest.fixture(scope="module")
def model(model_info: ModelInfo) -> Any:
    return load_weights(model_info)


def _batch(model: Any) -> BatchGenerator:
    return BatchGenerator(
        model, stop_tokens=[[0]], completion_batch_size=4, prefill_batch_size=4, prefill_step_size=STEP
    )


def _solo(model: Any) -> Any:
    make = single_row(lambda: _batch(model), enabled=True, model=model, stop_tokens=[[0]], prefill_step_size=STEP)
    generator = make()
    assert isinstance(generator, SingleRow)
    return generator


def _same(expected: dict[str, dict[str, Any]], got: dict[str, dict[str, Any]]) -> None:
    assert expected.keys() == got.keys()
    for name in expected:
        want, have = expected[name], got[name]
        assert have["tokens"] == want["tokens"], name
        assert have["finish"] == want["finish"], name
        for a, b in zip(want["logprobs"], have["logprobs"]):
            assert mx.allclose(a, b, atol=1e-4).item(), name
        # The finished row's cache holds exactly the tokens it names, which are its prompt and output so far.
        held = have["all_tokens"]
        assert (
            held == (have["prompt"] + have["tokens"])[: len(held)]
            and len(held) >= len(have["prompt"]) + len(have["tokens"]) - 1
        )
        assert have["cache"][0].offset == len(held)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalties"])
def test_a_row_alone_gives_the_batchs_tokens(model: Any, sampling: Sampling) -> None:
    arrivals = {0: [("a", PROMPT, sampling, 40, [[0]])]}
    solo = _solo(model)
    _same(drive(_batch(model), arrivals), drive(solo, arrivals))
    assert solo.solo_rows == 1 and solo.handovers == 0


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED, PENALISED], ids=["greedy", "seeded", "penalties"])
@pytest.mark.parametrize("second_at", [1, 3, 9], ids=["prefilling", "first-token", "decoding"])
def test_a_second_row_takes_the_first_into_the_batch_unchanged(model: Any, sampling: Sampling, second_at: int) -> None:
    arrivals = {0: [("a", PROMPT, sampling, 30, [[0]])], second_at: [("b", OTHER, sampling, 20, [[0]])]}
    solo = _solo(model)
    _same(drive(_batch(model), arrivals), drive(solo, arrivals))
    assert solo.solo_rows == 1 and solo.handovers == 1


def test_the_first_token_goes_out_before_the_next_pass(model: Any) -> None:
    """On a CPU `async_eval` runs its pass before it returns: the call that gives the first token must not also run
    the pass that reads it, or the time to first token carries a decode step. Its cache holds the prompt alone."""
    from stages.model_thread.sampling import RowStops, make_row_processors

    solo = _solo(model)
    (uid,) = solo.insert(
        [PROMPT],
        max_tokens=[8],
        samplers=[make_row_sampler(GREEDY)],
        logits_processors=[make_row_processors(GREEDY, 8)],
        stop_sequences=[RowStops([[0]])],
    )
    generated: list[Any] = []
    while not generated:
        generated = solo.next()[1]
    cache, tokens = solo.extract_cache([uid])[uid]
    assert [response.uid for response in generated] == [uid]
    assert tokens == PROMPT and cache[0].offset == len(PROMPT)
    # The next call feeds it and gives the second, whose pass the double buffer has run already.
    second = solo.next()[1]
    cache, tokens = solo.extract_cache([uid])[uid]
    assert tokens == [*PROMPT, generated[0].token, second[0].token] and cache[0].offset == len(tokens)


def test_stop_tokens_end_a_row_alone_and_at_its_hand_over(model: Any) -> None:
    free = drive(_batch(model), {0: [("a", PROMPT, GREEDY, 30, [[0]])]})["a"]["tokens"]
    # A token the row produces (not its first): the row ends on it, wherever it runs.
    stop = next(token for token in free[3:] if token not in free[:3])
    at = free.index(stop)
    for second_at in (at - 1, at, at + 1, at + 2):
        arrivals = {0: [("a", PROMPT, GREEDY, 30, [[0], [stop]])], second_at: [("b", OTHER, GREEDY, 5, [[0]])]}
        got = drive(_solo(model), arrivals)
        _same(drive(_batch(model), arrivals), got)
        assert got["a"]["finish"] == "stop" and got["a"]["tokens"][-1] == stop


def test_a_removed_row_leaves_with_its_cache_and_tokens(model: Any) -> None:
    solo = _solo(model)
    from stages.model_thread.sampling import RowStops

    (uid,) = solo.insert(
        [PROMPT],
        max_tokens=[30],
        caches=None,
        all_tokens=[[]],
        samplers=[make_row_sampler(GREEDY)],
        logits_processors=[[]],
        stop_sequences=[RowStops([[0]])],
    )
    tokens = []
    for _ in range(8):
        tokens += [response.token for response in solo.next()[1]]
    caches = solo.remove([uid], return_prompt_caches=True)
    cache, held = caches[uid]
    assert held == PROMPT + tokens and cache[0].offset == len(held)
    assert solo.next() == ([], []) and solo.prompt_cache_nbytes == 0


def test_off_for_a_sharded_or_disabled_generator(model: Any) -> None:
    make: Callable[[], Any] = lambda: _batch(model)  # noqa: E731
    assert single_row(make, enabled=False, model=model, stop_tokens=[[0]], prefill_step_size=STEP) is make


# -- through the gateway ---------------------------------------------------------------------------------------


async def _gateway_run(
    model_info: ModelInfo, rows: list[Any], second_after: int, *, single_row: bool
) -> dict[str, Any]:
    """Row 0 alone; the others arrive once it has `second_after` tokens. Each row's deltas."""
    from functools import partial

    import anyio

    from pipeline.channels import Channel, open_channel
    from stages.cache.disk import SpillJob
    from stages.kv.scheduler import KvScheduler
    from stages.kv.shape import read_model_shape
    from stages.messages import Abort, Prepared, StepOutputs
    from stages.model_thread.gateway import GenerationGateway

    inbox: Channel[Prepared] = open_channel(16, name="gateway")
    control: Channel[Abort] = open_channel(4, name="control")
    steps: Channel[StepOutputs] = open_channel(64, name="steps")
    spills: Channel[SpillJob] = open_channel(4, name="spills")
    gateway = GenerationGateway(
        inbox=inbox.receive,
        control=control.receive,
        aborts=control.send,
        out=steps.send,
        spills_out=spills.send,
        spills_in=spills.receive,
        load=partial(load_weights, model_info),
        eos_ids=frozenset({0, 2}),
        max_batch=4,
        prefill_step_size=STEP,
        single_row=single_row,
        scheduler=KvScheduler(read_model_shape(model_info.path, model_info.context_window), 1 << 30),
    )
    deltas: dict[str, list[Any]] = {r.request_id: [] for r in rows}
    with anyio.fail_after(60), steps.receive:
        async with anyio.create_task_group() as group:
            await group.start(gateway.run)
            inbox.send.send_nowait(rows[0])
            sent = False
            while any(not d or d[-1].finish is None for d in deltas.values()):
                if not sent and len(deltas[rows[0].request_id]) >= second_after:
                    for other in rows[1:]:
                        inbox.send.send_nowait(other)
                    sent = True
                for delta in (await steps.receive.receive()).deltas:
                    deltas[delta.request_id].append(delta)
            inbox.send.close()
    return deltas


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_through_the_gateway_tokens_logprobs_and_stops_are_the_batchs(
    model_info: ModelInfo, sampling: Sampling
) -> None:
    """The gateway with the single-row path gives what it gives without: a row alone, then joined by two more
    mid-generation; with logprobs and a stop token id; greedy and seeded."""
    import attrs

    from pipeline.requests import GenerationParams
    from tests.stages.cache.test_prompt_cache_gateway import row

    def rows() -> list[Any]:
        made = [
            row(f"r{i}", prompt, max_tokens=24, sampling=sampling)
            for i, prompt in enumerate((PROMPT, OTHER, OTHER[:20]))
        ]
        params = GenerationParams(max_tokens=24, sampling=sampling, logprobs=2, stop_token_ids=(9,))
        return [attrs.evolve(made[0], params=params), *made[1:]]

    expected = await _gateway_run(model_info, rows(), 5, single_row=False)
    got = await _gateway_run(model_info, rows(), 5, single_row=True)
    for request_id, want in expected.items():
        have = got[request_id]
        assert [d.new_token_ids for d in have] == [d.new_token_ids for d in want], request_id
        assert [d.finish for d in have] == [d.finish for d in want], request_id
        for a, b in zip(want, have):
            assert (a.logprobs is None) == (b.logprobs is None)
            for (chosen_a, top_a), (chosen_b, top_b) in zip(a.logprobs or (), b.logprobs or ()):
                assert abs(chosen_a - chosen_b) < 1e-4 and [i for i, _ in top_a] == [i for i, _ in top_b]
    assert len(expected["r0"]) > 5 and expected["r0"][0].logprobs is not None
