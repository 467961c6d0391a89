"""The listening sockets `mlx-relay serve` makes before hypercorn is handed them.

Made before any model loads, so an address in use is one line at once,
not a traceback after minutes of loading.

A Unix socket only its owner can use:

Hypercorn's own `unix:` bind leaves the socket at the umask's mode (0755
is typical: any local user may connect) and removes any socket file in
the way, even one a running server still answers on. Here the socket is
created under a 0177 umask, so it is 0600 from its first moment, and a
file in the way is replaced only when it is a socket nobody answers on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat

_BACKLOG = 128
_OWNER_ONLY = 0o177


class SocketInUse(Exception):
    pass


def bind_unix(path: str) -> socket.socket:
    """A listening socket at `path`, mode 0600.

    Raises:
        SocketInUse: a server answers on `path`, `path` is not a socket, or it cannot be bound.
    """
    _clear_stale(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    previous = os.umask(_OWNER_ONLY)
    try:
        listener.bind(path)
    except OSError as error:
        listener.close()
        raise SocketInUse(f"cannot listen on {path}: {error.strerror or error}") from None
    finally:
        os.umask(previous)
    os.chmod(path, 0o600)
    listener.listen(_BACKLOG)
    return listener


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket at `host`:`port`, with the options hypercorn's own bind sets.

    Raises:
        SocketInUse: the address is taken or cannot be bound here.
    """
    host = host.strip("[]")
    # As hypercorn reads a bind: an IPv6 literal has a colon, anything else (a name too) is IPv4.
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as error:
        listener.close()
        raise SocketInUse(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    listener.listen(_BACKLOG)
    return listener


def _clear_stale(path: str) -> None:
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"{path} exists and is not a socket; not replacing it")
    if _answers(path):
        raise SocketInUse(f"a server is already listening on {path}")
    os.unlink(path)


def _answers(path: str) -> bool:
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except OSError:
            return False
        return True
