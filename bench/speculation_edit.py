"""The copy-heavy edit workload of bench/speculation.py: a 132-line Python module to rewrite with one small change.

The file is fixed here (about 1,180 tokens in SmolLM2's and Gemma 3's
vocabularies) so that figures from different days read the same text. The
change is one function renamed (`format_report` to `render_report`: its
definition and two calls), so nearly all of a faithful rewrite is a copy of
the prompt, which is what prompt lookup proposes. Both prompts start the
reply with the file's first line, so the model begins copying at the top
rather than describing the file.
"""

from __future__ import annotations

from typing import Any

SOURCE = r'''"""A small inventory ledger: items, stock moves, and a report of what is low."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

# Below this many units an item is reported as low.
LOW_STOCK = 5
# Moves older than this many days are left out of the running totals.
HISTORY_DAYS = 90


@dataclass
class Item:
    sku: str
    name: str
    unit_price: float
    on_hand: int = 0
    tags: list[str] = field(default_factory=list)

    def value(self) -> float:
        return self.unit_price * self.on_hand


@dataclass
class Move:
    sku: str
    quantity: int
    day: date
    note: str = ""


class LedgerError(ValueError):
    """A move that the ledger cannot take."""


class Ledger:
    def __init__(self) -> None:
        self.items: dict[str, Item] = {}
        self.moves: list[Move] = []

    def add_item(self, item: Item) -> None:
        if item.sku in self.items:
            raise LedgerError(f"duplicate sku {item.sku}")
        self.items[item.sku] = item

    def apply_move(self, move: Move) -> None:
        item = self.items.get(move.sku)
        if item is None:
            raise LedgerError(f"unknown sku {move.sku}")
        if item.on_hand + move.quantity < 0:
            raise LedgerError(f"not enough {item.name} on hand for {move.quantity}")
        item.on_hand += move.quantity
        self.moves.append(move)

    def recent_moves(self, today: date) -> list[Move]:
        return [move for move in self.moves if (today - move.day).days <= HISTORY_DAYS]

    def low_items(self) -> list[Item]:
        return sorted(
            (item for item in self.items.values() if item.on_hand < LOW_STOCK),
            key=lambda item: item.on_hand,
        )

    def total_value(self) -> float:
        return sum(item.value() for item in self.items.values())


def load_items(path: Path) -> list[Item]:
    items = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            tags = [tag for tag in row.get("tags", "").split(";") if tag]
            items.append(Item(row["sku"], row["name"], float(row["unit_price"]), int(row["on_hand"]), tags))
    return items


def load_moves(path: Path) -> list[Move]:
    moves = []
    with path.open() as handle:
        for line in handle:
            record = json.loads(line)
            day = date.fromisoformat(record["day"])
            moves.append(Move(record["sku"], int(record["quantity"]), day, record.get("note", "")))
    return moves


def build_ledger(items_path: Path, moves_path: Path) -> Ledger:
    ledger = Ledger()
    for item in load_items(items_path):
        ledger.add_item(item)
    for move in load_moves(moves_path):
        ledger.apply_move(move)
    return ledger


def format_report(ledger: Ledger, today: date) -> str:
    lines = [f"Inventory report for {today.isoformat()}", ""]
    lines.append(f"Items: {len(ledger.items)}")
    lines.append(f"Total value: {ledger.total_value():.2f}")
    lines.append(f"Moves in the last {HISTORY_DAYS} days: {len(ledger.recent_moves(today))}")
    low = ledger.low_items()
    if low:
        lines.append("")
        lines.append("Low stock:")
        for item in low:
            lines.append(f"  {item.sku}  {item.name:<30} {item.on_hand:>4} left")
    return "\n".join(lines)


def save_report(ledger: Ledger, today: date, path: Path) -> None:
    path.write_text(format_report(ledger, today) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: ledger ITEMS.csv MOVES.jsonl REPORT.txt")
        return 2
    ledger = build_ledger(Path(argv[1]), Path(argv[2]))
    save_report(ledger, date.today(), Path(argv[3]))
    print(format_report(ledger, date.today()))
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv))
'''
OLD_NAME, NEW_NAME = "format_report", "render_report"
_ASK = f"the function `{OLD_NAME}` renamed to `{NEW_NAME}`"


def chat_prompt(tokenizer: Any) -> list[int]:
    """An instruct model's prompt: the file and the request in a user turn, the reply begun with the file."""
    request = (
        f"Here is a Python file:\n```python\n{SOURCE}```\nRewrite the whole file with {_ASK}. "
        "Output the complete file and nothing else."
    )
    turn = list(tokenizer.apply_chat_template([{"role": "user", "content": request}], add_generation_prompt=True))
    return turn + list(tokenizer.encode(_reply_start(), add_special_tokens=False))


def completion_prompt(tokenizer: Any) -> list[int]:
    """A base model's prompt (Gemma 3 270M is one): the file, then the same file with the change, begun."""
    return list(tokenizer.encode(completion_text()))


def completion_text() -> str:
    """`completion_prompt`'s text (a server's raw completion)."""
    return (
        f"Here is the file ledger.py:\n```python\n{SOURCE}```\n\nHere is the same file with {_ASK}:\n" + _reply_start()
    )


def _reply_start() -> str:
    return "```python\n" + SOURCE.splitlines()[0] + "\n"
