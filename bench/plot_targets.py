"""Issue #37's ratios against their targets, in one figure: chat waves per model and N, agent replay per client.

    python -m bench.plot_targets --chat bench/out/interleaved.json [...] [--replay bench/out/agent_replay.json ...]
        [--out docs/real-models.png]

Reads the summaries the benches write: `bench.interleaved`'s interleaved.json (one per model) and
`bench.agent_replay`'s agent_replay.json. Each point is a median over rounds, its bar the rounds' min–max.
Needs the `bench` extra (matplotlib).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import attrs

# The names bench.interleaved's RATIOS and bench.agent_session's ratio_summary write; importing those modules
# would load MLX to draw a picture.
CHAT_RATIOS = {"relay / raw tok/s": 0.95, "relay / mlx_lm.server tok/s": 1.05}
REPLAY_RATIO, REPLAY_TARGET = "relay / mlx_lm.server session", 0.8
LEVELS = ("1", "4", "16")


@attrs.frozen
class Point:
    """One ratio's median over rounds and the rounds' range, under the label it is drawn with."""

    label: str
    median: float
    low: float
    high: float


def chat_points(path: Path) -> dict[str, list[Point]]:
    """Per #37 chat ratio, a point per N of one interleaved.json, labelled with its model."""
    summary = _read(path)
    points: dict[str, list[Point]] = {name: [] for name in CHAT_RATIOS}
    for level in LEVELS:
        figures = _get(_get(summary, "levels", path), level, path, "levels")
        for name in CHAT_RATIOS:
            ratio = _get(figures, name, path, f"level {level}")
            points[name].append(Point(f"{summary['model']}\nN={level}", ratio["median"], ratio["min"], ratio["max"]))
    return points


def replay_points(path: Path) -> list[Point]:
    """A point per client of one agent_replay.json: relay's session time over mlx_lm.server's."""
    summary = _read(path)
    points = []
    for client in _get(summary, "rounds", path):
        ratio = _get(_get(summary, client, path), REPLAY_RATIO, path, client)
        low, high = ratio["range"]
        points.append(Point(f"{summary['model']}\n{client}", ratio["median"], low, high))
    return points


def _read(path: Path) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads(path.read_text())
    if "model" not in summary:
        raise SystemExit(f"{path}: no `model`; not a bench summary")
    return summary


def _get(parent: dict[str, Any], key: str, path: Path, where: str = "the top") -> dict[str, Any]:
    """parent[key], or an error that names the file and what it lacks: a summary from an older bench, or a run cut
    short, should not draw as a figure with a point missing."""
    if key not in parent:
        raise SystemExit(f"{path}: no {key!r} at {where}; rerun the bench that writes it")
    value: dict[str, Any] = parent[key]
    return value


def plot(chat: list[dict[str, list[Point]]], replay: list[list[Point]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on build machines
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    panels = 2 if replay else 1
    fig, axes = plt.subplots(1, panels, figsize=(11 if replay else 8, 4.5), width_ratios=[3, 1][:panels], squeeze=False)
    waves = axes[0][0]
    for index, (name, target) in enumerate(CHAT_RATIOS.items()):
        points = [point for figures in chat for point in figures[name]]
        offset = (index - 0.5) * 0.2  # the two ratios of one N side by side
        _draw(waves, points, offset, f"C{index}", f"{name} (target ≥ {target}×)")
        waves.axhline(target, color=f"C{index}", linestyle="--", linewidth=1)
    waves.set(title="chat waves: relay's tok/s over each contender's", ylabel="ratio (median, min–max)")
    if replay:
        sessions = axes[0][1]
        _draw(sessions, [point for points in replay for point in points], 0.0, "C2", "relay / mlx_lm.server session")
        sessions.axhline(REPLAY_TARGET, color="C2", linestyle="--", linewidth=1, label=f"target ≤ {REPLAY_TARGET}×")
        sessions.set(title="agent replay: session wall time", ylabel="ratio (median, min–max)")
    for axis in axes[0]:
        axis.set_yscale("log")  # ranges reach past 6×; ratios read alike above and below 1
        times = FuncFormatter(lambda value, _: f"{value:g}×")
        axis.yaxis.set_major_formatter(times)
        axis.yaxis.set_minor_formatter(times)
        axis.tick_params(axis="y", which="minor", labelsize=7)
        axis.set_xlim(-0.6, len(axis.get_xticks()) - 0.4)
        axis.grid(alpha=0.3, axis="y")
        axis.legend(fontsize=8, loc="best")
    fig.suptitle("Issue #37's targets on real models (dashed: the target)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def _draw(axis: Any, points: list[Point], offset: float, color: str, label: str) -> None:
    xs = [index + offset for index in range(len(points))]
    medians = [point.median for point in points]
    spread = [[p.median - p.low for p in points], [p.high - p.median for p in points]]
    axis.errorbar(xs, medians, yerr=spread, fmt="o", color=color, capsize=3, label=label)
    axis.set_xticks(range(len(points)), [point.label for point in points], fontsize=8)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.plot_targets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--chat", type=Path, nargs="+", required=True, help="bench.interleaved's JSON, one per model")
    parser.add_argument("--replay", type=Path, nargs="+", default=[], help="bench.agent_replay's JSON")
    parser.add_argument("--out", type=Path, default=Path("docs/real-models.png"))
    args = parser.parse_args(argv)
    plot([chat_points(path) for path in args.chat], [replay_points(path) for path in args.replay], args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
