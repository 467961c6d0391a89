"""A Hugging Face Hub on loopback for the tests: real HTTP on 127.0.0.1, serving repositories from folders.

`huggingface_hub` talks to it as to the Hub (`HF_ENDPOINT`, or `endpoint=`): the revision API
(`/api/models/{repo}/revision/{rev}`, with `siblings`, their sizes, git blob ids and LFS sha256), the tree API
that `snapshot_download` lists, and `/{repo}/resolve/{rev}/{file}` with the headers it reads (`X-Repo-Commit`,
`ETag`, `X-Linked-Etag`, `X-Linked-Size`, `Content-Length`) and `Range` requests. Weight files are LFS files,
as on the Hub: their etag is the content's sha256; other files' is their git blob sha1.

Faults, each for one named file: `cut_once` sends the headers and half the body, then closes the connection
(the first GET only); `corrupt` serves a body of the right length with one byte changed. Every request is
logged (`requests`), so a test can tell what was fetched and how.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs

# Files the Hub keeps in LFS, as the Hub's default .gitattributes does.
_LFS_SUFFIXES = (".safetensors", ".gguf", ".bin", ".npz")
_CHUNK = 1 << 20


@attrs.frozen(kw_only=True)
class Served:
    method: str
    path: str
    range: str | None
    status: int


@attrs.frozen(kw_only=True)
class HubFile:
    name: str
    path: Path
    size: int
    blob_id: str
    sha256: str | None

    @property
    def etag(self) -> str:
        return self.sha256 or self.blob_id


@attrs.define
class Repo:
    commit: str
    files: dict[str, HubFile]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _git_blob_id(path: Path) -> str:
    """git's object id of a file: sha1 over `blob <size>\\0` and the bytes."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _hub_file(folder: Path, path: Path, declared: dict[str, str]) -> HubFile:
    name = path.relative_to(folder).as_posix()
    size = path.stat().st_size
    lfs = name.endswith(_LFS_SUFFIXES)
    # A test's huge sparse file is never read: its digest is declared (it is refused before any byte is fetched).
    sha = declared.get(name) or (_sha256(path) if lfs else None)
    blob = hashlib.sha1(f"lfs pointer {name} {sha}".encode()).hexdigest() if lfs else _git_blob_id(path)
    return HubFile(name=name, path=path, size=size, blob_id=blob, sha256=sha)


@attrs.define
class Hub:
    """The server and what it serves; start it with `running()`."""

    repos: dict[str, Repo] = attrs.field(factory=dict)
    requests: list[Served] = attrs.field(factory=list)
    cut_once: set[str] = attrs.field(factory=set)
    corrupt: set[str] = attrs.field(factory=set)
    url: str = ""

    def add(self, repo_id: str, folder: Path, *, declared_sha256: dict[str, str] | None = None) -> str:
        """Serve `folder` as `repo_id` at revision `main`; returns its commit id."""
        paths = sorted(path for path in folder.rglob("*") if path.is_file())
        files = {hub.name: hub for hub in (_hub_file(folder, path, declared_sha256 or {}) for path in paths)}
        commit = hashlib.sha1(json.dumps([[name, hub.etag] for name, hub in files.items()]).encode()).hexdigest()
        self.repos[repo_id] = Repo(commit=commit, files=files)
        return commit

    def fetched(self, method: str = "GET") -> list[Served]:
        """The file requests of `method` answered so far."""
        return [served for served in self.requests if served.method == method and "/resolve/" in served.path]

    def running(self) -> _Running:
        return _Running(self)


class _Running:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        handler = type("Handler", (_Handler,), {"hub": hub})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="loopback-hub", daemon=True)

    def __enter__(self) -> Hub:
        self.thread.start()
        self.hub.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        return self.hub

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the log is `hub.requests`

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        if path.startswith("/api/models/") and "/revision/" in path:
            repo_id, revision = path.removeprefix("/api/models/").split("/revision/", 1)
            self._revision(repo_id, revision)
        elif path.startswith("/api/models/") and "/tree/" in path:
            repo_id, revision = path.removeprefix("/api/models/").split("/tree/", 1)
            self._tree(repo_id, revision.split("/", 1)[0])
        elif "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            revision, _, name = rest.partition("/")
            self._file(repo_id, revision, name, body=body)
        else:
            self._error(404, "RepoNotFound", "no such route")

    def _repo(self, repo_id: str, revision: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo_id} not found")
        elif revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo

    def _revision(self, repo_id: str, revision: str) -> None:
        if (repo := self._repo(repo_id, revision)) is None:
            return
        siblings = [_sibling(hub) for hub in repo.files.values()]
        self._json({"id": repo_id, "modelId": repo_id, "sha": repo.commit, "private": False, "siblings": siblings})

    def _tree(self, repo_id: str, revision: str) -> None:
        if (repo := self._repo(repo_id, revision)) is None:
            return
        entries = [_tree_entry(hub) for hub in repo.files.values()]
        self._json(entries)

    def _file(self, repo_id: str, revision: str, name: str, *, body: bool) -> None:
        if (repo := self._repo(repo_id, revision)) is None:
            return
        hub = repo.files.get(name)
        if hub is None:
            self._error(404, "EntryNotFound", f"{name} does not exist", commit=repo.commit)
            return
        start = _range_start(self.headers.get("Range"))
        status = 206 if start else 200
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{hub.etag}"')
        if hub.sha256:
            self.send_header("X-Linked-Etag", f'"{hub.sha256}"')
            self.send_header("X-Linked-Size", str(hub.size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(hub.size - start))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{hub.size - 1}/{hub.size}")
        self.end_headers()
        self._log(status)
        if body:
            self._send_body(hub, start)

    def _send_body(self, hub: HubFile, start: int) -> None:
        data = hub.path.read_bytes()[start:]
        if hub.name in self.hub.corrupt and data:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        if hub.name in self.hub.cut_once:
            self.hub.cut_once.discard(hub.name)
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)
            return
        self.wfile.write(data)

    def _json(self, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._log(200)
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, *, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self._log(status)
        if self.command != "HEAD":
            self.wfile.write(data)

    def _log(self, status: int) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append(Served(method=self.command, path=path, range=self.headers.get("Range"), status=status))


def _range_start(header: str | None) -> int:
    """The first byte a `Range: bytes=N-` asks for; 0 for none."""
    if not header or not header.startswith("bytes="):
        return 0
    return int(header.removeprefix("bytes=").split("-", 1)[0] or 0)


def _sibling(hub: HubFile) -> dict[str, object]:
    sibling: dict[str, object] = {"rfilename": hub.name, "size": hub.size, "blobId": hub.blob_id}
    if hub.sha256:
        sibling["lfs"] = {"size": hub.size, "sha256": hub.sha256, "pointerSize": 134}
    return sibling


def _tree_entry(hub: HubFile) -> dict[str, object]:
    entry: dict[str, object] = {"type": "file", "oid": hub.blob_id, "size": hub.size, "path": hub.name}
    if hub.sha256:
        entry["lfs"] = {"oid": hub.sha256, "size": hub.size, "pointerSize": 134}
    return entry


def served_files(hub: Hub) -> Iterator[str]:
    """The names of the files whose bodies were served (GET), in order."""
    for served in hub.fetched("GET"):
        yield served.path.rsplit("/", 1)[-1]
