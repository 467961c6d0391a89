"""DESIGN.md's Layout table read into rules: what each row's code may import of ours, and which rows reach which.

Used by tests/test_layering.py, which holds the code's imports to these rules and the table itself to having no
two rows that may import each other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import attrs

from tests.imports import circles


@attrs.frozen
class Rule:
    """What the code of one row of the Layout table may import of ours."""

    path: str
    everything: bool
    allowed: tuple[str, ...]

    def allows(self, target: str) -> bool:
        return self.everything or any(holds(entry, target) for entry in self.allowed)


def holds(entry: str, relative: str) -> bool:
    """Whether a table path (`stages/`, `app.py`) is, or holds, the file at `relative`."""
    return relative == entry or (entry.endswith("/") and relative.startswith(entry))


def read_rules(design: str) -> dict[str, Rule]:
    """The Layout table's rows, by path (`stages/kv/`, `app.py`)."""
    section = design.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rules: dict[str, Rule] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        path_cell, _, may = (cell.strip() for cell in line.strip().strip("|").split(" | "))
        path = path_cell.strip("`")
        rule = may.split(" — ", 1)[0]
        allowed = tuple(entry for entry in re.findall(r"`([^`]+)`", rule) if entry.endswith(("/", ".py")))
        rules[path] = Rule(path=path, everything=rule.startswith("everything"), allowed=allowed)
    return rules


def row_of(relative: str, rules: Mapping[str, Rule]) -> Rule | None:
    """The row a file belongs to: the longest path in the table that holds it."""
    holding = [path for path in rules if holds(path, relative)]
    return rules[max(holding, key=len)] if holding else None


def reached(rule: Rule, rules: Mapping[str, Rule]) -> set[str]:
    """The other rows whose code `rule`'s row may import: all of them for "everything", else the row each allowed
    path belongs to and every row under an allowed folder."""
    if rule.everything:
        return set(rules) - {rule.path}
    found = {path for entry in rule.allowed for path in rules if holds(entry, path)}
    found |= {holder.path for entry in rule.allowed if (holder := row_of(entry, rules)) is not None}
    return found - {rule.path}


def rounds(rules: Mapping[str, Rule]) -> list[list[str]]:
    """Groups of rows that may import one another: two rows that allow each other, or a longer round."""
    return circles({path: reached(rule, rules) for path, rule in rules.items()})
