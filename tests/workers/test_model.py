"""workers/model.py: the worker builds its model side from the decisions its front sent, deciding none again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import llguidance.hf
import pytest
from llguidance import LLMatcher

from pipeline.settings import Settings
from stages.engine import decisions, weight_forms
from stages.engine.decisions import choose_markup, plan_memory, served_model
from stages.kv import machine, plan
from stages.messages import Grammar
from stages.models.loading import load_tokenizer
from stages.remote.crossing import SettingsIn, StartIn, ToWorker
from stages.remote.frames import decoder, encoder
from workers.model import open_model


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def front_start(settings: Settings) -> StartIn:
    """What the front decides at its start (stages/engine/startup.py does the same), as it crosses."""
    info = served_model(settings)
    family, _ = choose_markup(settings, load_tokenizer(info))
    served, fit, _ = plan_memory(settings, info, adapter_bytes=0, cluster=None)
    return StartIn(info=served, fit=fit, think=family.think)


async def test_the_worker_takes_the_fronts_plan_and_decides_nothing_again(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(demo_model="tiny")
    start = front_start(settings)
    first = SettingsIn(values={}, start=start)
    crossed = decoder(ToWorker).decode(encoder().encode(first))
    assert isinstance(crossed, SettingsIn) and crossed.start == start

    def decided_again(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the worker made a start-up decision its front had sent")

    for module, name in (
        (decisions, "assess"),
        (decisions, "plan_weights"),
        (decisions, "choose_family"),
        (decisions, "resolve_model"),
        (weight_forms, "float32_bytes"),
        (plan, "read_machine"),
        (machine, "_measure_bandwidth"),
    ):
        monkeypatch.setattr(module, name, decided_again)
    model = await open_model(settings, crossed.start)
    assert model.side.fit == start.fit and model.side.info == start.info
    assert model.side.think == start.think == ("<think>", "</think>")
    assert model.side.info.path == tiny_model


@pytest.mark.parametrize("warm", [True, False])
async def test_the_llguidance_tokenizer_is_built_before_ready_only_when_warming(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch, warm: bool
) -> None:
    built: list[int] = []
    real = llguidance.hf.from_tokenizer

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(llguidance.hf, "from_tokenizer", counted)
    settings = Settings(demo_model="tiny", warm_grammar=warm)
    model = await open_model(settings, front_start(settings))
    assert len(built) == (1 if warm else 0)
    # Unwarmed, the first constrained row builds it; warmed, it is not built again.
    grammar = Grammar(text=LLMatcher.grammar_from_lark('start: "yes" | "no"'), param="response_format")
    assert model.compiler.compile_grammar(grammar).grammar == grammar
    assert len(built) == 1
