"""Jump-forward: decode steps per forced call and per JSON-schema reply, with it off and on, in process.

    python -m bench.jump_forward [--model demo|tiny|smollm2|PATH] [--rows 1,4] [--rounds 1]

No server, no HTTP: the model thread's own work, as the server builds it
(stages/engine/speculation.py's factory from the settings, the single-row
path for a lone row). Two workloads, greedy: a forced call (`tool_choice`
naming `get_weather`, in the markup of the family the tokenizer is served
as, the prompt rendered by the model's own template) and a reply held to
a JSON schema (`response_format`). Each runs with `MLX_RELAY_JUMP_FORWARD`
off (a step a token) and on; the tokens must be the same (`same`). Steps
are what a row's reply took (calls of the generator that gave it a token),
so they do not depend on the machine; the time is a ratio within one run
on a shared machine, and only a hint.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "country": {"type": "string", "enum": ["France", "Japan", "Brazil"]},
        "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "country", "languages", "active"],
    "additionalProperties": False,
}
MAX_TOKENS = 160


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.jump_forward", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny, smollm2 (built locally), or a model directory")
    parser.add_argument("--rows", default="1,4", help="rows at once (1: the single-row path; more: the batch)")
    parser.add_argument("--rounds", type=int, default=1, help="timed rounds per way (steps need one)")
    args = parser.parse_args(argv)
    from stages.models.blas import preload_blas

    blas = preload_blas()
    model, tokenizer = _load(args.model)
    print(f"{args.model}, greedy, at most {MAX_TOKENS} tokens a reply, BLAS {blas}; the machine is shared")
    print(
        f"{'workload':>12}  {'rows':>4}  {'tokens':>6}  {'steps off':>9}  {'steps on':>8}  {'forced taken/of':>15}  "
        f"{'time on/off':>11}  same"
    )
    for name, (prompt, compiled) in _workloads(tokenizer).items():
        for rows in (int(n) for n in args.rows.split(",")):
            _report(name, rows, model, tokenizer, prompt, compiled, args.rounds)


def _report(name: str, rows: int, model: Any, tokenizer: Any, prompt: list[int], compiled: Any, rounds: int) -> None:
    off = _run(model, tokenizer, prompt, compiled, rows, jump=False)
    on = _run(model, tokenizer, prompt, compiled, rows, jump=True)
    walls = {False: [off.wall], True: [on.wall]}
    for _ in range(rounds - 1):
        for jump in (False, True):
            walls[jump].append(_run(model, tokenizer, prompt, compiled, rows, jump=jump).wall)
    ratio = statistics.median(walls[True]) / statistics.median(walls[False])
    same = off.tokens == on.tokens
    forced = f"{on.forced[0]}/{on.forced[1]}"
    print(
        f"{name:>12}  {rows:>4}  {len(off.tokens[0]):>6}  {off.steps:>9}  {on.steps:>8}  {forced:>15}  "
        f"{ratio:>11.2f}  {same}"
    )


class _Outcome:
    # `forced`: a row's forced tokens taken, and proposed (llguidance's tokenization where the model chose another).
    def __init__(self, tokens: list[list[int]], steps: int, forced: tuple[int, int], wall: float) -> None:
        self.tokens, self.steps, self.forced, self.wall = tokens, steps, forced, wall


def _run(model: Any, tokenizer: Any, prompt: list[int], compiled: Any, rows: int, *, jump: bool) -> _Outcome:
    """Every row's tokens, the steps the first row's reply took, the forced tokens a row took, the wall time."""
    from pipeline.requests import Sampling
    from stages.model_thread.sampling import RowStops, make_row_processors, make_row_sampler

    generator, speculation = _generator(model, tokenizer, jump=jump)
    greedy = Sampling(temperature=0.0)
    began = time.perf_counter()
    uids = [
        generator.insert(
            [prompt],
            max_tokens=[MAX_TOKENS],
            samplers=[make_row_sampler(greedy)],
            logits_processors=[make_row_processors(greedy, MAX_TOKENS, compiled.matcher())],
            stop_sequences=[RowStops([[token] for token in sorted(tokenizer.eos_token_ids)])],
        )[0]
        for _ in range(rows)
    ]
    tokens: dict[int, list[int]] = {uid: [] for uid in uids}
    steps, finished = 0, 0
    while finished < rows:
        generated = generator.next()[1]
        steps += any(response.uid == uids[0] for response in generated)
        for response in generated:
            tokens[response.uid].append(response.token)
            finished += response.finish_reason is not None
    wall = time.perf_counter() - began
    generator.close()
    counts = speculation.jump_forward if speculation is not None else None
    forced = (counts.accepted // rows, counts.forced // rows) if counts is not None else (0, 0)
    return _Outcome([tokens[uid] for uid in uids], steps, forced, wall)


def _generator(model: Any, tokenizer: Any, *, jump: bool) -> tuple[Any, Any]:
    """The generator a server builds: the single-row path over mlx-lm's batch, speculating with jump-forward on."""
    from mlx_lm.generate import BatchGenerator

    from pipeline.settings import Settings
    from stages.engine.speculation import speculation_factory
    from stages.model_thread.single_row import single_row
    from stages.model_thread.speculative_batch import speculating

    stops = [[token] for token in sorted(tokenizer.eos_token_ids)]

    def batch() -> BatchGenerator:
        return BatchGenerator(model, stop_tokens=stops, completion_batch_size=8, prefill_batch_size=8)

    # Prompt lookup (on by default) off: the steps jump-forward saves, alone.
    factory = speculation_factory(
        Settings(jump_forward=jump, prompt_lookup=False), tokenizer, sharded=False, adapters=False
    )
    speculation = factory(model) if factory is not None else None
    make: Callable[[], Any] = speculating(batch, speculation) if speculation is not None else batch
    solo = single_row(
        make, enabled=True, model=model, stop_tokens=stops, prefill_step_size=512, speculation=speculation
    )
    return solo(), speculation


