"""The README and docs/ as a reader follows them: links that resolve, a configuration page that is the settings."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest

from pipeline.env_values import PREFIX
from pipeline.settings import OTHER_VARIABLES, Settings
from tests.conftest import REPO
from tests.repo_files import repo_files

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


STYLE = REPO / "docs" / "STYLE.md"
# Where comments and docs live: every tracked kind of source and prose outside the tool caches.
_CITING = repo_files(".py", ".md", ".toml", ".sh", ".yml", ".yaml")
# A rule cited by the first guide's number: an S and a number after "STYLE.md", or in parentheses.
_NUMBERED = re.compile(r"STYLE\.md,? S\d|\(S\d{1,2}[,)]|[,;] S\d{1,2}\)")
# A rule cited by name: the guide's path, a comma, then one or more section names, each in double quotes.
_NAMED = re.compile(r'STYLE\.md, ((?:"[^"]+"(?:, )?)+)')


def _style_sections() -> set[str]:
    return {heading.strip() for heading in re.findall(r"^#{2,3} (.+)$", STYLE.read_text(), re.M)}


def _citations(path: Path) -> list[tuple[int, str]]:
    return [(number, line) for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)]


def test_no_comment_cites_a_style_rule_by_number() -> None:
    numbered = [
        f"{path.relative_to(REPO)}:{number}"
        for path in _CITING
        for number, line in _citations(path)
        if _NUMBERED.search(line)
    ]
    assert not numbered, f"cite docs/STYLE.md's sections by name, not the first guide's numbers: {numbered}"


def test_every_cited_style_section_exists() -> None:
    sections = _style_sections()
    unknown = [
        f"{path.relative_to(REPO)}:{number}: {name}"
        for path in _CITING
        for number, line in _citations(path)
        for group in _NAMED.findall(line)
        for name in re.findall(r'"([^"]+)"', group)
        if name not in sections
    ]
    assert not unknown, f"docs/STYLE.md has no such section: {unknown}"
