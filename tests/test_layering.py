"""The layering is a test, not a hope (docs/STYLE.md, "Layering is tested"; DESIGN.md "Layout").

The rules come from DESIGN.md's Layout table itself, so the doc cannot drift from the code. Each row's
"may import" cell, up to its first " — " (what follows is a note), names what code of ours the row's
folder or module may import:

- backticked paths (`pipeline/`, `stages/messages.py`): a folder allows everything under it, a file itself;
- "everything": any code of ours; "nothing of ours": none.

A module belongs to the row with the longest path that holds it, and may always import its own row.
Every import in the code is read with `ast`, including imports inside functions and under
`if TYPE_CHECKING:`. Beside the table, the third-party rules the table's notes state:

- `wire/` and `store/` import neither `anyio`, `quart` nor `mlx`; `stages/` and `fleet/` no `quart`;
  `pipeline/` and `fleet/` no `mlx`;
- below the app, only the model thread's modules and model loading import `mlx.core`.

`mlx` here means the whole MLX stack, `mlx` and `mlx_lm`. And no module outside `bench/` takes part in an
import circle, and no two rows of the table may import each other, directly or round several rows: a piece two
rows share lives in the lower one, or below both, so the table itself has no exception to allow.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.imports import circles, imported, resolved
from tests.layout import Rule, read_rules, rounds, row_of
from tests.repo_files import BENCH_OUT

DESIGN = REPO / "docs" / "DESIGN.md"
MLX = {"mlx", "mlx_lm"}
# Third-party packages a folder must not import, whatever its row allows of ours.
FORBIDDEN_THIRD_PARTY = {
    "wire": {"anyio", "quart", *MLX},
    "store": {"anyio", "quart", *MLX},
    "stages": {"quart"},
    "pipeline": {*MLX},
    "fleet": {"quart", *MLX},
}
# The gateway's model thread and its helpers, and model loading / the built-in model builders.
MLX_CORE_ALLOWED = {
    "stages/model_thread/gateway.py",
    "stages/models/loading.py",
    "stages/model_thread/sampling.py",
    "stages/models/demo.py",
    # The gateway's rows: what they hold goes to the prompt cache, evaluated first.
    "stages/model_thread/batch_rows.py",
    "stages/models/gguf.py",
    # Which backend MLX runs on (the plan prices prefill attention by it).
    "stages/kv/machine.py",
    # The shape-true model builder, and the adapter that rebuilds cache layers for the model thread.
    "stages/models/shaped.py",
    "stages/models/shaped_embedding.py",
    "stages/models/mlx_internals.py",
    # Random LoRA adapters for the demo models.
    "stages/models/demo_adapter.py",
    # Quantized layers made dense at load, with MLX's own arithmetic so the bits are its dequantize's (issue #37).
    "stages/models/dequantize.py",
    # A prefill's attention on the CPU backend, in numpy, in place of MLX's own (called inside the model's pass).
    "stages/models/cpu_attention.py",
    "stages/models/cpu_exp.py",
    "stages/models/cpu_matmul.py",
    # The quantized KV cache the batch holds (its layers and the generator that makes them).
    "stages/models/quantized_kv.py",
    # A row alone, decoded on the model thread as mlx-lm's generate_step does.
    "stages/model_thread/single_row.py",
    # A decode step whose greedy rows skip the vocabulary's normalization.
    "stages/model_thread/greedy_steps.py",
    # One forward pass over several segments of rows, and the batch step that runs its passes as one.
    "stages/models/mixed_pass.py",
    "stages/model_thread/mixed_steps.py",
    # Speculative decoding: a draft model's forward passes, the batch that verifies proposals, and a lone row's.
    "stages/model_thread/draft_model.py",
    "stages/model_thread/speculative_batch.py",
    "stages/model_thread/lone_speculation.py",
    "stages/model_thread/verification.py",
    # Embeddings and scores: forward passes the model thread runs between steps.
    "stages/model_thread/embed.py",
    # A sharded model: the group, each rank's slice, the step messages and their replay (every rank's model thread).
    "stages/shard/cluster.py",
    "stages/shard/transport.py",
    "stages/shard/replicated.py",
    "stages/shard/follower.py",
    "stages/shard/work.py",
    # A vision-language model: its loading, the tiny-vl builder, and image rows encoded and prefilled on the model
    # thread.
    "stages/models/vlm.py",
    "stages/models/tiny_vl.py",
    "stages/model_thread/vision_rows.py",
    # A Whisper model: building tiny-whisper, loading, and a transcription on the speech model's thread.
    "stages/models/whisper.py",
}
# The layers below the app where only the modules above may import mlx.core.
MLX_CORE_CHECKED = ("pipeline/", "stages/", "wire/", "fleet/", "store/")
# Folders whose code the table governs; tests/ and docs/ have rows too, but allow everything or hold no code.
CODE_ROOTS = (
    "app.py",
    "mlx_relay.py",
    "edge",
    "pipeline",
    "stages",
    "fleet",
    "workers",
    "wire",
    "store",
    "deploy",
    "bench",
)


RULES = read_rules(DESIGN.read_text(encoding="utf-8"))


def _under(root: str, pattern: str) -> list[Path]:
    """The files under a code root named by `pattern`, leaving out what the benches write (git ignores it)."""
    return [path for path in (REPO / root).rglob(pattern) if BENCH_OUT not in path.parents]


def sources() -> list[Path]:
    found = sorted(
        path for root in CODE_ROOTS for path in ([REPO / root] if root.endswith(".py") else _under(root, "*.py"))
    )
    assert found, "no sources found"
    return found


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])


def imports_of(path: Path) -> list[tuple[int, str]]:
    return imported(path.read_text(encoding="utf-8"), package_of(path))


def label(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


SOURCES = sources()


def violations(relative: str, names: list[tuple[int, str]], rules: Mapping[str, Rule] = RULES) -> list[str]:
    """The imports of the file at `relative` (e.g. "wire/sse.py") that break a rule."""
    own = row_of(relative, rules)
    assert own is not None, f"{relative} is in no row of DESIGN.md's Layout table"
    broken: set[tuple[int, str]] = set()
    for line, module, target in resolved(names):
        if target is not None:
            target_row = row_of(target, rules)
            if target_row is not own and not own.allows(target):
                broken.add((line, module))
        elif module.split(".")[0] in FORBIDDEN_THIRD_PARTY.get(relative.split("/")[0], set()):
            broken.add((line, module))
    if relative.startswith(MLX_CORE_CHECKED) and relative not in MLX_CORE_ALLOWED:
        broken |= {(line, m) for line, m in names if m == "mlx.core" or m.startswith("mlx.core.")}
    return [f"{relative}:{line} imports {module}" for line, module in sorted(broken)]


@pytest.mark.parametrize("path", SOURCES, ids=label)
def test_layer_imports(path: Path) -> None:
    """Each module imports only what its row of DESIGN.md's Layout table allows, and mlx.core only where MLX may run."""
    assert violations(label(path), imports_of(path)) == []


