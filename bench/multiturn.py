"""Multi-turn benchmark: time to first token per turn, prompt cache off vs on.

    python -m bench.multiturn [--model demo|tiny|shaped:NAME|PATH[,...]] [--turns 8]
        [--system-tokens 2000] [--repeats 1]

An agent-style conversation: a long system prompt, then turns that each
resend everything so far (the system prompt, every question, every answer)
with one new question, streamed at temperature 0. The same conversation
runs against mlx-relay with the prompt cache off (`MLX_RELAY_PROMPT_CACHE_BYTES=0`),
then against a fresh mlx-relay with it on, one server after the other, so
neither measures the other. Each server answers one unrelated warm-up
request first. The answers must be byte-identical between the two runs:
the cache may change speed, never output. `--repeats N` runs N distinct
conversations on each server and reports each turn's median, which steadies
the figures on a busy machine. Writes bench/out/multiturn.{json,png} and
server logs to bench/out/logs/. With several models (one per cache kind:
`--model shaped:qwen3-0.6b-2l,shaped:gemma3-1b-6l,shaped:qwen3.5-0.8b-4l`)
it also prints one summary row per model and writes multiturn-kinds.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs in the venv

from bench import report
from bench.servers import Server, free_port, relay_command, relay_env, started

OUT = Path(__file__).resolve().parent / "out"
# Generous: a cold 4k-token prefill on a small CPU takes several seconds.
_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
MODES = ("off", "on")
HEADER = ("turn", "prompt tokens", "cached (on)", "TTFT off ms", "TTFT on ms", "off/on", "same answer")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.multiturn", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        default="demo",
        help="demo, tiny, shaped:<name> (built locally; see stages/models/shaped.py), a model directory or a repo id; "
        "several, comma-separated, give one summary row each (e.g. one per cache kind)",
    )
    parser.add_argument("--turns", type=int, default=8, help="turns in the conversation (default 8)")
    parser.add_argument("--system-tokens", type=int, default=2000, help="system prompt length in tokens (default 2000)")
    parser.add_argument("--question-tokens", type=int, default=100, help="each new question, in tokens (default 100)")
    parser.add_argument("--max-tokens", type=int, default=64, help="each answer's max_tokens (default 64)")
    # Greedy answers of a random-weight model repeat one token; seeded sampling
    # gives varied text, a stricter test of "same output with the cache".
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="above 0: sample, seeded by the turn (default 0)"
    )
    parser.add_argument("--repeats", type=int, default=1, help="distinct conversations per server (default 1)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON, plot and logs go (default bench/out)")
    return parser


@attrs.frozen(kw_only=True)
class Turn:
    ttft_s: float
    total_s: float
    text: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    kinds = [_one_model(args, model) for model in args.model.split(",")]
    if len(kinds) > 1:
        _publish_kinds(args, kinds)


def _one_model(args: argparse.Namespace, model: str) -> dict[str, Any]:
    from stages.models.demo import DEMO_MODELS, ensure_demo_model
    from stages.models.loading import SHAPED
    from stages.models.shaped import MODELS as SHAPED_MODELS
    from stages.models.shaped import SHAPES, ensure_shaped_model

    if model in DEMO_MODELS:
        path = str(ensure_demo_model(model))
    elif model.startswith(SHAPED):
        path = str(ensure_shaped_model(model.removeprefix(SHAPED)))
    else:
        path = model
    texts = _Texts(Path(path))
    started_at = time.perf_counter()
    runs: dict[str, list[list[Turn]]] = {}
    server_stats: dict[str, Any] = {}
    with tqdm(total=len(MODES) * args.turns * args.repeats, unit="turn", desc="bench") as bar:
        for mode in MODES:
            bar.set_description(f"{model} cache {mode}")
            env = relay_env(model if model in DEMO_MODELS else path, frozenset(DEMO_MODELS))
            env["MLX_RELAY_PROMPT_CACHE_BYTES"] = "0" if mode == "off" else str(2**30)
            port = free_port()
            with started(f"multiturn-cache-{mode}", relay_command(port), port, env, args.out / "logs") as server:
                runs[mode] = [_conversation(server, texts, args, bar, repeat) for repeat in range(args.repeats)]
                server_stats[mode] = httpx.get(f"{server.url}/stats", timeout=10).json()
    shaped = SHAPED_MODELS.get(model.removeprefix(SHAPED)) if model.startswith(SHAPED) else None
    meta = {
        "model": model,
        "model_path": path,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "blas": server_stats["on"].get("blas"),
        "wall_s": time.perf_counter() - started_at,
        "cache_kind": SHAPES[shaped[0]].cache if shaped else "plain",
        "prompt_cache": server_stats["on"].get("prompt_cache"),
    }
    summary = _publish(args, model, runs, meta)
    return {"model": model, "cache_kind": meta["cache_kind"], **summary}


@attrs.define
class _Texts:
    """Deterministic prose sized in the served model's own tokens."""

    model_path: Path
    _tokenizer: Any = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))

    def sized(self, tokens: int, opening: str, sentence: str) -> str:
        """`opening`, then numbered sentences until the text is `tokens` tokens long."""
        parts, index = [opening], 0
        while len(self._tokenizer.encode(" ".join(parts)).ids) < tokens:
            index += 1
            parts.append(sentence.format(index))
        return " ".join(parts)


