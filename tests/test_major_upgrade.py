"""Major upgrades with live state: a PostgreSQL 15 cluster whose database holds the core, both
layers and live state in all three (tests/test_backup.py's ``make_state``) is carried by
pg_upgrade to PostgreSQL 16, 17 and 18 (the binaries ``scripts/setup --pg N`` installs), and
every guarantee holds in the upgraded cluster as in a restored copy (``check_copy``): health()
healthy, grants and lockdown as they were, guards firing, the live lease renewing and fencing,
results keeping their verdicts. pg_upgrade's copy mode leaves the old cluster as it was, so one
source serves every target. The clusters are the test's own: every check of health() applies,
the cluster-wide one too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pgfence.connection import connect
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
    database: str
    state: State


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    with Cluster.start(["fsync=off"], pgbin=bindir(SOURCE)) as cluster:
        dbs = Databases(cluster)
        name = dbs.fresh("live")
        state = make_state(dbs, name)
        assert failing(health(dbs, name)) == {}
        cluster.stop()
        yield Source(cluster, name, state)


def pg_upgrade(old: Cluster, new: Cluster) -> None:
    """pg_upgrade (copy mode) from the stopped ``old`` into the stopped, freshly made ``new``,
    as the postgres user, in ``new``'s dir (its logs and sockets go there)."""
    subprocess.run(["runuser", "-u", USER, "--", str(new.pgbin / "pg_upgrade"),
                    "-b", str(old.pgbin), "-B", str(new.pgbin),
                    "-d", str(old.dir / "data"), "-D", str(new.dir / "data"),
                    "-p", str(old.port), "-P", str(new.port), "-s", str(new.dir), "-U", USER],
                   cwd=new.dir, check=True, capture_output=True, text=True, timeout=HUNG)


@pytest.mark.parametrize("target", TARGETS)
def test_pg_upgrade_keeps_every_guarantee(source: Source, target: int) -> None:
    pgbin = bindir(target)
    if not (pgbin / "pg_upgrade").exists():
        pytest.skip(f"PostgreSQL {target} is not installed: scripts/setup --pg {target}")
    with Cluster.start(["fsync=off"], pgbin=pgbin) as new:
        new.stop()
        try:
            pg_upgrade(source.cluster, new)
        except subprocess.CalledProcessError as e:
            raise AssertionError(f"pg_upgrade failed:\n{e.stdout}\n{e.stderr}") from None
        new.resume()
        dbs = Databases(new)
        with connect(dbs.dsn(source.database), "version") as conn:
            row = conn.execute("select current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] // 10000 == target
        check_copy(dbs, source.database, source.state, set())
