"""A Unix socket only its owner can use, made before hypercorn is handed it.

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
