"""Major upgrades with live state: a PostgreSQL 15 cluster whose database holds the core, both
layers and live state in all three (tests/test_backup.py's ``make_state``) is carried by
pg_upgrade to PostgreSQL 16, 17 and 18 (the binaries ``scripts/setup --pg N`` installs), and
every guarantee holds in the upgraded cluster as in a restored copy (``check_copy``): health()
healthy, grants and lockdown as they were, guards firing, the live lease renewing and fencing,
results keeping their verdicts. pg_upgrade's copy mode leaves the old cluster as it was, so one
source serves every target. The clusters are the test's own: every check of health() applies,
the cluster-wide one too.

As released (0.2.0, 0.2.1), pg_upgrade refuses any database with pgfence: `pgfence.layers`
holds `regprocedure` columns, whose OIDs pg_upgrade does not keep. The first test shows the
refusal; the others run docs/operations.md's steps around it (the columns as text for the
upgrade) as the page prints them.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgfence.connection import connect
from testkit import install
from testkit.cluster import USER, Cluster
from tests.support import HUNG, ROOT
from tests.test_backup import State, check_copy, doc_block, failing, health, make_state
from tests.test_upgrade import Databases

SOURCE = 15
TARGETS = (16, 17, 18)


def bindir(major: int) -> Path:
    out = subprocess.run([str(ROOT / "scripts/setup"), "--bindir", str(major)],
                         capture_output=True, text=True, check=True, timeout=HUNG)
    return Path(out.stdout.strip())


@dataclass
class Source:
    cluster: Cluster            # stopped: pg_upgrade reads it
    database: str               # the core, both layers and live state
    core: str                   # the core alone
    state: State
    refusal: str                # pg_upgrade --check's list of reg* columns, before the doc's step


def pg_upgrade(old: Cluster, new: Cluster, *flags: str) -> subprocess.CompletedProcess[str]:
    """pg_upgrade (copy mode) from the stopped ``old`` into the stopped, freshly made ``new``,
    as the postgres user, in ``new``'s dir (its logs and sockets go there)."""
    return subprocess.run(["runuser", "-u", USER, "--", str(new.pgbin / "pg_upgrade"),
                           "-b", str(old.pgbin), "-B", str(new.pgbin),
                           "-d", str(old.dir / "data"), "-D", str(new.dir / "data"),
                           "-p", str(old.port), "-P", str(new.port), "-s", str(new.dir),
                           "-U", USER, *flags],
                          cwd=new.dir, capture_output=True, text=True, timeout=HUNG)


def target_cluster(target: int) -> Cluster:
    """A new, stopped cluster of PostgreSQL ``target``, made as the source was (initdb checks no
    data pages from 18 on unless told: pg_upgrade needs both alike)."""
    pgbin = bindir(target)
    if not (pgbin / "pg_upgrade").exists():
        pytest.skip(f"PostgreSQL {target} is not installed: scripts/setup --pg {target}")
    cluster = Cluster.start(["fsync=off"], pgbin=pgbin,
                            initdb=["--no-data-checksums"] if target >= 18 else [])
    cluster.stop()
    return cluster


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    with Cluster.start(["fsync=off"], pgbin=bindir(SOURCE)) as cluster:
        dbs = Databases(cluster)
        name, core = dbs.fresh("live"), dbs.fresh("core")
        state = make_state(dbs, name)
        install.core(cluster, core)
        assert failing(health(dbs, name)) == {}
        # As released, pg_upgrade refuses both databases (docs/operations.md).
        cluster.stop()
        with target_cluster(TARGETS[0]) as probe:
            checked = pg_upgrade(cluster, probe, "--check")
            assert checked.returncode != 0, checked.stdout
            listed = sorted((probe.dir / "data").glob("pg_upgrade_output.d/*/tables_using_reg.txt"))
            refusal = checked.stdout + "".join(p.read_text() for p in listed)
        cluster.resume()
        for database in (name, core):
            cluster.psql(database, "-c", doc_block("before pg_upgrade"))
        cluster.stop()
        yield Source(cluster, name, core, state, refusal)


def test_pg_upgrade_refuses_the_layers_table_as_released(source: Source) -> None:
    """The finding docs/operations.md works around: pgfence.layers's regprocedure columns."""
    assert "reg* data types in user tables" in source.refusal, source.refusal
    for database in (source.database, source.core):
        for column in ("in_flight", "leases", "prune", "health"):
            assert re.search(rf"In database: {database}\n(  .*\n)*  pgfence\.layers\.{column}\n",
                             source.refusal), source.refusal


@pytest.mark.parametrize("target", TARGETS)
def test_pg_upgrade_keeps_every_guarantee(source: Source, target: int) -> None:
    with target_cluster(target) as new:
        upgraded = pg_upgrade(source.cluster, new)
        assert upgraded.returncode == 0, f"pg_upgrade failed:\n{upgraded.stdout}{upgraded.stderr}"
        new.resume()
        dbs = Databases(new)
        for database in (source.database, source.core):
            new.psql(database, "-c", doc_block("after pg_upgrade"))
        with connect(dbs.dsn(source.database), "version") as conn:
            row = conn.execute("select current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] // 10000 == target
        check_copy(dbs, source.database, source.state, set())
        assert failing(health(dbs, source.core), "requeue job scheduled") == {}
