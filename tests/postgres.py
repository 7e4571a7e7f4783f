"""A real PostgreSQL server on the loopback address, for the tests of a team's shared study.

Debian's ``postgresql`` package gives the server (``.ci/run`` installs it); the server runs
from a fresh data directory of its own, as the ``postgres`` user when the tests run as root
(PostgreSQL refuses to run as root), on a free port, with a password required over TCP.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import quote

USER = "autotune"
PASSWORD = "S3cr@t:/pw%Q"
"""A password with the characters a URL must escape: the tests look for it everywhere."""


def find_binaries() -> Path | None:
    """The directory of Debian's PostgreSQL server programs (initdb, pg_ctl), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def why_not() -> str | None:
    """Why the PostgreSQL tests cannot run here (None: they can)."""
    if find_binaries() is None:
        return "no PostgreSQL server: apt-get install postgresql (.ci/run does)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "no PostgreSQL driver: pip install 'autotune[postgres]'"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser: PostgreSQL will not run as root"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One PostgreSQL server: ``start``, ``stop``, ``url`` of a database on it."""

    def __init__(self) -> None:
        bins = find_binaries()
        assert bins is not None, why_not()
        self.bins = bins
        self.dir = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.as_root:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            f"--pwfile={pwfile}",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "-E",
            "UTF8",
        )
        pwfile.unlink()

    def _run(self, program: str, *args: str) -> str:
        command = [str(self.bins / program), *args]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stdout[-1500:]} {done.stderr[-1500:]}")
        return done.stdout

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.dir / "log")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def create_database(self, name: str) -> str:
        """A new database on the server; its URL, password included."""
        self._sql(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _sql(self, sql: str, database: str = "postgres") -> str:
        psql = self.bins / "psql"
        command = [str(psql) if psql.exists() else "psql", "-h", str(self.dir), "-p"]
        command += [str(self.port), "-U", USER, "-d", database, "-At", "-c", sql]
        if self.as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        return done.stdout

    def dump(self, database: str) -> str:
        """Every row of every table of ``database``, as text (what a secret would hide in)."""
        tables = self._sql(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'", database
        ).split()
        return "\n".join(self._sql(f'SELECT * FROM "{t}"', database) for t in tables)

    def url(self, database: str) -> str:
        return f"postgresql://{USER}:{quote(PASSWORD, safe='')}@127.0.0.1:{self.port}/{database}"

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):  # it may be stopped already
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
