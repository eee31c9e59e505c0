"""A throwaway PostgreSQL cluster (scripts/pg) with a PgBouncer of its own in front of it.

The campaign restarts its server (``pg_ctl restart -m immediate``), so it never shares a
cluster with other tests. Both live in the cluster's directory and go with ``close()``; a run
that is killed leaves them to the next ``scripts/pg up``, which reaps clusters whose owner
process died.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import psycopg

ROOT = Path(__file__).resolve().parents[2]


def as_postgres(*command: str, **kwargs: object) -> None:
    subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True, **kwargs)  # type: ignore[call-overload]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    def __init__(self) -> None:
        out = subprocess.run([str(ROOT / "scripts/pg"), "up", "-c", "fsync=off"], check=True,
                             capture_output=True, text=True,
                             env={**os.environ, "PGFENCE_OWNER_PID": str(os.getpid())}).stdout
        env = dict(line.removeprefix("export ").split("=", 1) for line in out.splitlines())
        self.dir = Path(env["PGFENCE_CLUSTER"])
        self.pgbin = Path(env["PGFENCE_PGBIN"])
        self.port = int(env["PGPORT"])
        try:
            self.bouncer_port = self._start_pgbouncer()
            self._template()
        except BaseException:
            self.close()
            raise

    def dsn(self, database: str, port: int | None = None) -> str:
        return (f"host=127.0.0.1 port={port or self.port} user=postgres dbname={database} "
                "sslmode=disable")

    def _start_pgbouncer(self) -> int:
        # Inside the cluster's dir: `scripts/pg down` stops it with the cluster.
        home = self.dir / "pgbouncer.campaign"
        home.mkdir()
        port = free_port()
        (home / "users.txt").write_text('"postgres" ""\n')
        # server_login_retry: after a restart, try the server again within a second, not 15.
        (home / "pgbouncer.ini").write_text(f"""[databases]
* = host=127.0.0.1 port={self.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {home}/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
server_login_retry = 1
logfile = {home}/pgbouncer.log
pidfile = {home}/pgbouncer.pid
""")
        subprocess.run(["chown", "-R", "postgres:", str(home)], check=True)
        as_postgres("pgbouncer", "-d", "-q", str(home / "pgbouncer.ini"))  # it refuses root
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(self.dsn("postgres", port), prepare_threshold=None,
                                connect_timeout=2).close()
                return port
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)             # start-up poll

    def _template(self) -> None:
        """campaign_template: pgfence from the one-file install; each schedule clones it."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            conn.execute("create database campaign_template")
        with psycopg.connect(self.dsn("campaign_template")) as conn:
            conn.execute((ROOT / "sql/pgfence.sql").read_text())

    def restart(self) -> None:
        """A crash and restart of the server: every backend dies, recovery replays the WAL."""
        # The postmaster inherits pg_ctl's stdout: a file, not a pipe we would wait on forever.
        with (self.dir / "server.log").open("a") as logfile:
            as_postgres(str(self.pgbin / "pg_ctl"), "-D", str(self.dir / "data"),
                        "-m", "immediate", "-w", "-t", "60", "restart",
                        stdout=logfile, stderr=subprocess.STDOUT)

    def close(self) -> None:
        subprocess.run([str(ROOT / "scripts/pg"), "down", str(self.dir)], check=False)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
