"""The layering is a test, not a hope (docs/STYLE.md, "Layering is tested"; DESIGN.md "Layout").

Every import in `pipeline/`, `stages/` and `wire/` is read with `ast`,
including imports inside functions and under `if TYPE_CHECKING:`, and
checked against the rules:

- `wire/` imports neither `stages/`, `anyio`, `quart` nor `mlx`;
- `stages/` imports neither `wire/` nor `quart`;
- `pipeline/` imports nothing of ours (`stages`, `wire`, `app`) and no `mlx`;
- `fleet/` (several models: the file, residency policy, the hosts) drives engines: no `wire/`, `quart` or `mlx`,
  and no lower layer imports it;
- no layer imports `app`, `edge`, `tests` or `bench`, which sit above all three;
- only the model thread's modules and model loading import `mlx.core`.

`mlx` here means the whole MLX stack, `mlx` and `mlx_lm`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

LAYERS = ("pipeline", "stages", "wire", "fleet")
MLX = {"mlx", "mlx_lm"}
# app.py and the HTTP edge (edge/) import every layer, and so does a model worker process (workers/); tests/ and bench/
# sit above them: no layer imports them.
ABOVE = {"app", "edge", "tests", "bench", "workers"}
FORBIDDEN = {
    "wire": {"stages", "fleet", "anyio", "quart", *MLX, *ABOVE},
    "stages": {"wire", "fleet", "quart", *ABOVE},
    "pipeline": {"stages", "wire", "fleet", *MLX, *ABOVE},
    "fleet": {"wire", "quart", *MLX, *ABOVE},
}
# The gateway's model thread and its helpers, and model loading / the built-in model builders.
MLX_CORE_ALLOWED = {
    "stages/gateway.py", "stages/models/loading.py", "stages/sampling.py", "stages/models/demo.py",
    # The gateway's rows: what they hold goes to the prompt cache, evaluated first.
    "stages/batch_rows.py",
    "stages/models/gguf.py",
    # Which backend MLX runs on (the plan prices prefill attention by it).
    "stages/kv/machine.py",
    # The shape-true model builder, and the adapter that rebuilds cache layers for the model thread.
    "stages/models/shaped.py", "stages/models/shaped_embedding.py", "stages/models/mlx_internals.py",
    # Random LoRA adapters for the demo models.
    "stages/models/demo_adapter.py",
    # The quantized KV cache the batch holds (its layers and the generator that makes them).
    "stages/models/quantized_kv.py",
    # A row alone, decoded on the model thread as mlx-lm's generate_step does.
    "stages/single_row.py",
    # Embeddings and scores: forward passes the model thread runs between steps.
    "stages/embed.py",
    # A sharded model: the group, each rank's slice, the step messages and their replay (the model threads of every
    # rank).
    "stages/shard/cluster.py", "stages/shard/transport.py", "stages/shard/replicated.py", "stages/shard/follower.py",
    "stages/shard/work.py",
}


def modules() -> list[Path]:
    found = sorted(path for layer in LAYERS for path in (REPO / layer).rglob("*.py"))
    assert found, "no sources found"
    return found


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


def imports_of(path: Path) -> list[tuple[int, str]]:
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    return imported(path.read_text(encoding="utf-8"), package)


def label(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


SOURCES = modules()


def violations(relative: str, names: list[tuple[int, str]]) -> list[str]:
    """The imports of the file at `relative` (e.g. "wire/sse.py") that break a rule."""
    layer = relative.split("/")[0]
    broken = [(line, module) for line, module in names if module.split(".")[0] in FORBIDDEN[layer]]
    if relative not in MLX_CORE_ALLOWED:
        broken += [(line, m) for line, m in names if m == "mlx.core" or m.startswith("mlx.core.")]
    return [f"{relative}:{line} imports {module}" for line, module in sorted(set(broken))]


@pytest.mark.parametrize("path", SOURCES, ids=label)
def test_layer_imports(path: Path) -> None:
    """Each module imports only what DESIGN.md's layout allows, and mlx.core only where MLX may run."""
    assert violations(label(path), imports_of(path)) == []


@pytest.mark.parametrize(
    ("relative", "source", "broken"),
    [
        pytest.param("wire/x.py", "import anyio\n", ["anyio"], id="wire-anyio"),
        pytest.param("wire/x.py", "from stages.sink import CompletionSink\n", ["stages.sink", "stages.sink.CompletionSink"],
                     id="wire-stages"),
        pytest.param("wire/x.py", "def f():\n    import quart\n", ["quart"], id="wire-quart-in-function"),
        pytest.param("wire/x.py", "import mlx_lm\n", ["mlx_lm"], id="wire-mlx_lm"),
        pytest.param("stages/x.py", "from wire import sse\n", ["wire", "wire.sse"], id="stages-wire"),
        pytest.param("stages/x.py", "import quart\n", ["quart"], id="stages-quart"),
        pytest.param("stages/x.py", "import app\n", ["app"], id="stages-app"),
        pytest.param("wire/x.py", "from edge.guard import trace_id\n", ["edge.guard", "edge.guard.trace_id"], id="wire-edge"),
        pytest.param("stages/sink.py", "import mlx.core as mx\n", ["mlx.core"], id="sink-mlx-core"),
        pytest.param("stages/chat.py", "from mlx import core\n", ["mlx.core"], id="chat-from-mlx-import-core"),
        pytest.param("pipeline/x.py", "from stages import messages\n", ["stages", "stages.messages"],
                     id="pipeline-stages"),
        pytest.param("pipeline/x.py", "import mlx\n", ["mlx"], id="pipeline-mlx"),
        pytest.param("pipeline/x.py", "import anyio, attrs, structlog\n", [], id="pipeline-allowed"),
        pytest.param("stages/x.py", "import anyio\nimport mlx_lm\nimport jinja2\n", [], id="stages-allowed"),
        pytest.param("stages/gateway.py", "import mlx.core as mx\n", [], id="gateway-mlx-core"),
        pytest.param("stages/sampling.py", "import mlx.core as mx\n", [], id="sampling-mlx-core"),
        pytest.param("wire/x.py", "from pipeline.errors import invalid\n", [], id="wire-pipeline"),
        pytest.param("stages/x.py", "from fleet.spec import ModelSpec\n", ["fleet.spec", "fleet.spec.ModelSpec"],
                     id="stages-fleet"),
        pytest.param("fleet/x.py", "import quart\n", ["quart"], id="fleet-quart"),
    ],
)
def test_the_rules_catch_each_violation(relative: str, source: str, broken: list[str]) -> None:
    """Each rule fires on a module that breaks it, and stays quiet on allowed imports."""
    package = relative.rsplit("/", 1)[0].replace("/", ".")
    found = violations(relative, imported(source, package))
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
