"""Speculation against mlx_lm.server, over HTTP: the issue's peer comparisons, ratios within one run.

    python -m bench.speculation_servers [--model demo] [--draft demo] [--tokens 64] [--rounds 3]
                                        [--draft-rows 1] [--lookup-rows 4,16] [--workload copy|edit]

Every server is started once, on the same model directory and BLAS
(bench/servers.py), and all stay up: each round sends one wave to each in
turn (the order rotating), so a busy machine slows each alike; a figure is
the median wave's tokens per second (completion tokens from `usage` over
the wave's wall time), and a ratio compares medians of one run.

- `--draft-rows` (default N=1): mlx-relay `--draft-model` against
  `mlx_lm.server --draft-model` (the same draft, `--num-draft-tokens 4` on
  both), each beside its own server without a draft.
- `--lookup-rows` (default N=4 and 16): mlx-relay `--prompt-lookup` against
  `mlx_lm.server` without a draft (with a draft it does not batch), and
  mlx-relay without speculation (`MLX_RELAY_PROMPT_LOOKUP=0`: prompt lookup
  is on by default).

The workload is copy-heavy, greedy, as a raw completion so both servers see
the same tokens: bench/speculation.py's `copy` prompt, or with `--workload
edit` the copy-heavy edit (bench/speculation_edit.py's completion prompt:
rewrite a 1,200-token file with one function renamed). Every request
sends the same prompt, which the warm-up request puts in each server's
prompt cache: on this project's CPU machine a prompt's prefill costs
seconds a row, and would otherwise be most of what is measured. The rows
of a wave are still N rows of the batch. mlx-relay's acceptance and
tokens per verifying pass are read from `/stats` at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.servers import Server, free_port, mlx_lm_command, relay_command, relay_env, started
from bench.speculation import PROMPTS
from bench.speculation_edit import completion_text

OUT = Path(__file__).resolve().parent / "out"
# mlx-relay's default k (MLX_RELAY_NUM_DRAFT_TOKENS); mlx_lm.server is given the same.
DRAFT_TOKENS = 4
_TIMEOUT = httpx.Timeout(600.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speculation_servers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="a built-in demo name or a model directory")
    parser.add_argument("--draft", default="demo", help="the draft model (a built-in name or a directory)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of each request")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draft-rows", default="1", help="concurrency levels of the draft-model comparison")
    parser.add_argument("--lookup-rows", default="4,16", help="concurrency levels of the prompt-lookup comparison")
    parser.add_argument("--workload", choices=("copy", "edit"), default="copy")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    prompt = PROMPTS["copy"] if args.workload == "copy" else completion_text()
    draft_rows = [int(n) for n in args.draft_rows.split(",") if n]
    lookup_rows = [int(n) for n in args.lookup_rows.split(",") if n]
    model, draft = _path(args.model), _path(args.draft)
    wanted = {
        "relay": (draft_rows + lookup_rows, {"MLX_RELAY_PROMPT_LOOKUP": "0"}),
        "relay --draft-model": (draft_rows, {"MLX_RELAY_DRAFT_MODEL": args.draft}),
        "relay --prompt-lookup": (lookup_rows, {"MLX_RELAY_PROMPT_LOOKUP": "1"}),
        "mlx_lm.server": (draft_rows + lookup_rows, None),
        "mlx_lm.server --draft-model": (draft_rows, None),
    }
    with contextlib.ExitStack() as stack:
        servers = {
            name: stack.enter_context(_start(name, args, model, draft, settings))
            for name, (levels, settings) in wanted.items()
            if levels
        }
        print(
            f"{args.model} (draft {args.draft}), {args.workload} greedy completions of {args.tokens} tokens, "
            f"{args.rounds} rounds; the machine is shared: ratios within one run only"
        )
        for server in servers.values():
            asyncio.run(_wave(server, 1, args.tokens, prompt))
        rates = _measure(servers, wanted, args, prompt)
        acceptance = {name: _acceptance(server) for name, server in servers.items() if name.startswith("relay --")}
    _report(rates, draft_rows, lookup_rows, acceptance)


def _path(name: str) -> str:
    from stages.models.demo import DEMO_MODELS, ensure_demo_model

    return str(ensure_demo_model(name)) if name in DEMO_MODELS else name


@contextlib.contextmanager
def _start(name: str, args: Any, model: str, draft: str, settings: dict[str, str] | None) -> Iterator[Server]:
    from stages.models.demo import DEMO_MODELS

    port = free_port()
    logs = args.out / "logs"
    if settings is None:
        command = mlx_lm_command(model, port)
        if "--draft-model" in name:
            command += ["--draft-model", draft, "--num-draft-tokens", str(DRAFT_TOKENS)]
        with started(name.replace(" ", ""), command, port, os.environ, logs) as server:
            yield server
        return
    names = frozenset(DEMO_MODELS)
    env = relay_env(args.model if args.model in names else model, names) | settings
    env["MLX_RELAY_NUM_DRAFT_TOKENS"] = str(DRAFT_TOKENS)
    with started(name.replace(" ", ""), relay_command(port), port, env, logs) as server:
        yield server


def _measure(
    servers: dict[str, Server], wanted: dict[str, Any], args: Any, prompt: str
) -> dict[tuple[str, int], float]:
    walls: dict[tuple[str, int], list[float]] = {}
    # Greedy replies to one prompt: speculation changes how fast, never what, so every server's should be one text.
    replies: dict[str, set[str]] = {}
    levels = sorted({level for levels, _ in wanted.values() for level in levels})
    for round_index in range(args.rounds):
        for level in levels:
            names = [name for name in servers if level in wanted[name][0]]
            shift = round_index % len(names)
            for name in names[shift:] + names[:shift]:
                rate, texts = asyncio.run(_wave(servers[name], level, args.tokens, prompt))
                walls.setdefault((name, level), []).append(rate)
                replies.setdefault(name, set()).update(texts)
                print(f"  round {round_index + 1} N={level} {name}: {rate:.1f} tok/s", flush=True)
    texts = {text for found in replies.values() for text in found}
    print(
        "the same reply from every server, every request"
        if len(texts) == 1
        else f"replies differ: {len(texts)} texts ({', '.join(f'{n}: {len(t)}' for n, t in replies.items())})"
    )
    return {key: statistics.median(values) for key, values in walls.items()}


async def _wave(server: Server, level: int, tokens: int, prompt: str) -> tuple[float, list[str]]:
    """`level` requests at once; completion tokens a second over the wave, and each reply's text."""
    limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
    async with httpx.AsyncClient(timeout=_TIMEOUT, limits=limits) as client:
        began = time.perf_counter()
        done = await asyncio.gather(*(_complete(client, server, tokens, prompt) for _ in range(level)))
        return sum(count for count, _ in done) / (time.perf_counter() - began), [text for _, text in done]


