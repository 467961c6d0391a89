"""Structured-output benchmark: what constrained rows cost a shared batch.

    python -m bench.structured [--model demo|tiny|PATH] [--concurrency 8,16] [--max-tokens 64]

At each concurrency, three waves of simultaneous requests against one
mlx-relay: every row free, half the rows constrained by a grammar
(llguidance, `guided_regex`), every row constrained. The grammar cannot end
before `max_tokens`, so every request generates the same number of tokens
and the waves compare like with like. Prints aggregate tokens/s per wave
and the ratios to the free wave; writes bench/out/structured.{json,png}.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import attrs
import httpx
from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs in the venv

from bench import report
from bench.servers import free_port, relay_command, relay_env, started

OUT = Path(__file__).resolve().parent / "out"
# Far more characters than max_tokens can hold: no row finishes early.
_GRAMMAR = "[a-z ]{2000}"
_MIXES = {"free": 0.0, "half constrained": 0.5, "all constrained": 1.0}
_TIMEOUT = httpx.Timeout(600.0, connect=10.0)


@attrs.frozen(kw_only=True)
class Wave:
    concurrency: int
    mix: str
    tokens: int
    wall_s: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.structured", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo, tiny (built locally), a model directory or a repo id")
    parser.add_argument("--concurrency", default="8,16", help="comma-separated request counts (default 8,16)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--repeats", type=int, default=2, help="waves per mix, best kept (default 2)")
    parser.add_argument("--out", type=Path, default=OUT, help="where the JSON, plot and logs go (default bench/out)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",")]
    port = free_port()
    env = relay_env(args.model, frozenset({"demo", "tiny"}))
    waves: list[Wave] = []
    with started("relay-structured", relay_command(port), port, env, args.out / "logs") as server:
        asyncio.run(_wave(server.url, 1, 0.0, args.max_tokens, 0))  # warm-up: compile, first prefill
        bar = tqdm(total=len(levels) * len(_MIXES) * args.repeats, desc="waves", unit="wave")
        for level in levels:
            for mix, share in _MIXES.items():
                runs = []
                for repeat in range(args.repeats):
                    runs.append(asyncio.run(_wave(server.url, level, share, args.max_tokens, repeat)))
                    bar.update()
                best = max(runs, key=lambda run: run[0] / run[1])
                waves.append(Wave(concurrency=level, mix=mix, tokens=best[0], wall_s=best[1]))
        bar.close()
    _publish(args, waves)


async def _wave(url: str, level: int, share: float, max_tokens: int, repeat: int) -> tuple[int, float]:
    constrained = round(level * share)
    async with httpx.AsyncClient(timeout=_TIMEOUT) as client:
        start = time.perf_counter()
        counts = await asyncio.gather(
            *(
                _request(client, url, f"Request {repeat}.{i}: write a line.", max_tokens, i < constrained)
                for i in range(level)
            )
        )
        return sum(counts), time.perf_counter() - start


async def _request(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, constrained: bool) -> int:
    body: dict[str, object] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    if constrained:
        body["guided_regex"] = _GRAMMAR
    response = await client.post(f"{url}/v1/completions", json=body)
    response.raise_for_status()
    answer = response.json()
    tokens = int(answer["usage"]["completion_tokens"])
    if tokens != max_tokens:
        raise RuntimeError(f"a row stopped at {tokens} of {max_tokens} tokens: {answer['choices'][0]['finish_reason']}")
    return tokens


def _publish(args: argparse.Namespace, waves: list[Wave]) -> None:
    header = ("concurrency", "mix", "tok/s", "vs free")
    free = {w.concurrency: w.tokens_per_s for w in waves if w.mix == "free"}
    table = [
        (str(w.concurrency), w.mix, f"{w.tokens_per_s:.0f}", f"{w.tokens_per_s / free[w.concurrency]:.2f}x")
        for w in waves
    ]
    print(report.plain_table(table, header))
    print()
    print(report.markdown_table(table, header))
    args.out.mkdir(parents=True, exist_ok=True)
    report.write_json(
        args.out / "structured.json",
        {
            "model": args.model,
            "max_tokens": args.max_tokens,
            "waves": [attrs.asdict(w) | {"tokens_per_s": w.tokens_per_s} for w in waves],
        },
    )
    _plot(args.out / "structured.png", waves)


def _plot(path: Path, waves: list[Wave]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    levels = sorted({w.concurrency for w in waves})
    for offset, mix in enumerate(_MIXES):
        values = [next(w.tokens_per_s for w in waves if w.concurrency == level and w.mix == mix) for level in levels]
        axis.bar([i + offset * 0.27 for i in range(len(levels))], values, width=0.27, label=mix)
    axis.set_xticks([i + 0.27 for i in range(len(levels))], [str(level) for level in levels])
    axis.set_xlabel("concurrent requests")
    axis.set_ylabel("output tokens/s")
    axis.set_title("Constrained rows in a shared batch")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


if __name__ == "__main__":
    main()