def _conversation(server: Server, texts: _Texts, args: argparse.Namespace, bar: tqdm, repeat: int) -> list[Turn]:
    system = texts.sized(
        args.system_tokens,
        # Distinct from the first word, so one conversation never warms another's cache.
        f"Conversation {repeat}. You are the support agent of a tool-using assistant. Follow the rules below.",
        "Rule {0}: when a request touches area {0}, check the ledger for area {0} first and answer in plain words.",
    )
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    with httpx.Client(timeout=_TIMEOUT) as client:
        _stream(client, server, [{"role": "user", "content": "Warm up: say anything."}], args.max_tokens, 0.0)
        turns = []
        for turn in range(1, args.turns + 1):
            question = texts.sized(
                args.question_tokens, f"Question {turn}.", "Detail {0}: say how step " + str(turn) + ".{0} goes."
            )
            messages.append({"role": "user", "content": question})
            result = _stream(client, server, messages, args.max_tokens, args.temperature, seed=turn)
            messages.append({"role": "assistant", "content": result.text})
            turns.append(result)
            bar.update(1)
    return turns


def _stream(
    client: httpx.Client,
    server: Server,
    messages: list[dict[str, str]],
    max_tokens: int,
    temperature: float,
    seed: int = 0,
) -> Turn:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    parts: list[str] = []
    usage: dict[str, Any] = {}
    with client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.read()[:300]!r}")
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or ():
                text = choice["delta"].get("content")
                if text:
                    first = first if first is not None else time.perf_counter()
                    parts.append(text)
    end = time.perf_counter()
    return Turn(
        ttft_s=(first or end) - start,
        total_s=end - start,
        text="".join(parts),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
    )


