"""Turn the measurements into a table, Markdown, JSON and a plot.

`results` maps a contender to its records by concurrency level:
"mlx-relay" and "mlx_lm.server" hold `load.summarize` dicts, "raw_batch"
(BatchGenerator) and "raw_stream" (stream_generate, level 1 only) hold
`baselines` records. A missing contender or level prints as "-".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Results = dict[str, dict[int, dict[str, Any]]]
RELAY, PEER, RAW, STREAM = "mlx-relay", "mlx_lm.server", "raw_batch", "raw_stream"

HEADER = (
    "N",
    "relay tok/s",
    "raw tok/s",
    "mlx_lm.server tok/s",
    "relay/raw",
    "relay/mlx_lm",
    "relay/stream_gen",
    "relay TTFT p50/p95 ms",
    "mlx_lm TTFT p50/p95 ms",
    "relay req tok/s",
    "mlx_lm req tok/s",
    "relay CPU s/1k tok",
    "mlx_lm CPU s/1k tok",
    "relay thread waits on loop",
)


def _get(results: Results, who: str, level: int, key: str) -> float | None:
    value = results.get(who, {}).get(level, {}).get(key)
    return float(value) if value is not None else None


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(top: float | None, bottom: float | None) -> str:
    return "-" if top is None or not bottom else f"{top / bottom:.2f}x"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ttft(results: Results, who: str, level: int) -> str:
    p50, p95 = _get(results, who, level, "ttft_p50_ms"), _get(results, who, level, "ttft_p95_ms")
    return "-" if p50 is None else f"{p50:.0f} / {_num(p95)}"


def rows(results: Results, levels: Sequence[int]) -> list[tuple[str, ...]]:
    table: list[tuple[str, ...]] = []
    for n in levels:
        relay, raw, peer = (_get(results, who, n, "tokens_per_s") for who in (RELAY, RAW, PEER))
        stream = _get(results, STREAM, n, "tokens_per_s")
        table.append(
            (
                str(n),
                _num(relay),
                _num(raw),
                _num(peer),
                _ratio(relay, raw),
                _ratio(relay, peer),
                _ratio(relay, stream),
                _ttft(results, RELAY, n),
                _ttft(results, PEER, n),
                _num(_get(results, RELAY, n, "request_decode_tps")),
                _num(_get(results, PEER, n, "request_decode_tps")),
                _num(_get(results, RELAY, n, "cpu_s_per_1k_tokens"), 2),
                _num(_get(results, PEER, n, "cpu_s_per_1k_tokens"), 2),
                _share(_get(results, RELAY, n, "loop_wait_share")),
            )
        )
    return table


CEILING_HEADER = (
    "N",
    "raw tok/s",
    "raw CPU s/1k tok",
    "client CPU s/1k tok",
    "ceiling tok/s",
    "ceiling/raw",
    "relay/ceiling",
)


def ceiling(raw_tokens_per_s: float, raw_cpu: float, client_cpu: float, cores: int) -> float:
    """The most tokens per second a server costing nothing could stream: the cores over raw mlx-lm's CPU per 1,000
    tokens plus the client's, and never past raw mlx-lm's own speed."""
    return min(cores * 1000 / (raw_cpu + client_cpu), raw_tokens_per_s)


def ceiling_rows(results: Results, levels: Sequence[int], cores: int) -> list[tuple[str, ...]]:
    """What the machine leaves any server: the model's own CPU per token (raw mlx-lm, in process) plus
    the client's for reading the streams, over the cores there are. A server that cost nothing itself
    could not go faster than `ceiling` while the client shares the machine with it."""
    table: list[tuple[str, ...]] = []
    for n in levels:
        raw, relay = _get(results, RAW, n, "tokens_per_s"), _get(results, RELAY, n, "tokens_per_s")
        raw_cpu, client_cpu = (
            _get(results, RAW, n, "cpu_s_per_1k_tokens"),
            _get(results, RELAY, n, "client_cpu_s_per_1k_tokens"),
        )
        # Raw's speed and CPU come from one record: both are there or neither is.
        known = raw is not None and raw_cpu is not None and client_cpu is not None
        capped = ceiling(raw, raw_cpu, client_cpu, cores) if known else None
        table.append(
            (
                str(n),
                _num(raw),
                _num(raw_cpu, 2),
                _num(client_cpu, 2),
                _num(capped),
                _ratio(capped, raw),
                _ratio(relay, capped),
            )
        )
    return table


def plain_table(table: Sequence[tuple[str, ...]], header: tuple[str, ...] = HEADER) -> str:
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    line = lambda row: "  ".join(cell.rjust(width) for cell, width in zip(row, widths))  # noqa: E731
    return "\n".join([line(header), line(tuple("-" * w for w in widths)), *map(line, table)])


def markdown_table(table: Sequence[tuple[str, ...]], header: tuple[str, ...] = HEADER) -> str:
    line = lambda row: "| " + " | ".join(row) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + " ---: |" * len(header), *map(line, table)])


def problems(results: Results, max_tokens: int) -> list[str]:
    """Everything that makes a number suspect: errors, short or estimated counts."""
    found = []
    for who in (RELAY, PEER, RAW):
        for level, record in sorted(results.get(who, {}).items()):
            for error in record.get("errors", [])[:3]:
                found.append(f"{who} N={level}: {error}")
            if len(record.get("errors", [])) > 3:
                found.append(f"{who} N={level}: {len(record['errors'])} errors in all")
            if record.get("short"):
                found.append(f"{who} N={level}: {record['short']} requests without exactly {max_tokens} tokens")
            if record.get("retries"):
                found.append(f"{who} N={level}: {record['retries']} reconnects after a transport error (in their TTFT)")
            if "chunks" in record.get("counted_by", []):
                found.append(f"{who} N={level}: no usage in the stream; tokens counted by text chunks (a lower bound)")
    return found


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n")


def publish(path: Path, header: tuple[str, ...], table: Sequence[tuple[str, ...]], payload: dict[str, Any]) -> None:
    """A small benchmark's last step: its table on stdout, its figures as JSON at `path`."""
    print(plain_table(table, header))
    write_json(path, payload)
    print(f"wrote {path}")


