"""Fixtures: one cluster per run, one template database, a fresh clone of it per test.

scripts/test starts the cluster and exports its settings (PGHOST, PGPORT, ...). Run alone,
pytest starts a cluster of its own (testkit.cluster) and removes it at the end. What test
files share beside fixtures is in tests/support.py.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from testkit.cluster import Cluster, PgBouncer
from testkit.harness import Database
from tests.support import (
    DENO,
    ROOT,
    install_bundle,
    install_pgflow,
    install_pgflow_layer,
    install_pgmq,
    install_pgmq_layer,
    install_test_helpers,
)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The run's cluster; its exports and binaries are in os.environ while the run lasts."""
    saved = dict(os.environ)
    own = not os.environ.get("PGFENCE_CLUSTER")
    c = Cluster.start(["fsync=off"]) if own else Cluster.from_env()
    os.environ.clear()
    os.environ.update(c.env(saved))
    try:
        yield c
    finally:
        if own:
            c.remove()
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def made_template(cluster: Cluster, with_pgmq: bool, with_pgflow: bool = False) -> Iterator[str]:
    # Named per run: two runs on one cluster (PGFENCE_CLUSTER) must not drop each other's.
    name = f"pgfence_template_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    try:
        if with_pgmq:
            install_pgmq(cluster, name)
        if with_pgflow:
            install_pgflow(cluster, name)
        install_bundle(cluster, name)
        if with_pgmq:
            install_pgmq_layer(cluster, name)
        if with_pgflow:
            install_pgflow_layer(cluster, name)
        install_test_helpers(cluster, name)
        yield name
    finally:
        cluster.drop_database(name)


@pytest.fixture(scope="session")
def template(cluster: Cluster) -> Iterator[str]:
    with made_template(cluster, with_pgmq=False) as name:
        yield name


@pytest.fixture(scope="session")
def mq_template(cluster: Cluster) -> Iterator[str]:
    """pgmq (the extension), pgfence and its pgmq layer."""
    with made_template(cluster, with_pgmq=True) as name:
        yield name


@pytest.fixture(scope="session")
def flow_template(cluster: Cluster) -> Iterator[str]:
    """pgmq, pgflow (its migrations from npm, with the test-only realtime.send stand-in),
    pgfence, its pgmq layer and its pgflow layer."""
    with made_template(cluster, with_pgmq=True, with_pgflow=True) as name:
        yield name


@pytest.fixture(scope="session")
def deno_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """For Deno processes: a clean environment (no PG* settings or secrets of ours) and a
    DENO_DIR of this run, so nothing comes from an earlier run's cache."""
    if not os.access(DENO, os.X_OK):
        pytest.fail(f"{DENO} is missing: run scripts/setup")
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ROOT),
            "DENO_DIR": str(tmp_path_factory.mktemp("deno-dir")), "NO_COLOR": "1",
            "DENO_NO_UPDATE_CHECK": "1"}


@pytest.fixture(scope="session")
def bouncer(cluster: Cluster) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode in front of the cluster (see PgBouncer)."""
    b = cluster.pgbouncer()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def pgbouncer(bouncer: PgBouncer) -> int:
    """Its port, for tests that build their own URLs."""
    return bouncer.port


@contextmanager
def clone(cluster: Cluster, template: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name, template)
    try:
        yield name
    finally:
        cluster.drop_database(name)


@contextmanager
def fresh(request: pytest.FixtureRequest, cluster: Cluster, template: str,
          how: str) -> Iterator[Database]:
    with clone(cluster, template) as name:
        if how == "direct":
            database = Database(cluster.dsn(name))
        else:
            bouncer: PgBouncer = request.getfixturevalue("bouncer")
            database = Database(bouncer.dsn(name), admin_dsn=cluster.dsn(name))
        try:
            yield database
        finally:
            database.close()


@pytest.fixture
def db(request: pytest.FixtureRequest, cluster: Cluster, template: str) -> Iterator[Database]:
    with fresh(request, cluster, template, "direct") as database:
        yield database


@pytest.fixture(params=["direct", "pgbouncer"])
def any_db(request: pytest.FixtureRequest, cluster: Cluster, template: str) -> Iterator[Database]:
    """A fresh database, reached directly or through PgBouncer in transaction pooling mode."""
    with fresh(request, cluster, template, request.param) as database:
        yield database


@pytest.fixture
def mq(request: pytest.FixtureRequest, cluster: Cluster, mq_template: str) -> Iterator[Database]:
    """A fresh database with pgmq and pgfence's pgmq layer."""
    with fresh(request, cluster, mq_template, "direct") as database:
        yield database


@pytest.fixture(params=["direct", "pgbouncer"])
def any_mq(request: pytest.FixtureRequest, cluster: Cluster,
           mq_template: str) -> Iterator[Database]:
    """The same, reached directly or through PgBouncer in transaction pooling mode."""
    with fresh(request, cluster, mq_template, request.param) as database:
        yield database


@pytest.fixture
def flow(request: pytest.FixtureRequest, cluster: Cluster,
         flow_template: str) -> Iterator[Database]:
    """A fresh database with pgflow and pgfence's pgmq and pgflow layers."""
    with fresh(request, cluster, flow_template, "direct") as database:
        yield database


@pytest.fixture(params=["direct", "pgbouncer"])
def any_flow(request: pytest.FixtureRequest, cluster: Cluster,
             flow_template: str) -> Iterator[Database]:
    """The same, reached directly or through PgBouncer in transaction pooling mode."""
    with fresh(request, cluster, flow_template, request.param) as database:
        yield database