def _rows(runs: dict[str, list[list[Turn]]]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for index in range(len(runs["on"][0])):
        off, on = ([conversation[index] for conversation in runs[mode]] for mode in MODES)
        ttft_off, ttft_on = (statistics.median(t.ttft_s for t in turns) for turns in (off, on))
        same = sum(a.text == b.text for a, b in zip(off, on, strict=True))
        rows.append(
            (
                str(index + 1),
                str(on[0].prompt_tokens),
                str(int(statistics.median(t.cached_tokens for t in on))),
                f"{ttft_off * 1000:.0f}",
                f"{ttft_on * 1000:.0f}",
                f"{ttft_off / ttft_on:.1f}x",
                f"{same}/{len(on)}",
            )
        )
    return rows


def _publish(
    args: argparse.Namespace, model: str, runs: dict[str, list[list[Turn]]], meta: dict[str, Any]
) -> dict[str, Any]:
    rows = _rows(runs)
    later = [float(row[5].rstrip("x")) for row in rows[1:]]
    pairs = [(a, b) for off, on in zip(runs["off"], runs["on"], strict=True) for a, b in zip(off, on, strict=True)]
    identical = sum(a.text == b.text for a, b in pairs)
    summary = {
        "speedup_turn2_on_median": statistics.median(later) if later else None,
        "speedup_turn2_on_min": min(later) if later else None,
        "identical_answers": [identical, len(pairs)],
        "prompt_tokens_off_equal_on": all(a.prompt_tokens == b.prompt_tokens for a, b in pairs),
    }
    title = f"{model}: {args.turns} turns, {args.system_tokens}-token system prompt, max_tokens={args.max_tokens}"
    title += f", temperature {args.temperature} (seeded)" if args.temperature else ", greedy"
    title += f", median of {args.repeats} conversations" if args.repeats > 1 else ""
    print(f"\nMulti-turn benchmark: {title}\n")
    widths = [max(len(row[i]) for row in [HEADER, *rows]) for i in range(len(HEADER))]
    for row in [HEADER, tuple("-" * w for w in widths), *rows]:
        print("  ".join(cell.rjust(width) for cell, width in zip(row, widths)))
    print(
        f"\nturns 2-{args.turns}: TTFT {summary['speedup_turn2_on_median']:.1f}x lower with the cache (median), "
        f"{summary['speedup_turn2_on_min']:.1f}x at least; identical answers {identical}/{len(pairs)}; "
        f"BLAS: {meta['blas']}; total wall time {meta['wall_s']:.0f} s"
    )
    line = lambda row: "| " + " | ".join(row) + " |"  # noqa: E731
    print("\nMarkdown:\n\n" + "\n".join([line(HEADER), "|" + " ---: |" * len(HEADER), *map(line, rows)]) + "\n")
    keys = ("turns", "system_tokens", "question_tokens", "max_tokens", "temperature", "repeats")
    workload = {"model": model, **{key: getattr(args, key) for key in keys}}
    payload = {
        "workload": workload,
        "meta": meta,
        "summary": summary,
        "turns": {
            mode: [[attrs.asdict(t) for t in conversation] for conversation in conversations]
            for mode, conversations in runs.items()
        },
    }
    name = "multiturn" + (f"-{model.replace(':', '-').replace('/', '-')}" if "," in args.model else "")
    name += f"-t{args.temperature:g}" if args.temperature else ""
    report.write_json(args.out / f"{name}.json", payload)
    _plot(args.out / f"{name}.png", rows, title)
    print(f"wrote {args.out / f'{name}.json'} and {args.out / f'{name}.png'}")
    ttft = (
        {mode: statistics.median(t.ttft_s for c in runs[mode] for t in c[1:]) for mode in MODES}
        if args.turns > 1
        else {}
    )
    return {
        **summary,
        "ttft_turn2_on_median_ms": 1000 * ttft.get("on", 0.0),
        "ttft_turn2_off_median_ms": 1000 * ttft.get("off", 0.0),
    }


KIND_HEADER = ("cache kind", "model", "TTFT off ms (turns 2+)", "TTFT on ms (turns 2+)", "off/on", "same answers")


def _publish_kinds(args: argparse.Namespace, kinds: list[dict[str, Any]]) -> None:
    """One row per model (per cache kind): the medians over turns 2 and later."""
    rows = [
        (
            k["cache_kind"],
            k["model"],
            f"{k['ttft_turn2_off_median_ms']:.0f}",
            f"{k['ttft_turn2_on_median_ms']:.0f}",
            f"{k['speedup_turn2_on_median']:.1f}x",
            "{}/{}".format(*k["identical_answers"]),
        )
        for k in kinds
    ]
    line = lambda row: "| " + " | ".join(row) + " |"  # noqa: E731
    print("\nPer cache kind:\n\n" + "\n".join([line(KIND_HEADER), "|" + " --- |" * len(KIND_HEADER), *map(line, rows)]))
    name = "multiturn-kinds" + (f"-t{args.temperature:g}" if args.temperature else "")
    report.write_json(args.out / f"{name}.json", {"kinds": kinds})
    print(f"wrote {args.out / f'{name}.json'}")


def _plot(path: Path, rows: list[tuple[str, ...]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on build machines
    import matplotlib.pyplot as plt

    turns = [int(row[0]) for row in rows]
    fig, (ttft, tokens) = plt.subplots(1, 2, figsize=(12, 4.5))
    ttft.plot(turns, [float(row[3]) for row in rows], "s-", label="prompt cache off")
    ttft.plot(turns, [float(row[4]) for row in rows], "o-", label="prompt cache on")
    ttft.set(title="time to first token per turn", xlabel="turn", ylabel="ms", yscale="log")
    tokens.bar([t - 0.2 for t in turns], [int(row[1]) for row in rows], 0.4, label="prompt tokens")
    tokens.bar([t + 0.2 for t in turns], [int(row[2]) for row in rows], 0.4, label="served from the cache")
    tokens.set(title="prompt tokens per turn (cache on)", xlabel="turn", ylabel="tokens")
    for axis in (ttft, tokens):
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
