"""Fixtures: one cluster per run, one template database, a fresh clone of it per test.

scripts/test starts the cluster and exports its settings (PGHOST, PGPORT, ...). Run alone,
pytest starts a cluster of its own with scripts/pg and removes it at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgfence.harness import Database, connect

ROOT = Path(__file__).resolve().parent.parent


def psql(database: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", database, *args],
                          check=True, capture_output=True, text=True)


def dsn(database: str) -> str:
    env = os.environ
    return f"host={env['PGHOST']} port={env['PGPORT']} user=postgres dbname={database}"


def use_cluster_binaries() -> None:
    """Puts the cluster's own bin dir first on PATH, for psql, pg_dump and pg_basebackup: a
    matrix run may test a server newer than Debian's client tools (pg_dump refuses those)."""
    pgbin = os.environ.get("PGFENCE_PGBIN")
    path = os.environ.get("PATH", "")
    if pgbin and path.split(os.pathsep)[0] != pgbin:
        os.environ["PATH"] = os.pathsep.join([pgbin, path])


@pytest.fixture(scope="session")
def cluster() -> Iterator[None]:
    if os.environ.get("PGFENCE_CLUSTER"):
        use_cluster_binaries()
        yield
        return
    out = subprocess.run([ROOT / "scripts/pg", "up", "-c", "fsync=off"], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PGFENCE_OWNER_PID": str(os.getpid())}).stdout
    saved = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        os.environ[key] = value
    use_cluster_binaries()
    try:
        yield
    finally:
        subprocess.run([ROOT / "scripts/pg", "down", os.environ["PGFENCE_CLUSTER"]], check=False)
        os.environ.clear()
        os.environ.update(saved)


def admin() -> psycopg.Connection[tuple[object, ...]]:
    return connect(dsn("postgres"), "fixtures")


def create_database(name: str, template: str | None = None) -> None:
    with admin() as conn:
        clause = f" template {template}" if template else ""
        conn.execute(f'create database "{name}"{clause}')


def drop_database(name: str) -> None:
    with admin() as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


def install_bundle(database: str) -> None:
    psql(database, "--single-transaction", "-f", str(ROOT / "sql/pgfence.sql"))


def install_test_helpers(database: str) -> None:
    psql(database, "-f", str(ROOT / "pgtap/helpers/pgfence_test.sql"))


@pytest.fixture(scope="session")
def template(cluster: None) -> Iterator[str]:
    # Named per run: two runs on one cluster (PGFENCE_CLUSTER) must not drop each other's.
    name = f"pgfence_template_{uuid.uuid4().hex[:12]}"
    create_database(name)
    try:
        install_bundle(name)
        install_test_helpers(name)
        yield name
    finally:
        drop_database(name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pgbouncer(cluster: None) -> Iterator[int]:
    """PgBouncer in transaction pooling mode in front of the cluster; yields its port.

    Every database of the cluster is reachable through it; database `single` is a pool of one
    server connection, to show that clients really share backends.
    """
    # Inside the cluster's dir, so `scripts/pg down` stops it if this run is killed.
    home = Path(tempfile.mkdtemp(prefix="pgbouncer.", dir=os.environ["PGFENCE_CLUSTER"]))
    port = free_port()
    server = f"host={os.environ['PGHOST']} port={os.environ['PGPORT']}"
    (home / "users.txt").write_text('"postgres" ""\n')
    (home / "pgbouncer.ini").write_text(f"""[databases]
single = {server} dbname=postgres pool_size=1
* = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {home}/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 500
logfile = {home}/pgbouncer.log
pidfile = {home}/pgbouncer.pid
""")
    subprocess.run(["chown", "-R", "postgres:", str(home)], check=True)
    # PgBouncer refuses to run as root.
    subprocess.run(["runuser", "-u", "postgres", "--", "pgbouncer", "-d", "-q",
                    str(home / "pgbouncer.ini")], check=True)
    try:
        for _ in range(500):
            try:
                psycopg.connect(f"host=127.0.0.1 port={port} user=postgres dbname=postgres",
                                prepare_threshold=None, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                time.sleep(0.01)  # start-up poll; no test verdict depends on it
        yield port
    finally:
        pid = int((home / "pgbouncer.pid").read_text())
        os.kill(pid, signal.SIGTERM)


def pooled_dsn(port: int, database: str) -> str:
    return f"host=127.0.0.1 port={port} user=postgres dbname={database}"


@pytest.fixture
def db(template: str) -> Iterator[Database]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    create_database(name, template)
    database = Database(dsn(name))
    try:
        yield database
    finally:
        database.close()
        drop_database(name)


@pytest.fixture(params=["direct", "pgbouncer"])
def any_db(request: pytest.FixtureRequest, template: str) -> Iterator[Database]:
    """A fresh database, reached directly or through PgBouncer in transaction pooling mode."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    create_database(name, template)
    if request.param == "direct":
        database = Database(dsn(name))
    else:
        port = request.getfixturevalue("pgbouncer")
        database = Database(pooled_dsn(port, name), admin_dsn=dsn(name))
    try:
        yield database
    finally:
        database.close()
        drop_database(name)
