"""Speculative decoding in the batch, in process: tokens per second with and without it, and acceptance.

    python -m bench.speculation [--model demo|tiny|smollm2|PATH] [--draft NAME [--one-at-a-time]]
                                [--rows 1,4,16] [--tokens 128] [--rounds 3] [--workload copy|fresh|repeat]

No server, no HTTP: the model thread's own work. Each round runs the same
rows (N at once, all inserted together) without speculation, as the server
runs them (a lone row on the single-row path, stages/model_thread/single_row.py; else
mlx-lm's batch), and with it (prompt lookup, or `--draft`), in turns so a
busy machine slows each alike; the figure is the ratio of medians. Tokens
are checked equal first (greedy rows; `fresh` rows are seeded samples).
With `--draft` and `--one-at-a-time`, a third way drafts each row on its
own, one after another (as before the draft model's batch), for the
batched/one-row ratio.

Workloads: `copy` asks to repeat a code block (greedy; on a random-weight
model the greedy output falls into loops, which prompt lookup copies);
`fresh` samples at temperature 1 (nothing to copy: the cost of looking);
`repeat` asks a real model (SmolLM2) to repeat a paragraph word for word,
each row ending at the model's end of turn as a server's row does (the
rates count the tokens the rows made).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

CODE = """def merge(left, right):
    result = []
    while left and right:
        result.append(left.pop(0) if left[0] <= right[0] else right.pop(0))
    return result + left + right