def test_the_table_names_every_folder_and_only_real_paths() -> None:
    """Every package of the code has its own row, and every path a row allows exists."""
    packages = {
        f"{init.parent.relative_to(REPO).as_posix()}/"
        for root in CODE_ROOTS
        if not root.endswith(".py")
        for init in _under(root, "__init__.py")
    }
    assert packages - set(RULES) == set()
    named = {entry for rule in RULES.values() for entry in rule.allowed} | {path for path in RULES if path != "docs/"}
    assert {entry for entry in named if not (REPO / entry).exists()} == set()


def test_no_two_rows_may_import_each_other() -> None:
    """Each row only imports rows below it: a row that allows a row that allows it back, directly or round several
    rows, is an exception to the layering, and the piece they share moves down instead."""
    assert rounds(RULES) == []


_TABLE_HEAD = "## Layout\n\n| path | owns | may import |\n| --- | --- | --- |\n"


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param(
            ["| `pipeline/` | runtime | nothing of ours |", "| `stages/` | stages | `pipeline/` |"], [], id="a-line"
        ),
        pytest.param(
            ["| `stages/a/` | a | `stages/b/x.py` — a note cannot excuse it |", "| `stages/b/` | b | `stages/a/` |"],
            [["stages/a/", "stages/b/"]],
            id="two-rows-allow-each-other",
        ),
        pytest.param(
            [
                "| `stages/` | root | `pipeline/` |",
                "| `stages/a/` | a | `stages/` |",
                "| `pipeline/` | p | `stages/a/` |",
            ],
            [["pipeline/", "stages/", "stages/a/"]],
            id="a-round-of-three-through-a-folder",
        ),
        pytest.param(
            ["| `app.py` | the app | everything |", "| `tests/` | tests | everything |"],
            [["app.py", "tests/"]],
            id="two-rows-of-everything",
        ),
        pytest.param(
            ["| `bench/` | benches | everything |", "| `deploy/` | deploy | nothing of ours — `bench/` imports it |"],
            [],
            id="one-row-of-everything",
        ),
        pytest.param(
            [
                "| `stages/` | root | `pipeline/` |",
                "| `stages/a/` | a | `stages/messages.py` |",
                "| `pipeline/` | p | nothing of ours |",
            ],
            [],
            id="a-room-over-a-file-of-the-root",
        ),
    ],
)
def test_the_round_finder_finds_rows_that_allow_each_other(rows: list[str], expected: list[list[str]]) -> None:
    """A folder allows the rows under it and a file its own row, and "everything" every row, so any round shows."""
    assert rounds(read_rules(_TABLE_HEAD + "\n".join(rows) + "\n")) == expected