def plot(path: Path, results: Results, levels: Sequence[int], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on build machines
    import matplotlib.pyplot as plt

    fig, (speed, latency) = plt.subplots(1, 2, figsize=(12, 4.5))
    for who, label, style in (
        (RELAY, "mlx-relay", "o-"),
        (PEER, "mlx_lm.server", "s-"),
        (RAW, "raw BatchGenerator", "^--"),
    ):
        _line(speed, results, who, levels, "tokens_per_s", style, label)
    for who in sorted(name for name in results if name.startswith(RELAY + " (")):
        _line(speed, results, who, levels, "tokens_per_s", "d-.", who)  # the same server, started another way
    if _get(results, STREAM, 1, "tokens_per_s") is not None:
        speed.plot([1], [_get(results, STREAM, 1, "tokens_per_s")], "k*", markersize=12, label="raw stream_generate")
    speed.set(title="aggregate output tokens/s", xlabel="concurrent clients", ylabel="tokens/s")
    for who, label, color in ((RELAY, "mlx-relay", "C0"), (PEER, "mlx_lm.server", "C1")):
        _line(latency, results, who, levels, "ttft_p50_ms", "o-", f"{label} p50", color=color)
        _line(latency, results, who, levels, "ttft_p95_ms", "o:", f"{label} p95", color=color)
    latency.set(title="time to first token", xlabel="concurrent clients", ylabel="ms")
    for axis in (speed, latency):
        axis.set_xscale("log", base=2)
        axis.set_xticks(list(levels), [str(n) for n in levels])
        axis.grid(alpha=0.3)
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _line(
    axis: Any, results: Results, who: str, levels: Sequence[int], key: str, style: str, label: str, **kw: Any
) -> None:
    points = [(n, _get(results, who, n, key)) for n in levels]
    points = [(n, y) for n, y in points if y is not None]
    if points:
        axis.plot(*zip(*points), style, label=label, **kw)
