"""The model thread's half of LoRA adapters: their layers, and rows grouped by adapter.

mlx-lm's LoRA layers (`mlx_lm/tuner/lora.py`) wrap one base layer and add
one adapter's low-rank update to every row that passes through it, so rows
of different adapters cannot share a forward pass. The gateway therefore
keeps one mlx-lm `BatchGenerator` per adapter (and one for the base
model), each batching its own rows, and runs one of them per step:

- Mounting is cheap. Each adapter's wrapper layers are built once, at load,
  around the model's own layers (mlx-lm's `load_adapters`, then the base
  layers are put back), so they share the base weights: an adapter costs
  only its A and B matrices, and mounting one swaps module references
  (`update_modules`); no weight moves. A step's graph captures the arrays
  of the layers mounted when it was built, so mlx-lm's one step of
  look-ahead stays with the adapter it was built under.
- Fair turns. The group that runs is the one that has rows and has waited
  longest since its last turn, for `turn_steps` steps; a group alone runs
  every step. So k busy groups each get one step in k, whatever their sizes.

`AdapterBatches` has the face of `BatchGenerator` that the gateway uses
(insert, remove, extract_cache, next, prompt_cache_nbytes, close), with
uids of its own, so the gateway's row table and KV account do not change.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import structlog

from stages.adapters import Adapter

log = structlog.get_logger(stage="gateway")

BASE = ""
Mount = list[tuple[str, Any]]


def build_mounts(model: Any, adapters: Sequence[Adapter]) -> tuple[Mount, dict[str, Mount]]:
    """The base layers each adapter replaces, and each adapter's wrapper layers; the model is left as it was.

    Raises:
        ValueError: an adapter's tensors do not fit the model (mlx-lm's message names them).
    """
    from mlx_lm.tuner.utils import load_adapters

    original = dict(model.named_modules())
    base: dict[str, Any] = {}
    mounts: dict[str, Mount] = {}
    for adapter in adapters:
        load_adapters(model, str(adapter.path))
        changed = [(name, module) for name, module in model.named_modules() if original.get(name, module) is not module]
        # Only the outermost replaced layers: a wrapper's own children are new modules too.
        outer = [(name, module) for name, module in changed if name in original and not _inside(name, changed)]
        for _, module in outer:
            module.eval()
        mounts[adapter.name] = outer
        base.update((name, original[name]) for name, _ in outer)
        _swap(model, [(name, original[name]) for name, _ in outer])
    return list(base.items()), mounts


def _inside(name: str, changed: Sequence[tuple[str, Any]]) -> bool:
    return any(name.startswith(other + ".") for other, _ in changed if other != name)


def _swap(model: Any, modules: Mount) -> None:
    from mlx.utils import tree_unflatten

    if modules:
        model.update_modules(tree_unflatten(modules))


def make_generator(model: Any, adapters: Sequence[Adapter], make: Callable[[], Any], *, turn_steps: int = 1) -> Any:
    """mlx-lm's `BatchGenerator` as `make` builds it, or one per adapter behind its face when there are adapters."""
    if not adapters:
        return make()
    base, mounts = build_mounts(model, adapters)
    log.info(
        "adapters.loaded",
        adapters=[adapter.name for adapter in adapters],
        layers={name: len(m) for name, m in mounts.items()},
    )
    return AdapterBatches(model=model, make=make, base=base, mounts=mounts, turn_steps=turn_steps)


def adapter_kwargs(adapter: str | None) -> dict[str, Any]:
    """What `insert` takes for a row of `adapter`: nothing for the base model, so a plain `BatchGenerator` takes it
    too."""
    return {} if adapter is None else {"adapter": adapter}


@attrs.define
class _Group:
    generator: Any
    # This group's uid -> the gateway's.
    uids: dict[int, int] = attrs.Factory(dict)
    last_turn: int = -1


