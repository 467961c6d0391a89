"""Prompt lookup replayed over a real model's own greedy output: what each way of proposing would verify.

    python -m bench.lookup_replay [--model smollm2,gemma3] [--workload edit-completion,edit] [--tokens 128]

Greedy verification accepts a proposal's longest prefix that the model would have written anyway, so a row's
passes follow from its output alone: the model writes its reply once (cached under `--out`), then the drafter and
each row's k (stages/model_thread/drafters.py) are replayed over it, token by token, as the model thread runs them.
A way is judged by the tokens each verifying pass emits and by the positions its passes verify (its proposal and
the pending token): on a CPU a verifying pass costs about its positions, so a way that emits the same tokens
with fewer positions is cheaper. Nothing here is timed; the figures do not depend on the machine.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from stages.model_thread.drafters import PromptLookup, RowPolicy, _copied_on

OUT = Path(__file__).resolve().parent / "out" / "lookup_replay"
# The server's defaults (pipeline/settings.py, stages/engine/speculation.py).
MAX_K, MIN_ACCEPTANCE = 8, 0.3


@attrs.define
class Replayed:
    steps: int = 0
    passes: int = 0
    emitted_by_passes: int = 0
    positions: int = 0

    @property
    def tokens_per_pass(self) -> float:
        return self.emitted_by_passes / self.passes if self.passes else 0.0

    def line(self) -> str:
        per_token = self.positions / max(1, self.emitted_by_passes)
        return (
            f"steps {self.steps:4d}  passes {self.passes:4d}  tokens/pass {self.tokens_per_pass:.2f}  "
            f"positions verified {self.positions:5d}  positions/token {per_token:.2f}"
        )


Propose = Callable[[Sequence[int], int], list[int]]


def replay(prompt: Sequence[int], output: Sequence[int], propose: Propose) -> Replayed:
    """The steps a lone greedy row takes to write `output` after `prompt` (its first token from the prefill)."""
    policy = RowPolicy(max_k=MAX_K, min_acceptance=MIN_ACCEPTANCE, max_rows=1)
    history, figures, written = [*prompt, output[0]], Replayed(), 1
    while written < len(output):
        k = policy.budget(0, 1)
        proposal = propose(history, k) if k else []
        figures.steps += 1
        if not proposal:
            history.append(output[written])
            written += 1
            continue
        accepted = 0
        while accepted < len(proposal) and written + accepted < len(output):
            if proposal[accepted] != output[written + accepted]:
                break
            accepted += 1
        policy.record(0, len(proposal), accepted)
        emitted = min(accepted + 1, len(output) - written)
        history.extend(output[written : written + emitted])
        written += emitted
        figures.passes += 1
        figures.emitted_by_passes += emitted
        figures.positions += len(proposal) + 1
    return figures


def ways() -> dict[str, Propose]:
    lookup = PromptLookup()

    def gated(least: int) -> Propose:
        stricter = PromptLookup(min_ngram=least)
        return lambda history, k: stricter.propose(0, history, k)

    def capped(scale: int) -> Propose:
        def propose(history: Sequence[int], k: int) -> list[int]:
            size, distance = lookup.match(history)
            return _copied_on(history, distance, min(k, scale * size)) if size else []

        return propose

    return {
        "served": lambda history, k: lookup.propose(0, history, k),
        "at least 2": gated(2),
        "at least 3": gated(3),
        "at least 4": gated(4),
        "k <= match": capped(1),
        "k <= 2 match": capped(2),
    }


def _written(model_name: str, workload: str, tokens: int, out: Path) -> tuple[list[int], list[int]]:
    """The prompt and the model's greedy reply, made once and kept under `out`."""
    path = out / f"{model_name}-{workload}-{tokens}.json"
    if path.exists():
        kept = json.loads(path.read_text())
        return kept["prompt"], kept["output"]
    from bench.speculation import _load, _prompt

    model, tokenizer = _load(model_name)
    prompt = _prompt(workload, tokenizer)
    output = _greedy(model, prompt, tokens, set(tokenizer.eos_token_ids))
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"prompt": prompt, "output": output, "text": tokenizer.decode(output)}))
    return prompt, output


def _greedy(model: object, prompt: list[int], tokens: int, stops: set[int]) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    output: list[int] = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=tokens, sampler=lambda x: mx.argmax(x, -1)):
        output.append(int(token))
        if output[-1] in stops:
            break
    return output


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lookup_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2,gemma3")
    parser.add_argument("--workload", default="edit-completion,edit", help="bench.speculation's edit workloads")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    from stages.models.blas import preload_blas

    preload_blas()
    for model_name in args.model.split(","):
        for workload in args.workload.split(","):
            prompt, output = _written(model_name, workload, args.tokens, args.out)
            print(f"{model_name} {workload}: {len(prompt)} prompt tokens, {len(output)} written")
            for name, propose in ways().items():
                print(f"  {name:>12}: {replay(prompt, output, propose).line()}")


if __name__ == "__main__":
    main()
