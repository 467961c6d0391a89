"""A GGUF repository pulled and converted once (stages/models/pull_gguf.py), against the loopback Hub (tests/hub.py)
serving the default model's real GGUF file; and which file a reference picks (stages/models/gguf_pick.py)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stages.models.gguf_pick import Wanted, choose_name, parse_reference, quant_of
from stages.models.pull import Converting, Fitted, Hub, Pulled, PullError, PullEvent
from stages.models.pull_gguf import converted_path, pull_model
from stages.models.sku import Planning
from tests.hub import Hub as LoopbackHub
from tests.hub import served_files

REPO = Path(__file__).resolve().parents[3]
SMOLLM2 = "test/smollm2-gguf"


def _gguf_header(architecture: str) -> bytes:
    """A GGUF file of no tensors whose one metadata key names `architecture`."""

    def text(value: str) -> bytes:
        return struct.pack("<Q", len(value.encode())) + value.encode()

    pairs = text("general.architecture") + struct.pack("<I", 8) + text(architecture)
    return b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + pairs + bytes(4096)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[LoopbackHub]:
    from stages.models.smollm2 import GGUF_FILE, gguf_path

    served = LoopbackHub()
    smollm2 = tmp_path / "smollm2"
    smollm2.mkdir()
    (smollm2 / GGUF_FILE).symlink_to(gguf_path())
    (smollm2 / "README.md").write_text("SmolLM2 135M Instruct, Q4_1\n")
    served.add(SMOLLM2, smollm2)
    several = tmp_path / "several"
    several.mkdir()
    for name in ("model-Q4_0.gguf", "model-Q8_0.gguf"):
        (several / name).write_bytes(_gguf_header("llama"))
    served.add("test/several", several)
    qwen = tmp_path / "qwen"
    qwen.mkdir()
    (qwen / "qwen2-0.5b-q8_0.gguf").write_bytes(_gguf_header("qwen2"))
    served.add("test/qwen2", qwen)
    with served.running() as running:
        yield running


def _pull(hub: LoopbackHub, tmp_path: Path, reference: str, events: list[PullEvent] | None = None) -> Path:
    return pull_model(
        reference,
        on_event=(events if events is not None else []).append,
        hub=Hub(endpoint=hub.url, cache_dir=tmp_path / "hf"),
        planning=Planning(),
        cache_root=tmp_path / "relay",
    )


def _greedy(path: Path, prompt: str = "The capital of France is") -> list[int]:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    loaded = load(str(path))
    model, tokenizer = loaded[0], loaded[1]
    steps = generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=8, sampler=make_sampler(temp=0.0))
    return [int(token) for token, _ in steps]


@pytest.mark.slow
def test_mlx_relay_pull_converts_a_gguf_repository_once(
    hub: LoopbackHub, smollm2_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {**os.environ, "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "hf")}
    env["MLX_RELAY_DEMO_CACHE"] = str(tmp_path / "relay")
    command = [sys.executable, "-m", "mlx_relay", "pull", SMOLLM2]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    commit = hub.repos[SMOLLM2].commit
    converted = converted_path(SMOLLM2, commit, "SmolLM2-135M-Instruct.Q4_1.gguf", tmp_path / "relay")
    assert Path(done.stdout.strip()) == converted
    assert "this machine: fits" in done.stderr and "converting SmolLM2-135M-Instruct.Q4_1.gguf" in done.stderr
    # The header came first, by a Range request, for the fit; then the file whole, and the README beside it.
    gets = [served for served in hub.fetched() if served.path.endswith(".gguf")]
    assert [get.range is not None and get.range.startswith("bytes=0-") for get in gets] == [True, False]
    assert sorted(set(served_files(hub))) == ["README.md", "SmolLM2-135M-Instruct.Q4_1.gguf"]
    # The same model as the built-in default: the same greedy tokens.
    assert _greedy(converted) == _greedy(smollm2_model)
    _pulled_again_is_a_no_op(hub, tmp_path, converted)
    _resolved_offline(hub, tmp_path, converted, monkeypatch)


def _pulled_again_is_a_no_op(hub: LoopbackHub, tmp_path: Path, converted: Path) -> None:
    before = len(hub.requests)
    written = (converted / "model.safetensors").stat().st_mtime_ns
    events: list[PullEvent] = []
    assert _pull(hub, tmp_path, SMOLLM2, events) == converted
    assert not [served for served in hub.requests[before:] if served.method == "GET" and "/resolve/" in served.path]
    assert not [event for event in events if isinstance(event, Converting)]
    assert isinstance(events[-1], Pulled) and events[-1].path == converted
    assert (converted / "model.safetensors").stat().st_mtime_ns == written


def _resolved_offline(hub: LoopbackHub, tmp_path: Path, converted: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from stages.models.loading import resolve_model

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("MLX_RELAY_DEMO_CACHE", str(tmp_path / "relay"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub.requests)
    info = resolve_model(SMOLLM2)
    assert info.path == converted and info.name == SMOLLM2
    assert info.context_window == 8192 and info.vocab_size == 49152
    assert len(hub.requests) == before


def test_several_gguf_files_without_a_choice_are_refused_naming_them(hub: LoopbackHub, tmp_path: Path) -> None:
    with pytest.raises(PullError) as refused:
        _pull(hub, tmp_path, "test/several")
    assert refused.value.kind == "ambiguous"
    assert "model-Q4_0.gguf" in str(refused.value) and "model-Q8_0.gguf" in str(refused.value)
    assert "test/several:FILE.gguf" in str(refused.value) and "--file" in str(refused.value)
    assert not list(served_files(hub)) and not (tmp_path / "hf").exists()


def test_an_unsupported_architecture_is_refused_from_the_header_alone(hub: LoopbackHub, tmp_path: Path) -> None:
    events: list[PullEvent] = []
    with pytest.raises(PullError) as refused:
        _pull(hub, tmp_path, "test/qwen2", events)
    assert refused.value.kind == "unsupported"
    assert str(refused.value) == (
        "qwen2-0.5b-q8_0.gguf: GGUF architecture 'qwen2' is not supported; mlx-relay converts llama and gemma3 "
        "GGUF files"
    )
    (get,) = hub.fetched()
    assert get.range == f"bytes=0-{hub.repos['test/qwen2'].files['qwen2-0.5b-q8_0.gguf'].size - 1}"
    assert not [event for event in events if isinstance(event, Fitted)]
    assert not (tmp_path / "hf").exists() and not (tmp_path / "relay").exists()


def test_a_named_file_is_the_one_pulled_and_only_it(hub: LoopbackHub, tmp_path: Path) -> None:
    """`REPO:FILE.gguf` picks among several: its header alone is read, and its (fake) llama metadata refused."""
    events: list[PullEvent] = []
    with pytest.raises(PullError, match="llama"):
        _pull(hub, tmp_path, "test/several:model-Q8_0.gguf", events)
    assert list(served_files(hub)) == ["model-Q8_0.gguf"] and hub.fetched()[0].range is not None


@pytest.mark.parametrize(
    ("reference", "wanted"),
    [
        ("owner/name", Wanted(repo="owner/name")),
        ("owner/name:v1.0", Wanted(repo="owner/name", revision="v1.0")),
        ("owner/name:model-Q8_0.gguf", Wanted(repo="owner/name", file="model-Q8_0.gguf")),
        ("hf.co/owner/name", Wanted(repo="owner/name", ollama=True)),
        ("hf.co/owner/name:latest", Wanted(repo="owner/name", ollama=True)),
        ("hf.co/owner/name:q4_k_m", Wanted(repo="owner/name", quant="q4_k_m", ollama=True)),
        ("huggingface.co/owner/name:x.gguf", Wanted(repo="owner/name", file="x.gguf", ollama=True)),
    ],
)
def test_references_read_as_a_revision_a_file_or_a_quantization(reference: str, wanted: Wanted) -> None:
    assert parse_reference(reference) == wanted


_NAMES = ["README.md", "Llama-3.2-1B-Q4_K_M.gguf", "Llama-3.2-1B-Q8_0.gguf", "mmproj-Llama-3.2-1B-f16.gguf"]


@pytest.mark.parametrize(
    ("reference", "names", "chosen"),
    [
        ("hf.co/o/n:Q8_0", _NAMES, "Llama-3.2-1B-Q8_0.gguf"),
        ("hf.co/o/n:q4_k_m", _NAMES, "Llama-3.2-1B-Q4_K_M.gguf"),
        # Ollama's default, Q4_K_M, where no tag names one.
        ("hf.co/o/n", _NAMES, "Llama-3.2-1B-Q4_K_M.gguf"),
        ("o/n:Llama-3.2-1B-Q8_0.gguf", _NAMES, "Llama-3.2-1B-Q8_0.gguf"),
        # The projector is no candidate unnamed: one model file is left.
        ("o/n", ["a-Q4_0.gguf", "mmproj-f16.gguf"], "a-Q4_0.gguf"),
        # A repository with safetensors is pulled as one, GGUF beside it or not.
        ("o/n", ["model.safetensors", "config.json", "model-Q4_0.gguf"], None),
        ("o/n", ["model.safetensors", "config.json"], None),
    ],
)
def test_the_file_chosen(reference: str, names: list[str], chosen: str | None) -> None:
    assert choose_name(names, parse_reference(reference)) == chosen


@pytest.mark.parametrize(
    ("reference", "names", "kind", "text"),
    [
        ("o/n", _NAMES, "ambiguous", "o/n has 2 GGUF files"),
        ("hf.co/o/n:Q5_K_M", _NAMES, "not_found", "it has F16, Q4_K_M, Q8_0"),
        ("o/n:absent.gguf", _NAMES, "not_found", "no file absent.gguf"),
        ("o/n", ["m-Q4_0-00001-of-00002.gguf"], "unsupported", "split GGUF"),
    ],
)
def test_the_choices_refused(reference: str, names: list[str], kind: str, text: str) -> None:
    with pytest.raises(PullError) as refused:
        choose_name(names, parse_reference(reference))
    assert refused.value.kind == kind and text in str(refused.value)


def test_quantization_names_in_file_names() -> None:
    assert quant_of("SmolLM2-135M-Instruct.Q4_1.gguf") == "Q4_1"
    assert quant_of("gemma-3-270m-it-IQ4_XS.gguf") == "IQ4_XS"
    assert quant_of("model.gguf") is None
