"""Key and origin settings: the documented syntax, and the mistakes it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.keys import key_matches, load_keys, load_origins, presented_key
from pipeline.env_values import SettingsError


@pytest.mark.parametrize(
    ("spec", "keys"),
    [(None, ()), ("", ()), ("  ", ()), ("one", (b"one",)), (" a , b,,c ", (b"a", b"b", b"c"))],
)
def test_keys_from_a_comma_separated_list(spec: str | None, keys: tuple[bytes, ...]) -> None:
    assert load_keys(spec) == keys


def test_keys_from_a_file_skip_blanks_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team keys\n  first  \n\nsecond,with,commas\n   # indented comment\n")
    assert load_keys(f"@{path}") == (b"first", b"second,with,commas")


@pytest.mark.parametrize("spec", [",", " , ", "@{missing}", "@{empty}"])
def test_a_spec_naming_no_key_stops_startup(tmp_path: Path, spec: str) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(SettingsError, match="MLX_RELAY_API_KEY"):
        load_keys(spec.format(missing=tmp_path / "absent", empty=empty))


@pytest.mark.parametrize(
    ("authorization", "api_key", "presented"),
    [
        ("Bearer k", None, "k"),
        ("bearer  k ", None, "k"),
        ("BEARER k", "other", "k"),
        (None, "k", "k"),
        ("Basic abc", "k", "k"),
        ("Basic abc", None, None),
        (None, None, None),
    ],
)
def test_the_presented_key(authorization: str | None, api_key: str | None, presented: str | None) -> None:
    assert presented_key(authorization, api_key) == presented


def test_only_an_exact_key_matches() -> None:
    keys = (b"alpha", b"beta")
    assert key_matches("alpha", keys) and key_matches("beta", keys)
    assert not any(key_matches(k, keys) for k in ("alph", "alphaa", "ALPHA", "", "gamma"))
    assert key_matches("ключ", ("ключ".encode(),))


def test_origins_are_exact_scheme_host_port() -> None:
    assert load_origins(None) == frozenset()
    assert load_origins("https://a.example, http://localhost:3000/") == {"https://a.example", "http://localhost:3000"}
    for bad in ("*", "a.example", "https://a.example/path", "ftp://a.example"):
        with pytest.raises(SettingsError, match="MLX_RELAY_CORS_ORIGINS"):
            load_origins(bad)
