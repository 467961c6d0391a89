"""Speculative decoding in the batch, in process: tokens per second with and without it, and acceptance.

    python -m bench.speculation [--model demo|tiny|smollm2|gemma3|PATH] [--draft NAME [--one-at-a-time]]
                                [--rows 1,4,16] [--tokens 128] [--rounds 3] [--show 400]
                                [--workload copy|fresh|repeat|edit|edit-completion]

No server, no HTTP: the model thread's own work. Each round runs the same
rows (N at once, all inserted together) without speculation, as the server
runs them (a lone row on the single-row path, stages/model_thread/single_row.py; else
mlx-lm's batch), and with it (prompt lookup, or `--draft`), in turns so a
busy machine slows each alike; a ratio is the median of the rounds' own
ratios, of wall time and of the process's CPU time. Tokens are checked
equal in every round (greedy rows; `fresh` rows are seeded samples). The
prompt is prefilled once and every row starts from a copy of its cache, as
a prompt-cache hit does: what is timed is decode, the part speculation
changes (a 1,200-token prefill costs SmolLM2 about 20 s here).
With `--draft` and `--one-at-a-time`, a third way drafts each row on its
own, one after another (as before the draft model's batch), for the
batched/one-row ratio.

Tokens per verifying pass: the tokens a speculating row emits per forward
pass of the target that verifies its proposal, its pending token and the
accepted ones, so `(drafts + accepted) / drafts` (1.0: nothing accepted;
k + 1: every proposal accepted whole). It does not depend on the machine.

Workloads: `copy` asks to repeat a code block (greedy; on a random-weight
model the greedy output falls into loops, which prompt lookup copies);
`fresh` samples at temperature 1 (nothing to copy: the cost of looking);
`repeat` asks a real model (SmolLM2) to repeat a paragraph word for word;
`edit` is the copy-heavy edit (bench/speculation_edit.py): rewrite a
1,200-token Python file with one function renamed, in an instruct model's
chat turn, greedy; `edit-completion` the same as a raw completion, for a
base model (gemma3). `repeat` and the edits end each row at the model's end
of turn as a server's row does (the rates count the tokens the rows made).
A model with sliding-window layers (Gemma 3) runs on plain KV layers here
with their window as a mask (exact; the server refuses speculation on the
rotating layers it serves such a model with).
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


WORKLOADS = (*PROMPTS, "edit", "edit-completion")
# Workloads whose rows end at the model's end of turn (a real model's reply); the others run to --tokens.
_ENDING = frozenset({"repeat", "edit", "edit-completion"})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speculation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny, smollm2, gemma3 (built locally), or a directory")
    parser.add_argument("--draft", help="a draft model (default: prompt lookup)")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=8, help="tokens a row proposes at most (the server's default)")
    parser.add_argument("--max-rows", type=int, default=4, help="rows above which no row speculates")
    parser.add_argument("--workload", choices=WORKLOADS, default="copy")
    parser.add_argument("--show", type=int, default=0, help="print this many characters of the first row's reply")
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
    prompt = _prompt(args.workload, tokenizer)
    print(
        f"{args.model}, workload {args.workload} ({len(prompt)} prompt tokens), {args.tokens} tokens a row at most, "
        f"{args.rounds} rounds, BLAS {blas}, drafter {args.draft or 'prompt lookup'}, k<={args.k}"
        f"{', ungated' if args.ungated else ''}; the machine is shared: ratios within one run only"
    )
    one_at_a_time = args.draft is not None and args.one_at_a_time
    extra = f"  {'one-row drafts tok/s':>20}  {'batched/one-row':>15}" if one_at_a_time else ""
    print(
        f"{'rows':>4}  {'tokens':>6}  {'plain tok/s':>11}  {'spec tok/s':>10}  {'wall':>5}  {'CPU':>5}  "
        f"{'tok/pass':>8}  {'accepted/proposed':>17}  same{extra}"
    )
    stops = [[token] for token in tokenizer.eos_token_ids] if args.workload in _ENDING else []
    for rows in (int(n) for n in args.rows.split(",")):
        ways, counts = _ways(model, draft, prompt, rows, args, stops)
        if not one_at_a_time:
            del ways["one-row drafts"]
        walls: dict[str, list[float]] = {name: [] for name in ways}
        cpus: dict[str, list[float]] = {name: [] for name in ways}
        outputs: dict[str, list[list[list[int]]]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, run in ways.items():
                began, cpu = time.perf_counter(), time.process_time()
                outputs[name].append(run())
                walls[name].append(time.perf_counter() - began)
                cpus[name].append(time.process_time() - cpu)
            # Each round as it ends: on a busy machine a run takes long, and a cut-short one still says something.
            done = ", ".join(f"{name} {walls[name][-1]:.1f} s ({cpus[name][-1]:.1f} s CPU)" for name in ways)
            print(
                f"      round {len(walls['plain'])}: {done}; {counts.accepted}/{counts.proposed} accepted", flush=True
            )
        expected = outputs["plain"][0]
        same = all(output == expected for runs in outputs.values() for output in runs)
        generated = sum(len(tokens) for tokens in expected)
        rates = {name: generated / statistics.median(values) for name, values in walls.items()}
        wall = statistics.median(p / s for p, s in zip(walls["plain"], walls["spec"]))
        cpu = statistics.median(p / s for p, s in zip(cpus["plain"], cpus["spec"]))
        rate = f"{counts.accepted}/{counts.proposed}" + (
            f" ({counts.accepted / counts.proposed:.0%})" if counts.proposed else ""
        )
        per_pass = f"{(counts.drafts + counts.accepted) / counts.drafts:8.2f}" if counts.drafts else f"{'-':>8}"
        line = (
            f"{rows:>4}  {generated:>6}  {rates['plain']:11.1f}  {rates['spec']:10.1f}  {wall:5.2f}  {cpu:5.2f}  "
            f"{per_pass}  {rate:>17}  {same}"
        )
        if one_at_a_time:
            alone = rates["one-row drafts"]
            line += f"  {alone:20.1f}  {rates['spec'] / alone:15.2f}"
        print(line, flush=True)
        if args.show:
            print(repr(tokenizer.decode(expected[0])[: args.show]), flush=True)


def _prompt(workload: str, tokenizer: Any) -> list[int]:
    from bench.speculation_edit import chat_prompt, completion_prompt

    if workload == "edit":
        return chat_prompt(tokenizer)
    if workload == "edit-completion":
        return completion_prompt(tokenizer)
    return list(
        tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[workload]}], add_generation_prompt=True)
    )


def _load(name: str) -> tuple[Any, Any]:
    """The model in the form a server serves it on this backend (float32 on the CPU: `plan_memory`)."""
    from pipeline.settings import Settings
    from stages.engine.decisions import plan_memory
    from stages.models.loading import load_tokenizer, load_weights, resolve_model

    info = resolve_model(name)
    served, _, _ = plan_memory(Settings(), info, adapter_bytes=0, cluster=None)
    model = load_weights(served)
    _plain_layers(model)
    return model, load_tokenizer(info)


def _plain_layers(model: Any) -> None:
    """A model with sliding-window (rotating) layers gets plain ones, its window kept as the attention mask.

    mlx-lm's Gemma 3 asks its first layer's cache for the sliding mask with the window's size, which a plain
    `KVCache` (and the batch's) makes exactly; only memory grows (every position kept, not the last 512).
    """
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    from stages.models.mlx_internals import PLAIN, cache_kind

    kind = cache_kind(make_prompt_cache(model))
    if kind == PLAIN:
        return
    layers = len(make_prompt_cache(model))
    model.make_cache = lambda: [KVCache() for _ in range(layers)]
    print(f"(the model's {kind} layers run as plain KV layers here, the window as a mask)")


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
    prefix, prefilled = _prefilled(model, prompt)

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
            generator.insert(
                [prompt[len(prefix) :]],
                max_tokens=[args.tokens],
                caches=[_copied(prefilled)],
                # A list of the row's own: the batch extends it in place as the row decodes.
                all_tokens=[list(prefix)],
                samplers=[make_row_sampler(attrs_seed(sampling, i))],
            )[0]
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


def _prefilled(model: Any, prompt: list[int]) -> tuple[list[int], list[Any]]:
    """Every prompt token but the last, and the KV layers that hold them (each row starts from a copy)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    prefix, cache = prompt[:-1], make_prompt_cache(model)
    for start in range(0, len(prefix), 512):
        model(mx.array([prefix[start : start + 512]]), cache=cache)
        mx.eval([layer.state for layer in cache])
    return prefix, _copied(cache)


def _copied(cache: list[Any]) -> list[Any]:
    from stages.model_thread.single_row import _copied as copied

    return copied(cache)


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