def _workloads(tokenizer: Any) -> dict[str, tuple[list[int], Any]]:
    """Each workload's prompt (through the model's template) and compiled grammar."""
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
    from stages.prompt.chat import render_chat
    from stages.prompt.constraint_choice import constraint_of
    from stages.prompt.constraints import ConstraintCompiler

    family = choose_family(tokenizer)
    compiler = ConstraintCompiler(tokenizer=tokenizer, vocab_size=len(tokenizer.get_vocab()), family=family)
    params = GenerationParams(max_tokens=MAX_TOKENS, sampling=Sampling(temperature=0.0))
    tool = Tool(name="get_weather", description="The weather in a city now.", parameters=WEATHER)
    call = ChatRequest(
        messages=(Message(role=Role.USER, content="What is the weather in Paris?"),),
        params=params,
        tools=(tool,),
        tool_choice=ToolChoice(mode=ToolChoiceMode.NAMED, name="get_weather"),
    )
    ask = "Describe a fictional person as JSON: name, age, country, languages, and whether they are active."
    schema = Constraint(kind=ConstraintKind.JSON_SCHEMA, spec=PERSON, param="response_format")
    reply = ChatRequest(messages=(Message(role=Role.USER, content=ask),), params=params)
    forced = constraint_of(tokenizer, family, call)
    assert forced is not None
    return {
        "forced call": (render_chat(tokenizer, call), compiler.compile(forced)),
        "json schema": (render_chat(tokenizer, reply), compiler.compile(schema)),
    }


def _load(name: str) -> tuple[Any, Any]:
    """The model in the form a server serves it on this backend (float32 on the CPU: `plan_memory`)."""
    from pipeline.settings import Settings
    from stages.engine.decisions import plan_memory
    from stages.models.loading import load_tokenizer, load_weights, resolve_model

    info = resolve_model(name)
    served, _, _ = plan_memory(Settings(), info, adapter_bytes=0, cluster=None)
    return load_weights(served), load_tokenizer(info)


if __name__ == "__main__":
    main()
