"""An agent-like session against mlx-relay and mlx_lm.server on the same weights, in alternating rounds.

    python -m bench.agent_session [--model smollm2] [--turns 4] [--rounds 3] [--turn-tokens 1000] [--max-tokens 32]

What an agent client does to a server: every turn resends the whole
conversation with a file's worth of code added (about `--turn-tokens`
tokens of this repository's own source) and asks for a short answer,
streamed at temperature 0, the server's own answer kept in the history as
a client keeps it. So each turn is a long prefill of which all but the new
part should come from the prompt cache, then a short decode.

Both servers stay started and see the same conversation: each round a new
one (its files differ, so no round reuses another's cache), run on one
server and then the other, the order alternating from round to round. The
report gives each round's session time and each turn's time to first
token, and the medians over rounds of relay / mlx_lm.server for both.
mlx_lm.server serves a float32 copy of the weights (mlx_lm's own
`convert --dequantize --dtype float32`), which is what mlx-relay serves on a Linux CPU, so
the two compare as servers, not as weight formats.

llama.cpp's `llama-server` joins as a third contender on a built-in model
that comes from a GGUF file (smollm2, gemma3), served from that very file
(bench/llama_server.py; built once, skipped with the reason where it cannot
be): one slot, prompt caching on as its users run it, and its n-gram
speculation with `--llama-speculate`. The rounds then rotate the three, and
the report adds relay / llama-server beside relay / mlx_lm.server.
`--no-llama-server` leaves it out.

Writes agent_session.json under --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.llama_server import add_arguments as add_llama_arguments
from bench.llama_server import llama_contender, llama_env
from bench.servers import REPO, Server, float32_copy, free_port, mlx_lm_command, relay_command, relay_env, started

OUT = Path(__file__).resolve().parent / "out"
_TIMEOUT = httpx.Timeout(900.0, connect=10.0)
# About four characters a token of Python source for SmolLM2's and Gemma's tokenizers.
_CHARS_PER_TOKEN = 4


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_session", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a built-in name or a model directory")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=OUT)
    add_llama_arguments(parser)
    args = parser.parse_args(argv)
    sources = repo_sources()
    rounds: list[dict[str, Any]] = []
    with ExitStack() as stack:
        servers = start_servers(stack, args)
        names = list(servers)
        for server in servers.values():
            _session(server, [sources[-1][:2000]], 4)
        for index in range(args.rounds):
            files = list(itertools.islice(_files(sources, index, args), args.turns))
            order = rotated(names, index)
            figures = {name: _session(servers[name], files, args.max_tokens) for name in order}
            rounds.append(figures)
            print(f"round {index + 1}: " + round_line(figures), flush=True)
    summary = ratio_summary(rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agent_session.json").write_text(json.dumps({"model": args.model, "rounds": rounds, **summary}))
    print(json.dumps(summary, indent=2))


def start_servers(stack: ExitStack, args: argparse.Namespace) -> dict[str, Server]:
    """The contenders, started and healthy for the life of `stack`: relay, mlx_lm and, where it builds, llama."""
    from stages.models.loading import resolve_model

    path = resolve_model(args.model).path
    peer_path = float32_copy(path, args.out / "float32")
    logs = args.out / "logs"
    relay_port, peer_port, llama_port = free_port(), free_port(), free_port()
    relay_environment = relay_env(args.model, frozenset())
    servers = {
        "relay": stack.enter_context(started("relay", relay_command(relay_port), relay_port, relay_environment, logs)),
        "mlx_lm": stack.enter_context(
            started("mlx_lm", mlx_lm_command(str(peer_path), peer_port), peer_port, os.environ, logs)
        ),
    }
    if args.llama_server:
        # One slot, as one agent drives it, holding the whole conversation.
        command = llama_contender(args.model, llama_port, parallel=1, slot_context=8192, speculate=args.llama_speculate)
        if command is not None:
            servers["llama"] = stack.enter_context(started("llama", command, llama_port, llama_env(), logs))
    return servers


def rotated(names: list[str], index: int) -> list[str]:
    """Round `index`'s order: each contender first, middle and last in turn (with two, they alternate)."""
    return names[index % len(names) :] + names[: index % len(names)]


def repo_sources() -> list[str]:
    """This repository's Python modules, largest first: real code, the same on every machine at a commit."""
    files = sorted((REPO / "stages").rglob("*.py"), key=lambda p: (-p.stat().st_size, str(p)))
    return [f"# {p.relative_to(REPO)}\n{p.read_text(encoding='utf-8')}" for p in files]


def _files(sources: list[str], index: int, args: argparse.Namespace) -> Iterator[str]:
    """Round `index`'s files, each cut to about `--turn-tokens` tokens."""
    size = args.turn_tokens * _CHARS_PER_TOKEN
    start = index * args.turns
    for source in sources[start:] + sources[:start]:
        yield source[:size]


def _session(server: Server, files: list[str], max_tokens: int) -> dict[str, Any]:
    messages: list[dict[str, str]] = [{"role": "system", "content": "You review code. Answer in one sentence."}]
    ttfts: list[float] = []
    began = time.perf_counter()
    with httpx.Client(timeout=_TIMEOUT) as client:
        for text in files:
            messages.append({"role": "user", "content": f"```python\n{text}\n```\nWhat does this file do?"})
            answer, ttft = _turn(client, server.url, messages, max_tokens)
            messages.append({"role": "assistant", "content": answer})
            ttfts.append(ttft)
    return {"session_s": time.perf_counter() - began, "ttft_s": ttfts}


def _turn(client: httpx.Client, url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, float]:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "stream": True}
    sent, first, text = time.perf_counter(), None, []
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            piece = (choices[0].get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter()
            text.append(piece)
    return "".join(text), (first or time.perf_counter()) - sent


def round_line(figures: dict[str, dict[str, Any]]) -> str:
    return "  ".join(
        f"{name} {f['session_s']:.1f} s (TTFT {' / '.join(f'{t:.1f}' for t in f['ttft_s'])})"
        for name, f in figures.items()
    )


def ratio_summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over rounds of relay / each peer: the session's time and each turn's TTFT."""
    summary: dict[str, Any] = {}
    turns = len(rounds[0]["relay"]["ttft_s"])
    for peer, label in (("mlx_lm", "mlx_lm.server"), ("llama", "llama-server")):
        if peer not in rounds[0]:
            continue
        session = [r["relay"]["session_s"] / r[peer]["session_s"] for r in rounds]
        per_turn = [[r["relay"]["ttft_s"][t] / r[peer]["ttft_s"][t] for r in rounds] for t in range(turns)]
        summary[f"relay / {label} session"] = {
            "median": statistics.median(session),
            "range": [min(session), max(session)],
        }
        summary[f"relay / {label} TTFT per turn (medians)"] = [statistics.median(t) for t in per_turn]
    summary["session s (medians)"] = {
        name: statistics.median(r[name]["session_s"] for r in rounds) for name in rounds[0]
    }
    return summary


if __name__ == "__main__":
    main()
