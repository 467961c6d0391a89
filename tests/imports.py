"""Reading a file's imports with `ast`, resolving them to our files, and finding import circles.

Used by tests/test_layering.py, which checks them against DESIGN.md's Layout table.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

from tests.conftest import REPO


def imported(source: str, package: str) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in `source`; relative imports are resolved against `package`."""
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names.append((node.lineno, module))
            # `from mlx import core` imports mlx.core too.
            names.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
    return names


def file_of(module: str, repo: Path = REPO) -> str | None:
    """The file of ours a dotted module name imports (`stages.messages` → `stages/messages.py`), or None."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        stem = "/".join(parts[:end])
        if (repo / f"{stem}.py").is_file():
            return f"{stem}.py"
        if (repo / stem / "__init__.py").is_file():
            return f"{stem}/__init__.py"
    return None


def resolved(names: list[tuple[int, str]]) -> list[tuple[int, str, str | None]]:
    """(line, module, the file of ours it imports or None), leaving out a package that is only the way to its
    modules: `from stages import messages` imports stages/messages.py, not what stages/__init__.py imports."""
    targets = {(line, module): file_of(module) for line, module in names}

    def only_the_way(line: int, module: str, target: str | None) -> bool:
        return (
            target is not None
            and target.endswith("/__init__.py")
            and any(
                at == line and other.startswith(f"{module}.") and found not in (None, target)
                for (at, other), found in targets.items()
            )
        )

    return [
        (line, module, target) for (line, module), target in targets.items() if not only_the_way(line, module, target)
    ]


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
    return found