SAMPLE_RULES = read_rules(
    """## Layout

| path | owns | may import |
| --- | --- | --- |
| `app.py` | the app | everything |
| `pipeline/` | runtime | nothing of ours — stdlib, anyio |
| `stages/` | stages | `pipeline/` — mlx |
| `stages/prompt/` | the prompt side | `pipeline/`, `stages/messages.py`, `stages/models/` — no `wire/` |
| `stages/models/` | models | `pipeline/` |
| `stages/reply/` | reply | `pipeline/`, `stages/messages.py` |
| `wire/` | formats | `pipeline/` — types only; no `stages/` |
| `store/` | the store | `pipeline/` |
| `edge/` | the edge | `pipeline/`, `wire/`, `store/`, `stages/` |
"""
)


@pytest.mark.parametrize(
    ("relative", "source", "broken"),
    [
        pytest.param("wire/x.py", "import anyio\n", ["anyio"], id="wire-anyio"),
        pytest.param(
            "wire/x.py",
            "from stages.reply.sink import CompletionSink\n",
            ["stages.reply.sink", "stages.reply.sink.CompletionSink"],
            id="wire-stages-despite-the-note",
        ),
        pytest.param("wire/x.py", "def f():\n    import quart\n", ["quart"], id="wire-quart-in-function"),
        pytest.param("wire/x.py", "import mlx_lm\n", ["mlx_lm"], id="wire-mlx_lm"),
        pytest.param("store/x.py", "from wire import openai\n", ["wire.openai"], id="store-wire"),
        pytest.param("stages/x.py", "from wire import sse\n", ["wire.sse"], id="stages-wire"),
        pytest.param("stages/x.py", "import quart\n", ["quart"], id="stages-quart"),
        pytest.param("stages/x.py", "import app\n", ["app"], id="stages-app"),
        pytest.param(
            "stages/messages.py", "from stages.prompt import chat\n", ["stages.prompt.chat"], id="root-imports-a-room"
        ),
        pytest.param(
            "stages/prompt/x.py",
            "from stages.reply.sink import CompletionSink\n",
            ["stages.reply.sink", "stages.reply.sink.CompletionSink"],
            id="prompt-reply",
        ),
        pytest.param(
            "stages/prompt/x.py",
            "from stages.models.loading import Tokenizer\nfrom stages import messages\n",
            [],
            id="prompt-allowed",
        ),
        pytest.param(
            "stages/prompt/x.py",
            "from stages.adapters import Adapter\n",
            ["stages.adapters", "stages.adapters.Adapter"],
            id="a-file-not-named",
        ),
        pytest.param("stages/prompt/x.py", "from .chat import ChatJobs\n", [], id="own-row-relative"),
        pytest.param(
            "wire/x.py", "from edge.guard import trace_id\n", ["edge.guard", "edge.guard.trace_id"], id="wire-edge"
        ),
        pytest.param("stages/reply/sink.py", "import mlx.core as mx\n", ["mlx.core"], id="sink-mlx-core"),
        pytest.param("stages/prompt/chat.py", "from mlx import core\n", ["mlx.core"], id="chat-from-mlx-import-core"),
        pytest.param("pipeline/x.py", "from stages import messages\n", ["stages.messages"], id="pipeline-stages"),
        pytest.param("pipeline/x.py", "import mlx\n", ["mlx"], id="pipeline-mlx"),
        pytest.param("pipeline/x.py", "import anyio, attrs, structlog\n", [], id="pipeline-allowed"),
        pytest.param("stages/x.py", "import anyio\nimport mlx_lm\nimport jinja2\n", [], id="stages-allowed"),
        pytest.param("stages/model_thread/gateway.py", "import mlx.core as mx\n", [], id="gateway-mlx-core"),
        pytest.param("wire/x.py", "from pipeline.errors import invalid\n", [], id="wire-pipeline"),
        pytest.param("edge/x.py", "import app\n", ["app"], id="edge-app"),
        pytest.param("app.py", "import edge.guard, stages.reply.sink\n", [], id="app-everything"),
    ],
)
def test_the_rules_catch_each_violation(relative: str, source: str, broken: list[str]) -> None:
    """Each rule read from a table fires on a module that breaks it, and stays quiet on allowed imports."""
    package = relative.rsplit("/", 1)[0].replace("/", ".") if "/" in relative else ""
    found = violations(relative, imported(source, package), SAMPLE_RULES)
    assert [entry.split(" imports ")[1] for entry in found] == sorted(broken)


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        pytest.param("import anyio.to_thread\n", "wire", {"anyio.to_thread"}, id="dotted"),
        pytest.param("def f():\n    import quart\n", "wire", {"quart"}, id="inside-a-function"),
        pytest.param(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mlx_lm import load\n",
            "pipeline",
            {"typing", "typing.TYPE_CHECKING", "mlx_lm", "mlx_lm.load"},
            id="type-checking-block",
        ),
        pytest.param("from mlx import core as mx\n", "stages", {"mlx", "mlx.core"}, id="from-mlx-import-core"),
        pytest.param("from . import sink\n", "stages", {"stages", "stages.sink"}, id="relative"),
        pytest.param("from ..x import y\n", "stages.sub", {"stages.x", "stages.x.y"}, id="relative-parent"),
    ],
)
def test_the_checker_sees_every_form_of_import(source: str, package: str, expected: set[str]) -> None:
    """The walk finds nested, TYPE_CHECKING, aliased and relative imports, so no form slips past the rules."""
    assert {module for _, module in imported(source, package)} == expected


