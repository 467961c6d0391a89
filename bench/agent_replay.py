"""Recorded Claude Code and Codex sessions replayed against mlx-relay, mlx_lm.server and llama-server.

    python -m bench.agent_replay [--model smollm2] [--rounds 3] [--turn-tokens 1000] [--max-tokens 32]
                                 [--clients claude,codex] [--turns N] [--window 8192] [--peer-prompt same|plain]
                                 [--no-llama-server]

mlx-relay gets each client's own request bodies (bench/agent_bodies.py: the project's fixtures of Claude Code,
Messages, and of Codex, Responses), streamed, turn by turn: each turn adds the model's answer, a call that reads
a file and its result, `--turn-tokens` tokens of this repository's source, until the prompt reaches the window
less the answer. mlx_lm.server and llama-server speak only Chat Completions: they get the same conversation as
chat messages. SmolLM2's template ignores tools, so mlx-relay describes them in the system message and writes
calls and results as text (stages/families/preamble.py), where mlx_lm.server drops them: by default the peers
are sent the messages mlx-relay renders (`--peer-prompt same`), so all three prefill the same prompt;
`--peer-prompt plain` sends the conversation with `tools` as a field and `tool` messages instead. Each turn's
prompt and cached tokens, as each server's usage reports them, are kept to show it.

The servers are bench.agent_session's (mlx-relay on the model, mlx_lm.server on its float32 copy, llama-server
on its GGUF file, one slot of the whole window), started once. A warm-up of two turns per client on each server
also measures the relay's prompt growth per turn, from which the number of turns that fills the window is
planned (`--turns` sets it instead). Each round then runs every client's session on each server, in an order
that rotates from round to round, on that round's own files (no round reuses another's cache); the report
gives, per client, each round's session time and per-turn TTFT, and the medians over rounds of relay /
mlx_lm.server and relay / llama-server (bench.agent_session's summary). Greedy, as agents' benchmarks run.

Writes agent_replay.json under --out, with mlx-relay's /stats after each of its sessions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer

from bench.agent_bodies import OPENER, Body, Step, chat_request, claude_request, codex_request, relay_chat_request
from bench.agent_session import OUT, ratio_summary, repo_sources, rotated, round_line, start_servers
from bench.llama_server import add_arguments as add_llama_arguments
from bench.servers import Server

_TIMEOUT = httpx.Timeout(900.0, connect=10.0)
# Room left in the window for a turn's answer running longer than planned (the words differ per server).
_SLACK = 64
Request = tuple[str, Body, dict[str, str]]
RELAY_REQUESTS: dict[str, Callable[[list[Step], int], Request]] = {"claude": claude_request, "codex": codex_request}
PEER_REQUESTS: dict[str, Callable[[str, list[Step], int], Request]] = {
    "same": relay_chat_request,
    "plain": chat_request,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2", help="a built-in name or a model directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--turn-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--clients", default="claude,codex")
    parser.add_argument("--turns", type=int, default=0, help="turns per session (default: as many as fill the window)")
    parser.add_argument("--window", type=int, default=8192, help="the model's context window, in tokens")
    parser.add_argument(
        "--peer-prompt",
        choices=("same", "plain"),
        default="same",
        help="the peers' chat messages: mlx-relay's own tool preamble, so all prefill one prompt (same), "
        "or the conversation with `tools` as a field, which a template that ignores tools drops (plain)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    add_llama_arguments(parser)
    args = parser.parse_args(argv)
    clients = args.clients.split(",")
    files = _cut_files(args)
    rounds: dict[str, list[dict[str, Any]]] = {client: [] for client in clients}
    with ExitStack() as stack:
        servers = start_servers(stack, args)
        turns = {client: _warm_up(servers, client, files[-2:], args) for client in clients}
        print(f"turns per session: {turns}", flush=True)
        for index in range(args.rounds):
            figures: dict[str, dict[str, Any]] = {client: {} for client in clients}
            start = index * max(turns.values())
            ordered = files[start:] + files[:start]
            for name in rotated(list(servers), index):
                for client in clients:
                    figures[client][name] = _session(
                        servers[name], client, ordered[: turns[client]], args.max_tokens, args.peer_prompt
                    )
            for client in clients:
                rounds[client].append(figures[client])
                print(f"round {index + 1} {client}: {round_line(figures[client])}", flush=True)
    report = {client: {**ratio_summary(per_round), **_prompts(per_round)} for client, per_round in rounds.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "agent_replay.json").write_text(json.dumps({"model": args.model, "rounds": rounds, **report}))
    print(json.dumps(report, indent=2))


def _cut_files(args: argparse.Namespace) -> list[tuple[str, str]]:
    """This repository's modules of at least `--turn-tokens` tokens, each cut to exactly that many."""
    from stages.models.loading import resolve_model

    tokenizer = Tokenizer.from_file(str(resolve_model(args.model).path / "tokenizer.json"))
    files = []
    for source in repo_sources():
        path, _, text = source.partition("\n")
        encoding = tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) >= args.turn_tokens:
            files.append((path.removeprefix("# "), text[: encoding.offsets[args.turn_tokens - 1][1]]))
    return files


