"""A GGUF file's header before its download: what a pull checks and plans from, without the weights.

The header (metadata, vocabulary included, then the tensor records) is read from the start of the file with one
`Range: bytes=0-N` request through `huggingface_hub`'s HTTP session, stopped as soon as the header is whole; a
server that ignores the range is read no further either. From it a pull refuses, before any weight is fetched,
an architecture mlx-relay does not convert (llama and gemma3 are; `stages/models/gguf.py`,
`stages/models/gguf_gemma3.py`) or a llama file of tensor types `mx.load` does not read, and it plans the fit
as `/fit` does, from the config the conversion would write and the file's size as the weights'.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stages.models.gguf_file import F16, F32, Q4_0, Q4_1, Q8_0, TYPE_NAMES, GGUFHeader, read_header
from stages.models.pull import Fitted, Hub, Manifest, PullError
from stages.models.pull_files import RemoteFile
from stages.models.sku import Planning, describe, model_shape, verdict

ARCHITECTURES = ("llama", "gemma3")
# What `mx.load` reads of a llama file (stages/models/gguf.py); Gemma 3 goes through numpy and reads K-quants.
LLAMA_TYPES = frozenset({F32, F16, Q4_0, Q4_1, Q8_0})
# The most a header may take: Llama 3's vocabulary and merges are about 9 MB.
HEADER_MAX_BYTES = 64 << 20


def remote_header(manifest: Manifest, file: RemoteFile, hub: Hub) -> GGUFHeader:
    """The header of `file` at the manifest's commit, from the first bytes of the file alone.

    Raises:
        PullError: `unsupported` (not a GGUF file, or a header past `HEADER_MAX_BYTES`) or `network`.
    """
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers

    from stages.models.gguf import GGUFError

    url = hf_hub_url(manifest.repo, file.name, revision=manifest.commit, endpoint=hub.endpoint)
    headers = {**build_hf_headers(token=hub.token), "Range": f"bytes=0-{min(file.size, HEADER_MAX_BYTES) - 1}"}
    try:
        with get_session().stream("GET", url, headers=headers, follow_redirects=True) as response:
            response.raise_for_status()
            return read_header(_Prefix(response.iter_bytes(), HEADER_MAX_BYTES), file.name)
    except GGUFError as error:
        raise PullError("unsupported", f"{manifest.repo}: {error}") from None
    except Exception as error:  # noqa: BLE001 - httpx's and huggingface_hub's errors, told in one line
        raise PullError("network", f"{manifest.repo}: {file.name}'s header could not be read: {error}") from None


def local_header(path: Path) -> GGUFHeader:
    """The header of a GGUF file on disk.

    Raises:
        GGUFError: not a GGUF file.
    """
    with path.open("rb") as handle:
        return read_header(handle, path.name)


def gguf_config(header: GGUFHeader, name: str) -> dict[str, Any]:
    """The config.json the conversion would write (without `quantization`).

    Raises:
        PullError: `unsupported`: an architecture not converted, a llama file of types `mx.load` cannot read, or
            a feature its converter refuses.
    """
    from stages.models.gguf import GGUFError, model_config
    from stages.models.gguf_gemma3 import gemma3_config

    architecture = header.metadata.get("general.architecture")
    if architecture not in ARCHITECTURES:
        raise PullError(
            "unsupported",
            f"{name}: GGUF architecture {architecture!r} is not supported; mlx-relay converts llama "
            "and gemma3 GGUF files",
        )
    if architecture == "llama" and (kinds := {kind for _, kind, _, _ in header.records} - LLAMA_TYPES):
        found = ", ".join(sorted(TYPE_NAMES.get(kind, f"type {kind}") for kind in kinds))
        raise PullError(
            "unsupported",
            f"{name}: llama GGUF tensors of type {found} are not converted (F32, F16, Q4_0, Q4_1 "
            "and Q8_0 are); choose another file of the repository",
        )
    try:
        return model_config(header.metadata) if architecture == "llama" else gemma3_config(header.metadata)
    except (GGUFError, KeyError) as error:
        raise PullError("unsupported", f"{name}: {error}") from None


def gguf_fit(header: GGUFHeader, file: RemoteFile, planning: Planning) -> Fitted:
    """This machine's verdict for the converted model: the header's config, the file's size as the weights'.

    Raises:
        PullError: `unsupported`, as `gguf_config`.
    """
    from stages.kv.machine import read_machine

    answer = verdict(model_shape(gguf_config(header, file.name), file.size), read_machine(), planning)
    return Fitted(verdict=answer, summary=describe(answer))


class _Prefix:
    """The start of a response body as a file `read_header` reads, taking chunks only as it needs them."""

    def __init__(self, chunks: Iterator[bytes], limit: int) -> None:
        self._chunks, self._limit = chunks, limit
        self._buffer = bytearray()
        self._at = 0

    def read(self, size: int, /) -> bytes:
        while len(self._buffer) < size and self._at + len(self._buffer) < self._limit:
            chunk = next(self._chunks, b"")
            if not chunk:
                break
            self._buffer += chunk
        taken = bytes(self._buffer[:size])
        del self._buffer[:size]
        self._at += len(taken)
        return taken

    def tell(self) -> int:
        return self._at