def module_graph(paths: list[Path]) -> dict[str, set[str]]:
    """Each file of ours (as its path) → the files of ours it imports."""
    graph: dict[str, set[str]] = {}
    for path in paths:
        own = label(path)
        targets = {target for _, _, target in resolved(imports_of(path))}
        graph[own] = {target for target in targets if target is not None and target != own}
    return graph


def test_no_module_outside_bench_takes_part_in_an_import_circle() -> None:
    """Outside bench/, modules import one another in one direction only: no circle, however long."""
    graph = module_graph([path for path in SOURCES if not label(path).startswith("bench/")])
    assert circles(graph) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        pytest.param({"a": {"b"}, "b": {"c"}, "c": set()}, [], id="a-line"),
        pytest.param({"a": {"b"}, "b": {"a"}}, [["a", "b"]], id="two"),
        pytest.param({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]], id="three-and-a-tail"),
        pytest.param({"a": {"a"}}, [], id="itself"),
    ],
)
def test_the_circle_finder_finds_circles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert circles(graph) == expected


def test_every_package_is_installed_type_checked_and_first_party() -> None:
    """A new folder joins pyproject's wheel, mypy's packages and ruff's first-party list, as the others are."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    shipped = {
        init.parent.relative_to(REPO).as_posix().replace("/", ".")
        for root in CODE_ROOTS
        if not root.endswith(".py") and root not in ("bench", "deploy")
        for init in _under(root, "__init__.py")
    }
    tops = {name.split(".")[0] for name in shipped}
    modules = {root.removesuffix(".py") for root in CODE_ROOTS if root.endswith(".py")}
    assert set(project["tool"]["setuptools"]["packages"]) == shipped
    assert set(project["tool"]["setuptools"]["py-modules"]) == modules
    assert set(project["tool"]["mypy"]["packages"]) == tops
    assert set(project["tool"]["mypy"]["modules"]) == modules
    assert tops | modules <= set(project["tool"]["ruff"]["lint"]["isort"]["known-first-party"])
