"""Fixtures: one cluster per run, one template database, a fresh clone of it per test.

scripts/test starts the cluster and exports its settings (PGHOST, PGPORT, ...). Run alone,
pytest starts a cluster of its own with scripts/pg and removes it at the end.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgfence.harness import Database, connect

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "pgfence_template"


def psql(database: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", database, *args],
                          check=True, capture_output=True, text=True)


def dsn(database: str) -> str:
    env = os.environ
    return f"host={env['PGHOST']} port={env['PGPORT']} user=postgres dbname={database}"


@pytest.fixture(scope="session")
def cluster() -> Iterator[None]:
    if os.environ.get("PGFENCE_CLUSTER"):
        yield
        return
    out = subprocess.run([ROOT / "scripts/pg", "up", "-c", "fsync=off"], check=True,
                         capture_output=True, text=True,
                         env={**os.environ, "PGFENCE_OWNER_PID": str(os.getpid())}).stdout
    saved = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        os.environ[key] = value
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
def template(cluster: None) -> str:
    drop_database(TEMPLATE)
    create_database(TEMPLATE)
    install_bundle(TEMPLATE)
    install_test_helpers(TEMPLATE)
    return TEMPLATE


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
