"""A module's file name says which side it is on: no two modules of the code base share one (docs/STYLE.md,
"Names say their side").

Issue #38 found ten names repeated across layers (gateway, exclusive, messages, plan, tokenize, ...): a trace or a
stack that names `gateway` or `messages` did not say whose. `tests/` and `bench/` are left out: a test module is named
after what it tests, and a bench after what it measures.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO
from tests.repo_files import repo_files

_OUTSIDE = ("tests", "bench", "deploy", "scripts")
# Names still shared, each with the reason it is not renamed yet; emptied as they are.
STILL_SHARED: frozenset[str] = frozenset()


def _code_modules() -> list[Path]:
    return [
        path
        for path in repo_files(".py")
        if path.name != "__init__.py" and path.relative_to(REPO).parts[0] not in _OUTSIDE
    ]


def test_no_two_modules_share_a_name() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in _code_modules():
        by_name[path.name].append(str(path.relative_to(REPO)))
    shared = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1 and name not in STILL_SHARED}
    assert not shared, shared


def test_the_walk_sees_the_layers() -> None:
    # A walk that found nothing would pass the test above: it must see every layer's modules.
    tops = {path.relative_to(REPO).parts[0] for path in _code_modules()}
    assert {"edge", "pipeline", "stages", "store", "wire", "workers", "fleet"} <= tops