"""
PARAGRAPH = (
    "The lighthouse keeper climbed the spiral stairs each evening at dusk, carrying a small brass lamp and a "
    "notebook in which he recorded the weather, the ships that passed, and the colour of the sea."
)
PROMPTS = {
    "copy": f"Repeat this code exactly, then repeat it again:\n{CODE}\n{CODE}",
    "fresh": "Write a short story about a dragon and a knight in a small village.",
    "repeat": f"Repeat the following paragraph word for word.\n\n{PARAGRAPH}",
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speculation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny, smollm2 (built locally), or a model directory")
    parser.add_argument("--draft", help="a draft model (default: prompt lookup)")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=8, help="tokens a row proposes at most (the server's default)")
    parser.add_argument("--max-rows", type=int, default=4, help="rows above which no row speculates")
    parser.add_argument("--workload", choices=tuple(PROMPTS), default="copy")
    parser.add_argument("--ungated", action="store_true", help="speculate every step (no measured gate): the raw cost")
    parser.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="with --draft: also run the draft model one row at a time (its batch of rows never drafted together)",
    )
    args = parser.parse_args(argv)
    from stages.models.blas import preload_blas

    blas = preload_blas()
    model, tokenizer = _load(args.model)
    draft = _load(args.draft)[0] if args.draft else None
    messages = [{"role": "user", "content": PROMPTS[args.workload]}]
    prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    print(
        f"{args.model}, workload {args.workload}, {args.tokens} tokens a row, {args.rounds} rounds, BLAS {blas}, "
        f"drafter {args.draft or 'prompt lookup'}, k<={args.k}{', ungated' if args.ungated else ''}; "
        "the machine is shared: ratios within one run only"
    )
    one_at_a_time = args.draft is not None and args.one_at_a_time
    extra = f"  {'one-row drafts tok/s':>20}  {'batched/one-row':>15}" if one_at_a_time else ""
    print(f"{'rows':>4}  {'plain tok/s':>11}  {'spec tok/s':>10}  {'ratio':>6}  {'accepted/proposed':>17}  same{extra}")
    # A real model's copy ends where it ends its turn, as a server's row does; a random model's rows run to
    # --tokens (its end-of-turn token is one more near-random pick).
    stops = [[token] for token in tokenizer.eos_token_ids] if args.workload == "repeat" else []
    for rows in (int(n) for n in args.rows.split(",")):
        ways, counts = _ways(model, draft, prompt, rows, args, stops)
        if not one_at_a_time:
            del ways["one-row drafts"]
        expected = ways["plain"]()
        generated = sum(len(tokens) for tokens in expected)
        same = all(run() == expected for name, run in ways.items() if name != "plain")
        walls: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, run in ways.items():
                began = time.perf_counter()
                run()
                walls[name].append(time.perf_counter() - began)
        rates = {name: generated / statistics.median(values) for name, values in walls.items()}
        rate = f"{counts.accepted}/{counts.proposed}" + (
            f" ({counts.accepted / counts.proposed:.0%})" if counts.proposed else ""
        )
        plain_rate, spec_rate = rates["plain"], rates["spec"]
        line = f"{rows:>4}  {plain_rate:11.1f}  {spec_rate:10.1f}  {spec_rate / plain_rate:6.2f}  {rate:>17}  {same}"
        if one_at_a_time:
            alone = rates["one-row drafts"]
            line += f"  {alone:20.1f}  {spec_rate / alone:15.2f}"
        print(line)


def _load(name: str) -> tuple[Any, Any]:
    """The model in the form a server serves it on this backend (float32 on the CPU: `plan_memory`)."""
    from pipeline.settings import Settings
    from stages.engine.decisions import plan_memory
    from stages.models.loading import load_tokenizer, load_weights, resolve_model

    info = resolve_model(name)
    served, _, _ = plan_memory(Settings(), info, adapter_bytes=0, cluster=None)
    return load_weights(served), load_tokenizer(info)


def _ways(
    model: Any, draft: Any, prompt: list[int], rows: int, args: Any, stops: list[list[int]]
) -> tuple[dict[str, Callable[[], Any]], Any]:
    from mlx_lm.generate import BatchGenerator

    from pipeline.requests import Sampling
    from stages.model_thread.draft_model import DraftModel
    from stages.model_thread.drafters import CostGate, DrafterCounts, PromptLookup, RowPolicy
    from stages.model_thread.sampling import make_row_sampler
    from stages.model_thread.single_row import single_row
    from stages.model_thread.speculative_batch import Speculation, speculating

    def batch() -> BatchGenerator:
        return BatchGenerator(
            model, stop_tokens=stops, completion_batch_size=max(rows, 1), prefill_batch_size=max(rows, 1)
        )

    plain_make = single_row(batch, enabled=rows == 1, model=model, stop_tokens=stops, prefill_step_size=512)
    counts = DrafterCounts()

    def speculation_for(one_at_a_time: bool) -> Speculation:
        drafter: Any = DraftModel(model=draft) if draft is not None else PromptLookup()
        if one_at_a_time:
            drafter = _OneRowAtATime(drafter)
        policy = RowPolicy(max_k=args.k, min_acceptance=0.3, max_rows=args.max_rows)
        return Speculation(
            drafter=drafter,
            policy=policy,
            counts=DrafterCounts() if one_at_a_time else counts,
            gate=CostGate(measured=not args.ungated),
        )

    # As in the server, the gate's measurements (and a draft model's kept caches) outlive each run's rows.
    speculations = {False: speculation_for(False), True: speculation_for(True)}

    def spec_make(one_at_a_time: bool = False) -> Any:
        speculation = speculations[one_at_a_time]
        # As the server runs it: a lone row on the single-row path, speculating there.
        make = single_row(
            speculating(batch, speculation),
            enabled=rows == 1,
            model=model,
            stop_tokens=stops,
            prefill_step_size=512,
            speculation=speculation,
        )
        return make()

    def run(make: Callable[[], Any]) -> list[list[int]]:
        generator = make()
        sampling = Sampling(temperature=1.0 if args.workload == "fresh" else 0.0, seed=1)
        uids = [
            generator.insert([prompt], max_tokens=[args.tokens], samplers=[make_row_sampler(attrs_seed(sampling, i))])[
                0
            ]
            for i in range(rows)
        ]
        tokens: dict[int, list[int]] = {uid: [] for uid in uids}
        finished = 0
        while finished < rows:
            for response in generator.next()[1]:
                tokens[response.uid].append(response.token)
                finished += response.finish_reason is not None
        generator.close()
        return [tokens[uid] for uid in uids]

    ways = {
        "plain": lambda: run(plain_make),
        "spec": lambda: run(spec_make),
        "one-row drafts": lambda: run(partial(spec_make, one_at_a_time=True)),
    }
    return ways, counts


class _OneRowAtATime:
    """A draft model drafting each row on its own cache, one row after another (before the draft batch)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.caught_up = inner, inner.name, 0

    def propose(self, uid: int, history: Any, k: int) -> list[int]:
        proposal = list(self.inner.propose(uid, history, k))
        self.caught_up = self.inner.caught_up
        return proposal

    def propose_many(self, requests: Any) -> list[list[int]]:
        proposals, caught_up = [], 0
        for uid, history, k in requests:
            proposals.append(self.propose(uid, history, k))
            caught_up += self.caught_up
        self.caught_up = caught_up
        return proposals

    def forget(self, uids: Any) -> None:
        self.inner.forget(uids)


def attrs_seed(sampling: Any, row: int) -> Any:
    import attrs

    return attrs.evolve(sampling, seed=row + 1)


if __name__ == "__main__":
    main()
