"""Major upgrades with live state: a PostgreSQL 15 cluster whose database holds the core, both
layers and live state in all three (tests/test_backup.py's ``make_state``) is carried by
pg_upgrade to PostgreSQL 16, 17 and 18 (the binaries ``scripts/setup --pg N`` installs), and
every guarantee holds in the upgraded cluster as in a restored copy (``check_copy``): health()
healthy, grants and lockdown as they were, guards firing, the live lease renewing and fencing,
results keeping their verdicts. pg_upgrade's copy mode leaves the old cluster as it was, so one
source serves every target. The clusters are the test's own: every check of health() applies,
the cluster-wide one too.

From 0.3.0 on, `pgfence.layers` names the layers' functions as text, and pg_upgrade carries an
install as it is, nothing done before or after. Releases 0.2.0 and 0.2.1 held `regprocedure`
columns there, whose OIDs pg_upgrade does not keep: it refuses such a database (the negative
control, a database of 0.2.1 beside the others), and takes it once pgfence is upgraded first,
as docs/operations.md says.
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
from tests.test_backup import State, check_copy, failing, health, make_state
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
    old: str                    # the core of release 0.2.1, upgraded to the head after the check
    state: State
    refusal: str                # pg_upgrade --check's output while `old` was still 0.2.1
    refused: int                # and its exit status


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


def check(cluster: Cluster, target: int) -> tuple[int, str]:
    """pg_upgrade --check of the stopped ``cluster`` into a fresh one of ``target``: its exit
    status, and what it said with the list of reg* columns it found, if any."""
    with target_cluster(target) as probe:
        checked = pg_upgrade(cluster, probe, "--check")
        listed = sorted((probe.dir / "data").glob("pg_upgrade_output.d/*/tables_using_reg.txt"))
        return checked.returncode, checked.stdout + "".join(p.read_text() for p in listed)


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    with Cluster.start(["fsync=off"], pgbin=bindir(SOURCE)) as cluster:
        dbs = Databases(cluster)
        name, core, old = dbs.fresh("live"), dbs.fresh("core"), dbs.fresh("old")
        state = make_state(dbs, name)
        install.core(cluster, core)
        dbs.install_release(old, "0.2.1")
        assert failing(health(dbs, name)) == {}
        cluster.stop()
        refused, refusal = check(cluster, TARGETS[0])
        # What docs/operations.md says for a database of 0.2.x: upgrade pgfence first.
        cluster.resume()
        dbs.upgrade_by_file(old, "0.2.1")
        cluster.stop()
        yield Source(cluster, name, core, old, state, refusal, refused)


def test_pg_upgrade_refuses_only_a_release_with_reg_columns(source: Source) -> None:
    """The negative control: 0.2.1's pgfence.layers, with its regprocedure columns, is refused;
    no database of the head is named."""
    assert source.refused != 0, source.refusal
    assert "reg* data types in user tables" in source.refusal, source.refusal
    named = re.findall(r"In database: (\S+)", source.refusal)
    assert named == [source.old], source.refusal
    for column in ("in_flight", "leases", "prune", "health"):
        assert re.search(rf"In database: {source.old}\n(  .*\n)*  pgfence\.layers\.{column}\n",
                         source.refusal), source.refusal


def test_pg_upgrade_accepts_every_database_once_pgfence_is_upgraded(source: Source) -> None:
    status, said = check(source.cluster, TARGETS[0])
    assert status == 0, said


@pytest.mark.parametrize("target", TARGETS)
def test_pg_upgrade_keeps_every_guarantee(source: Source, target: int) -> None:
    with target_cluster(target) as new:
        upgraded = pg_upgrade(source.cluster, new)
        assert upgraded.returncode == 0, f"pg_upgrade failed:\n{upgraded.stdout}{upgraded.stderr}"
        new.resume()
        dbs = Databases(new)
        with connect(dbs.dsn(source.database), "version") as conn:
            row = conn.execute("select current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] // 10000 == target
        check_copy(dbs, source.database, source.state, set())
        for database in (source.core, source.old):
            assert failing(health(dbs, database), "requeue job scheduled") == {}
