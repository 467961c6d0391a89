"""The README and docs/ as a reader follows them: links that resolve, a configuration page that is the settings."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from pipeline.settings import OTHER_VARIABLES, PREFIX, Settings

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# [text](target) and ![alt](target); a target ends at whitespace or the closing parenthesis.
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#{1,6} (.+)$", _FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def _links(page: Path) -> list[str]:
    return [target for target in _LINK.findall(_FENCE.sub("", page.read_text())) if not re.match(r"[a-z]+:", target)]


@pytest.mark.parametrize("page", PAGES, ids=[str(page.relative_to(REPO)) for page in PAGES])
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.is_relative_to(REPO) or not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)} links nowhere: {broken}"


def test_the_readme_fits_the_first_ten_minutes() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_the_configuration_page_documents_every_setting_and_no_other() -> None:
    table = [line for line in (REPO / "docs" / "configuration.md").read_text().splitlines() if line.startswith("| `")]
    documented = {re.match(r"\| `([A-Z0-9_]+)`", line).group(1) for line in table}  # type: ignore[union-attr]
    settings = {PREFIX + field.name.upper() for field in attrs.fields(Settings)}
    assert settings - documented == set(), "settings missing from docs/configuration.md"
    assert documented - settings - OTHER_VARIABLES == set(), "docs/configuration.md documents no such setting"
