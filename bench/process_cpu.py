"""CPU seconds per 1,000 tokens for each process of one serving run: the front, the model worker, the peers."""

from __future__ import annotations

from collections.abc import Sequence

from bench import report

HEADER = (
    "N",
    "front",
    "worker",
    "front+worker",
    "in-process relay",
    "mlx_lm.server",
    "raw",
    "stream_generate",
    "worker / raw",
    "front+worker / mlx_lm.server",
)


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def rows(results: report.Results, levels: Sequence[int]) -> list[tuple[str, ...]]:
    out = []
    in_process = f"{report.RELAY} (in-process)"
    for n in levels:
        relay = results.get(report.RELAY, {}).get(n, {})
        front, worker = relay.get("cpu_front_s_per_1k_tokens"), relay.get("cpu_worker_s_per_1k_tokens")
        total = front + worker if front is not None and worker is not None else None
        single = results.get(in_process, {}).get(n, {}).get("cpu_s_per_1k_tokens")
        peer = results.get(report.PEER, {}).get(n, {}).get("cpu_s_per_1k_tokens")
        raw = results.get(report.RAW, {}).get(n, {}).get("cpu_s_per_1k_tokens")
        stream = results.get(report.STREAM, {}).get(n, {}).get("cpu_s_per_1k_tokens")
        raw_for_n = stream if n == 1 and stream is not None else raw
        cells = (front, worker, total, single, peer, raw, stream)
        out.append(
            (
                str(n),
                *(f"{v:.2f}" if v is not None else "-" for v in cells),
                _ratio(worker, raw_for_n),
                _ratio(total, peer),
            )
        )
    return out


def print_process_cpu(results: report.Results, levels: Sequence[int]) -> None:
    if not any("cpu_worker_s_per_1k_tokens" in row for row in results.get(report.RELAY, {}).values()):
        return
    print(
        "\nCPU s per 1,000 tokens, each process (worker / raw: against stream_generate at N=1, BatchGenerator above):\n"
    )
    table = rows(results, levels)
    print(report.plain_table(table, HEADER))
    print("\n" + report.markdown_table(table, HEADER))
