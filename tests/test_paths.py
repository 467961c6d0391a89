"""Paths the prose names are paths in the repository: docs, the README, and every docstring and comment.

A module moved or split leaves its old path behind in the text that described it (issue #38 found seven such
docstrings). Here any repository path in that text, a file (`stages/engine/engine.py`, `docs/STYLE.md`) or a
folder (`stages/remote/`), must exist, so a move that forgets its readers fails here.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO
from tests.repo_files import repo_files

# The repository's top-level folders: a path that starts with one of them is ours.
_TOPS = "app|bench|deploy|docs|edge|fleet|pipeline|scripts|stages|store|tests|wire|workers"
# Not inside a longer path or a URL (`mlx_lm/models/cache.py`, `github.com/org/repo/docs/x.md`) nor a module's
# dotted name; a file with an extension, or a folder written with its slash.
_PATH = re.compile(rf"(?<![\w./-])(?:{_TOPS})/(?:[\w-]+/)*(?:[\w.-]*\w\.(?:py|md|toml|sh|json|ya?ml|cfg|jinja)\b)?")
# What the benches write, git-ignored: a fresh clone has none of it until a bench runs.
_OUTPUTS = "bench/out/"
# Paths in another project's repository, which the prose names as theirs: (the file naming it, the path).
ELSEWHERE = frozenset({("bench/llama_server.py", "docs/speculative.md")})
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SOURCES = [path for path in repo_files(".py") if not path.is_relative_to(REPO / _OUTPUTS)]


def _docstrings(body: list[ast.stmt]) -> Iterator[tuple[int, str]]:
    """The docstrings of the classes and functions among these statements and in their blocks, at any depth."""
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring
        # Statements only, never expressions: a walk of every node took seconds over the repository.
        for block in ("body", "orelse", "finalbody", "handlers"):
            yield from _docstrings(getattr(node, block, []))


def _comments(source: str) -> Iterator[tuple[int, str]]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def prose(path: Path) -> Iterator[tuple[int, str]]:
    """A file's prose with its line: a page whole, a module's docstrings and comments."""
    text = path.read_text()
    if path.suffix == ".md":
        yield from enumerate(text.splitlines(), start=1)
        return
    lines = [line for line in text.splitlines() if _PATH.search(line)]
    if not lines:
        return  # a module that names no path anywhere is not parsed
    tree = ast.parse(text)
    if (docstring := ast.get_docstring(tree, clean=False)) is not None:
        yield 1, docstring
    yield from _docstrings(tree.body)
    if any("#" in line for line in lines):
        yield from _comments(text)


def missing_paths(path: Path) -> list[str]:
    """`file:line: path` for each path the file's prose names that is not in the repository."""
    missing, name = [], str(path.relative_to(REPO))
    for line, text in prose(path):
        for named in _PATH.findall(text):
            ours = not named.startswith(_OUTPUTS) and (name, named) not in ELSEWHERE
            if ours and not (REPO / named).exists():
                missing.append(f"{name}:{line}: {named}")
    return missing


def test_the_pattern_finds_repository_paths_and_nothing_else() -> None:
    text = "see `stages/remote/frames.py`, docs/STYLE.md and tests/e2e/ (not mlx_lm/models/cache.py, stages.remote)"
    assert _PATH.findall(text) == ["stages/remote/frames.py", "docs/STYLE.md", "tests/e2e/"]
    assert _PATH.findall("https://github.com/ml-explore/mlx/blob/main/docs/index.md") == []


def test_every_path_the_docs_name_exists() -> None:
    missing = [entry for page in PAGES for entry in missing_paths(page)]
    assert not missing, "\n".join(missing)


def test_every_path_a_docstring_or_comment_names_exists() -> None:
    missing = [entry for source in SOURCES for entry in missing_paths(source)]
    assert not missing, "\n".join(missing)