@attrs.define
class AdapterBatches:
    """One `BatchGenerator` per adapter behind one generator's face; see the module's text."""

    _model: Any = attrs.field(alias="model")
    _make: Callable[[], Any] = attrs.field(alias="make")
    _base: Mount = attrs.field(alias="base")
    _mounts: dict[str, Mount] = attrs.field(alias="mounts")
    _turn_steps: int = attrs.field(default=1, alias="turn_steps")
    _groups: dict[str, _Group] = attrs.field(factory=dict, init=False)
    # The gateway's uid -> (group, that group's uid).
    _where: dict[int, tuple[str, int]] = attrs.field(factory=dict, init=False)
    _next_uid: int = attrs.field(default=0, init=False)
    _mounted: str = attrs.field(default=BASE, init=False)
    _current: str | None = attrs.field(default=None, init=False)
    _left: int = attrs.field(default=0, init=False)
    _steps: int = attrs.field(default=0, init=False)
    switches: int = attrs.field(default=0, init=False)
    # Prompt tokens a prefilling row takes per step, given to the group that runs; None: each group's own.
    prefill_step_size: int | None = attrs.field(default=None, init=False)
    switch_seconds: float = attrs.field(default=0.0, init=False)

    def insert(self, prompts: list[list[int]], *, adapter: str | None = None, **per_row: Any) -> list[int]:
        name = adapter or BASE
        if name != BASE and name not in self._mounts:
            raise KeyError(f"adapter {name!r} is not loaded")
        group = self._groups.get(name) or self._groups.setdefault(name, _Group(self._make()))
        ids = []
        for local in group.generator.insert(prompts, **per_row):
            uid, self._next_uid = self._next_uid, self._next_uid + 1
            group.uids[local] = uid
            self._where[uid] = (name, local)
            ids.append(uid)
        return ids

    def remove(self, uids: Sequence[int], return_prompt_caches: bool = False) -> dict[int, Any]:
        caches: dict[int, Any] = {}
        for _name, group, pairs in self._by_group(uids):
            found = group.generator.remove([local for _, local in pairs], return_prompt_caches=return_prompt_caches)
            caches.update((uid, found[local]) for uid, local in pairs if local in found)
            for uid, local in pairs:
                del group.uids[local], self._where[uid]
        return caches

    def extract_cache(self, uids: Sequence[int]) -> dict[int, Any]:
        caches: dict[int, Any] = {}
        for _, group, pairs in self._by_group(uids):
            found = group.generator.extract_cache([local for _, local in pairs])
            caches.update((uid, found[local]) for uid, local in pairs if local in found)
        return caches

    def next(self) -> tuple[list[Any], list[Any]]:
        name = self._choose()
        if name is None:
            return [], []
        self._mount(name)
        group = self._groups[name]
        group.last_turn, self._steps = self._steps, self._steps + 1
        if self.prefill_step_size is not None:
            group.generator.prefill_step_size = self.prefill_step_size
        prefilled, generated = group.generator.next()
        prefilled = [dataclasses.replace(r, uid=group.uids[r.uid]) for r in prefilled]
        translated = []
        for response in generated:
            uid = group.uids[response.uid]
            if response.finish_reason is not None:
                del group.uids[response.uid], self._where[uid]
            translated.append(dataclasses.replace(response, uid=uid))
        return prefilled, translated

    @property
    def model(self) -> Any:
        """The model with the base layers mounted: work between steps (embeddings, scores) runs without an adapter."""
        self._mount(BASE)
        return self._model

    @property
    def prompt_cache_nbytes(self) -> int:
        return sum(int(group.generator.prompt_cache_nbytes) for group in self._groups.values())

    def close(self) -> None:
        for group in self._groups.values():
            group.generator.close()
        self._mount(BASE)

    def _choose(self) -> str | None:
        busy = [name for name, group in self._groups.items() if group.uids]
        if self._current in busy and self._left > 0 and len(busy) > 1:
            self._left -= 1
            return self._current
        if not busy:
            return None
        # The busy group whose last turn is oldest; a group alone keeps running.
        self._current = min(busy, key=lambda name: self._groups[name].last_turn)
        self._left = self._turn_steps - 1
        return self._current

    def _mount(self, name: str) -> None:
        if name == self._mounted:
            return
        started = time.perf_counter()
        leaving = {path for path, _ in self._mounts.get(self._mounted, [])}
        _swap(self._model, [(path, module) for path, module in self._base if path in leaving])
        _swap(self._model, self._mounts.get(name, []))
        self._mounted = name
        self.switches += 1
        self.switch_seconds += time.perf_counter() - started

    def _by_group(self, uids: Sequence[int]) -> list[tuple[str, _Group, list[tuple[int, int]]]]:
        grouped: dict[str, list[tuple[int, int]]] = {}
        for uid in uids:
            if uid in self._where:
                name, local = self._where[uid]
                grouped.setdefault(name, []).append((uid, local))
        return [(name, self._groups[name], pairs) for name, pairs in grouped.items()]
