"""Workers forked by the front's zygote (stages/remote/zygote.py): what a fork keeps of the front, what it must not."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.workers import parent_pid, process_name, wait_ready

pytestmark = pytest.mark.slow


def socket_inodes(pid: int) -> set[str]:
    links = (os.readlink(entry) for entry in Path(f"/proc/{pid}/fd").iterdir())
    return {link for link in links if link.startswith("socket:")}


def listening_inode(port: int) -> str:
    """The inode of the socket listening on `port` (IPv4 loopback), from /proc/net/tcp."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "0A":
            return f"socket:[{fields[9]}]"
    raise AssertionError(f"nothing listens on {port}")


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def server(server_factory: ServerFactory) -> Server:
    # Under hypercorn's CLI, whose supervisor binds the port before the front (its child) imports the app.
    return server_factory(private=True, hypercorn=True, worker_restart_backoff="0.05")


def test_a_forked_worker_holds_no_port_reads_its_crash_and_ends_with_its_front(server: Server) -> None:
    """The zygote and its workers hold none of the front's listening sockets; a forked worker's segfault reads as a
    spawned one's (its stderr, its signal); once the front is gone, the zygote and the worker end too."""
    worker = wait_ready(server)
    zygote = parent_pid(worker)
    front = parent_pid(zygote)
    assert process_name(zygote) == "relay-zygote" and parent_pid(front) == server.process.pid
    listener = listening_inode(urlparse(server.base_url).port or 0)
    assert listener in socket_inodes(front)
    # The zygote's one socket is its end of the pair; the worker's, its connection to the front.
    assert len(socket_inodes(zygote)) == 1 and listener not in socket_inodes(worker)

    os.kill(worker, signal.SIGSEGV)
    restarted = wait_ready(server, other_than=worker)
    assert parent_pid(restarted) == zygote
    (exited,) = [json.loads(line) for line in server.logs().splitlines() if '"worker.exited"' in line]
    assert exited["pid"] == worker and exited["status"] == "killed by SIGSEGV", exited
    assert "Fatal Python error: Segmentation fault" in exited["stderr"], exited
    completion = server.client().completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
    assert completion.usage is not None and completion.usage.completion_tokens == 2

    os.kill(front, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not (gone(zygote) and gone(restarted)):
        assert time.monotonic() < deadline, "the zygote or its worker outlived the front"
        time.sleep(0.05)


def test_a_lost_zygote_costs_only_the_fork(server_factory: ServerFactory) -> None:
    """SIGKILL of the zygote: its worker serves on, the next worker is spawned, and the front reaps the zygote."""
    server = server_factory(private=True, worker_restart_backoff="0.05")
    worker = wait_ready(server)
    zygote = parent_pid(worker)
    os.kill(zygote, signal.SIGKILL)
    client = server.client()
    completion = client.completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
    assert completion.usage is not None and completion.usage.completion_tokens == 2
    os.kill(worker, signal.SIGKILL)
    spawned = wait_ready(server, other_than=worker)
    assert parent_pid(spawned) == server.process.pid
    (model,) = loopback.get(f"{server.base_url}/health", timeout=10).json()["models"]
    assert model["forked"] is False and '"worker.zygote_lost"' in server.logs()
    assert not Path(f"/proc/{zygote}").exists(), "the front reaps its zygote"
    completion = client.completions.create(model="m", prompt="Hi", max_tokens=2, temperature=0)
    assert completion.usage is not None and completion.usage.completion_tokens == 2


def zygote_of(server: Server) -> int:
    """The zygote under the server's process (its child, or its grandchild under hypercorn's CLI)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and not gone(pid := int(entry.name)):
            try:
                if process_name(pid) == "relay-zygote" and server.process.pid in (
                    parent_pid(pid),
                    parent_pid(parent_pid(pid)),
                ):
                    return pid
            except (FileNotFoundError, ProcessLookupError):
                continue
    raise AssertionError("the server has no zygote")


def test_the_zygote_imports_speech_only_for_a_fleet_that_serves_a_speech_model(server_factory: ServerFactory) -> None:
    """A speech worker forked with mlx-whisper and libsndfile imported already; a chat-only front's zygote never
    loads them."""
    for settings, speech in (({}, False), ({"model": "tiny,tiny-whisper"}, True)):
        server = server_factory(**settings)
        deadline = time.monotonic() + 60
        while speech and '"worker.zygote_preimported"' not in server.logs():
            assert time.monotonic() < deadline, "the zygote never finished its speech imports"
            time.sleep(0.05)
        maps = Path(f"/proc/{zygote_of(server)}/maps").read_text()
        assert ("libsndfile" in maps) == speech, settings
        assert ('"worker.zygote_preimported"' in server.logs()) == speech
