"""LoRA adapters: which ones the server serves, and which one a request asks for.

Adapters are mlx-lm's format (`adapter_config.json` + `adapters.safetensors`,
what `mlx_lm.lora` writes), listed at start-up as `name=path,...`
(`MLX_RELAY_ADAPTERS`). Each is served as a model id of its own beside the
base model's. A request picks one by its `model`, or by mlx-lm's server's
`adapters` field (the name, or the path it was listed with). Once the
server serves adapters, `model` must name one of its ids: with several
models behind one server an unknown name cannot be guessed, so it is a
404 `model_not_found` (a server with no adapters still answers any name
with its one model). The model thread's half (mounting the layers and
grouping rows by adapter) is `stages/model_thread/adapter_batches.py`. An alias
(`MLX_RELAY_MODEL_ALIASES`) names a served id, the base model's or an
adapter's, and resolves to it before that check.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import attrs

from pipeline.errors import ErrorKind, RequestError, invalid
from pipeline.requests import JsonValue

CONFIG = "adapter_config.json"
WEIGHTS = "adapters.safetensors"
# Kinds of mlx-lm fine-tune an adapter can be mounted over the base weights as.
_MOUNTABLE = ("lora", "dora")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


class AdapterError(ValueError):
    """An adapter listed at start-up that cannot be served."""


@attrs.frozen(kw_only=True)
class Adapter:
    name: str
    path: Path
    fine_tune_type: str
    num_layers: int
    # What it adds to the model's memory: its weights as stored.
    nbytes: int


def read_adapters(spec: str | None) -> tuple[Adapter, ...]:
    """The adapters of `name=path,...`, each checked; () for none.

    Raises:
        AdapterError: a malformed entry, a repeated name, or a folder that
            is not a mountable mlx-lm adapter.
    """
    adapters: list[Adapter] = []
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        name, sep, path = (part.strip() for part in item.partition("="))
        if not sep or not _NAME.fullmatch(name) or not path:
            raise AdapterError(
                f"MLX_RELAY_ADAPTERS entry {item.strip()!r} is not name=path (a name of letters, digits and ._:/@+-)"
            )
        if any(adapter.name == name for adapter in adapters):
            raise AdapterError(f"MLX_RELAY_ADAPTERS names the adapter {name!r} twice")
        adapters.append(_read_one(name, Path(path).expanduser()))
    return tuple(adapters)


def _read_one(name: str, path: Path) -> Adapter:
    config_path, weights = path / CONFIG, path / WEIGHTS
    if not config_path.is_file() or not weights.is_file():
        raise AdapterError(f"adapter {name!r}: {path} must hold {CONFIG} and {WEIGHTS} (mlx-lm's adapter format)")
    try:
        config = json.loads(config_path.read_text())
        kind = str(config.get("fine_tune_type", "lora"))
        num_layers = int(config["num_layers"])
        if kind != "full":
            lora = config["lora_parameters"]
            int(lora["rank"]), float(lora["scale"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise AdapterError(
            f"adapter {name!r}: {config_path} is not an mlx-lm adapter config ({type(error).__name__}: {error})"
        ) from None
    if kind not in _MOUNTABLE:
        raise AdapterError(
            f"adapter {name!r}: fine_tune_type {kind!r} cannot be mounted over the base model (serve it as a model)"
        )
    return Adapter(name=name, path=path, fine_tune_type=kind, num_layers=num_layers, nbytes=weights.stat().st_size)


@attrs.frozen
class ServedModels:
    """The model ids this server answers to: the base model's, then each adapter's."""

    base: str
    adapters: tuple[Adapter, ...] = ()
    # Other names, each for one of `ids` (edge/aliases.py checks them at start-up).
    aliases: Mapping[str, str] = attrs.field(factory=dict)
    # A dedicated embedding model's id: listed, and refused for generation.
    embedding: str | None = None
    # The adapter a request gets when it names the base model (or no model) and no adapter.
    default_adapter: str | None = attrs.field(default=None)

    @default_adapter.validator
    def _served_adapter(self, _attribute: object, value: str | None) -> None:
        if value is not None and all(adapter.name != value for adapter in self.adapters):
            served = ", ".join(adapter.name for adapter in self.adapters) or "none"
            raise AdapterError(f"the default adapter {value!r} is not one of the adapters served ({served})")

    @property
    def ids(self) -> tuple[str, ...]:
        return (self.base, *(adapter.name for adapter in self.adapters), *((self.embedding,) if self.embedding else ()))

    @property
    def adapter_bytes(self) -> int:
        return sum(adapter.nbytes for adapter in self.adapters)

    def knows(self, model_id: str) -> bool:
        return model_id in self.ids or model_id in self.aliases

    def adapter_of(self, body: JsonValue) -> str | None:
        """The adapter a request body asks for (None: the base model).

        Raises:
            RequestError: 404 `model_not_found` for a model or adapter this
                server does not serve; 400 when `model` and `adapters` disagree.
        """
        fields: Mapping[str, JsonValue] = body if isinstance(body, dict) else {}
        by_field = self._by_adapters_field(fields.get("adapters"))
        model = fields.get("model")
        by_model = self._by_model(model) if isinstance(model, str) and model else None
        if by_field is not None and by_model is not None and by_field != by_model:
            raise invalid(f"'adapters' asks for {by_field!r} but 'model' for {by_model!r}", param="adapters")
        return by_field or by_model or self.default_adapter

    def _by_model(self, model: str) -> str | None:
        model = self.aliases.get(model, model)
        if model == self.embedding:
            raise invalid(
                f"The model `{model[:200]}` is an embedding model: it serves /v1/embeddings, rerank and score, "
                "not generation",
                param="model",
                code="model_not_supported",
            )
        if not self.adapters or model == self.base:
            return None
        if any(adapter.name == model for adapter in self.adapters):
            return model
        raise not_found(model, "model", served=(*self.ids, *self.aliases))

    def _by_adapters_field(self, value: JsonValue) -> str | None:
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise invalid("'adapters' must be a string: a served adapter's name or path", param="adapters")
        for adapter in self.adapters:
            if value in (adapter.name, str(adapter.path)):
                return adapter.name
        raise not_found(value, "adapters", served=tuple(adapter.name for adapter in self.adapters))


def not_found(name: str, param: str, *, served: tuple[str, ...]) -> RequestError:
    listed = ", ".join(served) if served else "none"
    return RequestError(
        kind=ErrorKind.NOT_FOUND,
        message=f"The model `{name[:200]}` does not exist or you do not have access to it (served: {listed})",
        param=param,
        code="model_not_found",
    )
