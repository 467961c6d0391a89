"""The sockets `mlx-relay serve` listens on: TCP, or a Unix socket with `--unix`."""

from __future__ import annotations

import contextlib
import socket
import stat
from pathlib import Path

import pytest

from edge.sockets import SocketInUse, bind_tcp, bind_unix


def test_the_socket_is_owner_only_from_the_start(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with contextlib.closing(bind_unix(str(path))):
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600


def test_a_stale_socket_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as old:
        old.bind(str(path))
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(str(path))  # nobody listens on the stale file
    with contextlib.closing(bind_unix(str(path))) as listener:
        assert listener.getsockname() == str(path)
        assert stat.S_ISSOCK(path.stat().st_mode) and stat.S_IMODE(path.stat().st_mode) == 0o600
        with contextlib.closing(socket.socket(socket.AF_UNIX)) as client:
            client.connect(str(path))
            client.sendall(b"ping")
            accepted, _ = listener.accept()
            with contextlib.closing(accepted):
                assert accepted.recv(4) == b"ping"


def test_a_live_socket_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    with contextlib.closing(bind_unix(str(path))):
        with pytest.raises(SocketInUse, match="already listening"):
            bind_unix(str(path))
        assert path.exists()


def test_a_regular_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes"
    path.write_text("mine")
    with pytest.raises(SocketInUse, match="not a socket"):
        bind_unix(str(path))
    assert path.read_text() == "mine"


def test_a_tcp_socket_listens_where_asked_and_a_taken_port_is_refused() -> None:
    with contextlib.closing(bind_tcp("127.0.0.1", 0)) as listener:
        host, port = listener.getsockname()
        assert host == "127.0.0.1" and port > 0
        with contextlib.closing(socket.create_connection((host, port), timeout=5)) as client:
            client.sendall(b"ping")
            accepted, _ = listener.accept()
            with contextlib.closing(accepted):
                assert accepted.recv(4) == b"ping"
        with pytest.raises(SocketInUse, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            bind_tcp("127.0.0.1", port)


def test_an_ipv6_literal_binds_an_ipv6_socket() -> None:
    try:
        listener = bind_tcp("[::1]", 0)
    except SocketInUse as error:
        pytest.skip(f"no IPv6 loopback here: {error}")
    with contextlib.closing(listener):
        assert listener.family == socket.AF_INET6 and listener.getsockname()[0] == "::1"