def _warm_up(servers: dict[str, Server], client: str, files: list[tuple[str, str]], args: argparse.Namespace) -> int:
    """`client`'s turns per session, after a warm-up on every server: with `--turns`, one short turn; else two
    turns, whose prompt growth on the relay gives the turns that fill the window."""
    if args.turns:
        files = [(files[0][0], files[0][1][:1000])]
    growth = {name: _session(s, client, files, args.max_tokens, args.peer_prompt) for name, s in servers.items()}
    print(f"warm-up {client}: prompt tokens " + ", ".join(f"{n} {g['prompt_tokens']}" for n, g in growth.items()))
    if args.turns:
        return int(args.turns)
    first, second = growth["relay"]["prompt_tokens"]
    return 1 + (args.window - args.max_tokens - _SLACK - first) // (second - first)


def _session(
    server: Server, client: str, files: list[tuple[str, str]], max_tokens: int, peer_prompt: str
) -> dict[str, Any]:
    """One agent session on `server`: the time it took, and per turn its TTFT, prompt and cached tokens."""
    steps: list[Step] = []
    words = OPENER
    turns: list[dict[str, Any]] = []
    began = time.perf_counter()
    for path, text in files:
        steps.append(Step(words, path, text))
        if server.name == "relay":
            request = RELAY_REQUESTS[client](steps, max_tokens)
        else:
            request = PEER_REQUESTS[peer_prompt](client, steps, max_tokens)
        # A connection a turn: llama-server once closed a kept-alive one as the next turn was sent.
        with httpx.Client(timeout=_TIMEOUT) as http:
            turn = _turn(http, server.url, request)
        # Kept as written, white space too (stripping it cost every server the answer's cache hit); an
        # answer of no words (a call, or only white space) is still a turn the client records.
        answer = turn.pop("text")
        words = answer if answer.strip() else "OK."
        turns.append(turn)
    session_s = time.perf_counter() - began
    stats = httpx.get(f"{server.url}/stats", timeout=60).json() if server.name == "relay" else None
    figures = {"session_s": session_s, **{key: [t[key] for t in turns] for key in turns[0]}}
    return figures | ({"stats": stats} if stats is not None else {})


def _turn(http: httpx.Client, url: str, request: Request) -> dict[str, Any]:
    """One streamed turn: its text, TTFT (to the first piece of output of any kind) and the usage reported."""
    path, body, headers = request
    sent, first = time.perf_counter(), None
    text: list[str] = []
    usage: dict[str, int] = {}
    with http.stream("POST", f"{url}{path}", json=body, headers=headers) as response:
        if response.status_code != 200:
            raise SystemExit(f"{url}{path} answered {response.status_code}: {response.read()[:500]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            piece, output = _read_event(json.loads(line[6:]), usage)
            if output and first is None:
                first = time.perf_counter()
            text.append(piece)
    ttft = (first or time.perf_counter()) - sent
    return {"text": "".join(text), "ttft_s": ttft, **{k: usage.get(k, 0) for k in ("prompt_tokens", "cached_tokens")}}


def _read_event(event: dict[str, Any], usage: dict[str, int]) -> tuple[str, bool]:
    """An event of any of the three APIs: the text it adds and whether it is output; usage is noted on the way."""
    kind = event.get("type")
    if kind == "message_start":  # Messages: input_tokens leaves out the tokens read from the cache.
        counts = event["message"]["usage"]
        cached = counts.get("cache_read_input_tokens") or 0
        written = counts.get("cache_creation_input_tokens") or 0
        usage.update(prompt_tokens=counts["input_tokens"] + written + cached, cached_tokens=cached)
    elif kind == "content_block_delta":
        delta = event["delta"]
        return delta.get("text", ""), True
    elif kind in ("response.completed", "response.incomplete"):  # incomplete: cut at max_output_tokens
        counts = event["response"]["usage"]
        details = counts.get("input_tokens_details") or {}
        usage.update(prompt_tokens=counts["input_tokens"], cached_tokens=details.get("cached_tokens") or 0)
    elif isinstance(kind, str) and kind.startswith("response.") and kind.endswith(".delta"):
        return (event["delta"] if kind == "response.output_text.delta" else ""), True
    elif "choices" in event:
        if counts := event.get("usage"):
            details = counts.get("prompt_tokens_details") or {}
            usage.update(prompt_tokens=counts["prompt_tokens"], cached_tokens=details.get("cached_tokens") or 0)
        if timings := event.get("timings"):  # llama-server: the tokens its slot already held
            usage["cached_tokens"] = timings.get("cache_n", 0)
        delta = (event["choices"] or [{}])[0].get("delta") or {}
        piece = delta.get("content") or ""
        return piece, bool(piece or delta.get("tool_calls") or delta.get("reasoning_content"))
    return "", False


def _prompts(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    """Per server, the median over rounds of each turn's prompt and cached tokens, as the server reported them."""
    report: dict[str, Any] = {}
    for name in per_round[0]:
        for key in ("prompt_tokens", "cached_tokens"):
            turns = zip(*(r[name][key] for r in per_round), strict=True)
            report.setdefault(f"{key} per turn (medians)", {})[name] = [statistics.median(t) for t in turns]
    return report


if __name__ == "__main__":
    main()
