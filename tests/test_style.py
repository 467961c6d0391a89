"""The rules of docs/STYLE.md that ruff does not check: the module ceiling, and a layout the formatter owns.

ruff format and ruff check cover the layout, the line length and the lint; these cover what they cannot.
"""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.repo_files import repo_files

MODULES = repo_files(".py")
# docs/STYLE.md, "Size": split along a seam before this, never pack lines to stay under it.
CEILING = 400
# A comment that takes a statement away from the formatter (docs/STYLE.md, "Formatter and linter").
_SUPPRESSION = re.compile(r"#\s*fmt:\s*(?:skip|off)\b|#\s*yapf:\s*disable")


def test_the_modules_are_found() -> None:
    assert len(MODULES) > 100 and REPO / "app.py" in MODULES


def test_no_module_passes_the_ceiling() -> None:
    sizes = {path: len(path.read_text().splitlines()) for path in MODULES}
    over = {str(path.relative_to(REPO)): lines for path, lines in sizes.items() if lines > CEILING}
    assert not over, f'split these along a seam (docs/STYLE.md, "Size"): {over}'


def test_the_formatter_owns_every_statement() -> None:
    marked = [
        f"{path.relative_to(REPO)}:{number}"
        for path in MODULES
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if _SUPPRESSION.search(line)
    ]
    assert not marked, f"rewrite these statements so the formatter lays them out well: {marked}"
