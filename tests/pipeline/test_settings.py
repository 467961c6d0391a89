"""pipeline/settings.py: settings read once from MLX_RELAY_* variables, validated."""

from __future__ import annotations

import attrs
import pytest

from pipeline.env_values import SettingsError
from pipeline.settings import Settings


def test_defaults_with_an_empty_environment() -> None:
    """No variables set: the defaults, which serve the demo model."""
    assert Settings.from_env({}) == Settings()
    assert Settings().model is None and Settings().demo_model == "smollm2"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({"MLX_RELAY_MODEL": "/models/qwen"}, {"model": "/models/qwen"}, id="model-path"),
        pytest.param({"MLX_RELAY_MODEL": "org/repo"}, {"model": "org/repo"}, id="model-repo-id"),
        pytest.param({"MLX_RELAY_DEMO_MODEL": "tiny"}, {"demo_model": "tiny"}, id="demo_model"),
        pytest.param({"MLX_RELAY_MODEL_NAME": "served"}, {"model_name": "served"}, id="model_name"),
        pytest.param({"MLX_RELAY_MAX_BATCH": "8"}, {"max_batch": 8}, id="max_batch"),
        pytest.param({"MLX_RELAY_MAX_BATCH": " 4 "}, {"max_batch": 4}, id="int-with-spaces"),
        pytest.param({"MLX_RELAY_MAX_PENDING": "0"}, {"max_pending": 0}, id="max_pending-zero"),
        pytest.param({"MLX_RELAY_ADMISSION_TIMEOUT": "0.5"}, {"admission_timeout": 0.5}, id="admission_timeout"),
        pytest.param({"MLX_RELAY_ADMISSION_TIMEOUT": "0"}, {"admission_timeout": 0.0}, id="admission_timeout-zero"),
        pytest.param({"MLX_RELAY_RETRY_AFTER": "5"}, {"retry_after": 5.0}, id="retry_after-int-text"),
        pytest.param({"MLX_RELAY_DRAIN_TIMEOUT": "1e1"}, {"drain_timeout": 10.0}, id="drain_timeout"),
        pytest.param({"MLX_RELAY_PREFILL_STEP_SIZE": "64"}, {"prefill_step_size": 64}, id="prefill_step_size"),
        pytest.param({"MLX_RELAY_PREPARE_CONCURRENCY": "1"}, {"prepare_concurrency": 1}, id="prepare_concurrency"),
        pytest.param({"MLX_RELAY_LOG_LEVEL": "debug"}, {"log_level": "debug"}, id="log_level"),
        pytest.param({"MLX_RELAY_LOG_LEVEL": "WARNING"}, {"log_level": "WARNING"}, id="log_level-upper"),
        pytest.param(
            {"MAX_BATCH": "1", "mlx_relay_max_batch": "1", "MLX_RELAY_DEMO_CACHE": "/tmp"},
            {},
            id="other-variables-ignored",
        ),
        pytest.param({"MLX_RELAY_SESSION_CACHE": "off"}, {"session_cache": False}, id="boolean-off"),
        # An explicit step budget is a fixed target, unless a ratio to the decode step is set with it.
        pytest.param(
            {"MLX_RELAY_STEP_BUDGET_MS": "50"}, {"step_budget_ms": 50.0, "step_budget_ratio": 0.0}, id="budget-fixed"
        ),
        pytest.param({"MLX_RELAY_STEP_BUDGET_RATIO": "3"}, {"step_budget_ratio": 3.0}, id="budget-ratio"),
        pytest.param(
            {"MLX_RELAY_STEP_BUDGET_MS": "50", "MLX_RELAY_STEP_BUDGET_RATIO": "2.5"},
            {"step_budget_ms": 50.0, "step_budget_ratio": 2.5},
            id="budget-both",
        ),
        pytest.param({"MLX_RELAY_SESSION_CACHE": " True "}, {"session_cache": True}, id="boolean-true"),
    ],
)
def test_from_env_reads_each_variable(environ: dict[str, str], expected: dict[str, object]) -> None:
    """Each MLX_RELAY_<FIELD> sets that field, parsed to the field's type; nothing else changes."""
    settings = Settings.from_env(environ)
    assert settings == attrs.evolve(Settings(), **expected)
    for name, value in expected.items():
        assert type(getattr(settings, name)) is type(value)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        pytest.param("MLX_RELAY_MAX_BATCH", "abc", id="max_batch-word"),
        pytest.param("MLX_RELAY_MAX_BATCH", "1.5", id="max_batch-fraction"),
        pytest.param("MLX_RELAY_MAX_BATCH", "", id="max_batch-empty"),
        pytest.param("MLX_RELAY_MAX_BATCH", "0", id="max_batch-zero"),
        pytest.param("MLX_RELAY_MAX_BATCH", "-1", id="max_batch-negative"),
        pytest.param("MLX_RELAY_MAX_PENDING", "-1", id="max_pending-negative"),
        pytest.param("MLX_RELAY_ADMISSION_TIMEOUT", "soon", id="admission_timeout-word"),
        pytest.param("MLX_RELAY_ADMISSION_TIMEOUT", "-0.1", id="admission_timeout-negative"),
        pytest.param("MLX_RELAY_ADMISSION_TIMEOUT", "nan", id="admission_timeout-nan"),
        pytest.param("MLX_RELAY_RETRY_AFTER", "-1", id="retry_after-negative"),
        pytest.param("MLX_RELAY_DRAIN_TIMEOUT", "-5", id="drain_timeout-negative"),
        pytest.param("MLX_RELAY_PREFILL_STEP_SIZE", "0", id="prefill_step_size-zero"),
        pytest.param("MLX_RELAY_PREPARE_CONCURRENCY", "0", id="prepare_concurrency-zero"),
        pytest.param("MLX_RELAY_STEP_BUDGET_RATIO", "-1", id="step_budget_ratio-negative"),
        # configure_logging looks the level up by name; an unknown one must fail here, clearly.
        pytest.param("MLX_RELAY_LOG_LEVEL", "verbose", id="log_level-unknown"),
        # A typo must not silently read as false.
        pytest.param("MLX_RELAY_SESSION_CACHE", "ture", id="boolean-typo"),
        pytest.param("MLX_RELAY_SESSION_CACHE", "", id="boolean-empty"),
    ],
)
def test_a_bad_value_is_a_settings_error_naming_the_setting(variable: str, value: str) -> None:
    """A value of the wrong type or range fails start-up with a SettingsError that names the setting."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: value})
    assert isinstance(caught.value, ValueError)
    field = variable.removeprefix("MLX_RELAY_").lower()
    assert field in str(caught.value).lower()


@pytest.mark.parametrize(
    ("variable", "suggestion"),
    [
        pytest.param("MLX_RELAY_MEMORY_BUDGT", "MLX_RELAY_MEMORY_BUDGET", id="typo"),
        pytest.param("MLX_RELAY_MAXBATCH", "MLX_RELAY_MAX_BATCH", id="missing-underscore"),
        pytest.param("MLX_RELAY_ZZZ", None, id="nothing-close"),
    ],
)
def test_an_unknown_variable_stops_start_up_naming_it(variable: str, suggestion: str | None) -> None:
    """A misspelt MLX_RELAY_* variable would be silently ignored: it fails, with a did-you-mean."""
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({variable: "1"})
    message = str(caught.value)
    assert message.startswith(variable)
    if suggestion is not None:
        assert f"did you mean {suggestion}?" in message
    else:
        assert "MLX_RELAY_MEMORY_BUDGET" in message  # the known names are listed


def test_from_env_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no mapping given, the settings come from os.environ."""
    monkeypatch.setenv("MLX_RELAY_MAX_PENDING", "3")
    assert Settings.from_env().max_pending == 3


def test_settings_are_frozen() -> None:
    """Settings are read once; nothing can change them afterwards."""
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Settings().max_batch = 2  # type: ignore[misc]


def test_model_aliases_are_alias_equals_served_id_pairs() -> None:
    from pipeline.settings import parse_aliases

    settings = Settings.from_env({"MLX_RELAY_MODEL_ALIASES": "gpt-4o=served, claude-sonnet-4-5 = served,"})
    assert parse_aliases(settings.model_aliases) == {"gpt-4o": "served", "claude-sonnet-4-5": "served"}
    assert parse_aliases(None) == {}


@pytest.mark.parametrize("value", ["gpt-4o", "=served", "gpt-4o=", "a=x,a=x"])
def test_malformed_model_aliases_fail_naming_the_setting(value: str) -> None:
    with pytest.raises(SettingsError, match="model_aliases"):
        Settings.from_env({"MLX_RELAY_MODEL_ALIASES": value})