async def _complete(client: httpx.AsyncClient, server: Server, tokens: int, prompt: str) -> tuple[int, str]:
    body: dict[str, Any] = {
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0.0,
    }
    if server.name.startswith("relay"):
        # mlx_lm.server serves its one model under any name but loads another for a name it does not know.
        body["model"] = "demo"
    response = await client.post(f"{server.url}/v1/completions", json=body)
    response.raise_for_status()
    reply = response.json()
    return int(reply["usage"]["completion_tokens"]), reply["choices"][0]["text"]


def _acceptance(server: Server) -> str:
    found = _find(httpx.get(f"{server.url}/stats", timeout=10).json(), "speculation")
    if not found:
        return "no /stats speculation"
    return (
        f"{found['accepted_tokens']}/{found['proposed_tokens']} accepted ({found['acceptance_rate']:.0%}), "
        f"{found['tokens_per_pass']:.2f} tokens per verifying pass"
    )


def _find(tree: Any, key: str) -> Any:
    """The first non-empty value under `key` anywhere in `tree` (/stats nests it per model)."""
    if isinstance(tree, dict):
        if tree.get(key):
            return tree[key]
        children = list(tree.values())
    elif isinstance(tree, list):
        children = tree
    else:
        return None
    for child in children:
        found = _find(child, key)
        if found:
            return found
    return None


def _report(
    rates: dict[tuple[str, int], float], draft_rows: list[int], lookup_rows: list[int], acceptance: dict[str, str]
) -> None:
    print(f"{'comparison':<48} {'N':>3} {'tok/s':>16} {'ratio':>6}")
    pairs = [(n, "relay --draft-model", "mlx_lm.server --draft-model") for n in draft_rows]
    pairs += [(n, "relay --draft-model", "relay") for n in draft_rows]
    pairs += [(n, "mlx_lm.server --draft-model", "mlx_lm.server") for n in draft_rows]
    pairs += [(n, "relay --prompt-lookup", "mlx_lm.server") for n in lookup_rows]
    pairs += [(n, "relay --prompt-lookup", "relay") for n in lookup_rows]
    for level, first, second in pairs:
        a, b = rates[(first, level)], rates[(second, level)]
        print(f"{first + ' / ' + second:<48} {level:>3} {a:7.1f} / {b:7.1f} {a / b:6.2f}")
    for name, text in acceptance.items():
        print(f"{name}: {text}")


if __name__ == "__main__":
    main()
