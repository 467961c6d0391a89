"""One file of a pull: what the Hub lists for it, its progress as `huggingface_hub` reports it, and its check.

`huggingface_hub` reports a download's bytes through a tqdm class it is handed; `bar_class` makes one that draws
nothing and passes the running count to a function instead. `file_ok` checks a downloaded file against the
Hub's listing: an LFS file's sha256, any other file's git blob id (sha1 over `blob <size>\\0` and the bytes).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import attrs

_CHUNK = 1 << 20


@attrs.frozen(kw_only=True)
class RemoteFile:
    name: str
    size: int
    # The LFS object's sha256 for a file in LFS (weights); None for a file in git.
    sha256: str | None = None
    # git's object id; for an LFS file that of its pointer.
    blob_id: str | None = None

    @property
    def digest(self) -> str:
        """`sha256:<hex>` (Ollama's form), or `sha1:<git blob id>`; `unchecked` where the Hub lists neither."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        return f"sha1:{self.blob_id}" if self.blob_id else "unchecked"


class FileBar:
    """What `huggingface_hub` calls of a tqdm (it builds a class that is not tqdm's with keywords only, and uses it
    as a context manager), drawing nothing: each update goes to `moved` with the bytes so far."""

    moved: ClassVar[Callable[[int], None]]

    def __init__(self, **kwargs: Any) -> None:
        self.count = int(kwargs.get("initial") or 0)
        type(self).moved(self.count)

    def __enter__(self) -> FileBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def close(self) -> None:
        pass

    def update(self, n: float | None = 1) -> None:
        # A negative step is huggingface_hub rolling back a resume the server did not honour.
        self.count += int(n or 0)
        type(self).moved(self.count)


def bar_class(moved: Callable[[int], None]) -> type[FileBar]:
    """A `FileBar` class of its own (huggingface_hub instantiates the class it is given) reporting to `moved`."""
    return type("PullBar", (FileBar,), {"moved": staticmethod(moved)})


def file_ok(file: RemoteFile, path: Path) -> bool:
    """Whether the downloaded file is the one the Hub lists (True where the Hub lists no digest)."""
    if file.sha256:
        return _hash(hashlib.sha256(), path, b"") == file.sha256
    if file.blob_id:
        header = b"blob %d\0" % path.stat().st_size
        return _hash(hashlib.sha1(), path, header) == file.blob_id
    return True


def _hash(digest: Any, path: Path, prefix: bytes) -> str:
    digest.update(prefix)
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return str(digest.hexdigest())
