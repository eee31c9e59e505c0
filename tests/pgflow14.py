"""pgflow 0.14.1 for the tests: its published migrations (../shared/vendor/pgflow-core-0.14.1,
see its README), applied in file-name order, each in one transaction, after pgmq, the
realtime.send stand-in and the test-only stand-ins for pg_net and Vault
(tests/sql/pg_net_vault_stand_in.sql), on a cluster with the real pg_cron (Debian's
postgresql-15-cron, preloaded, its database named by ``cron.database_name``).

The vendor folder is outside this repository: where it is absent, or pg_cron is not installed
for the cluster's PostgreSQL, the tests that need them skip, saying why.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from testkit.cluster import Cluster, default_pgbin
from tests.support import REALTIME_STAND_IN, ROOT

# Beside the repository (../shared/vendor); PGFENCE_PGFLOW14 names it for a copy of the
# repository elsewhere (scripts/mutate's).
VENDOR = Path(os.environ.get("PGFENCE_PGFLOW14")
              or ROOT.parent / "shared/vendor/pgflow-core-0.14.1")
MIGRATIONS = VENDOR / "migrations"
NET_VAULT_STAND_IN = ROOT / "tests/sql/pg_net_vault_stand_in.sql"
# pg_net is not installable here: the one statement that creates it is left out, and the
# stand-in, installed before the migrations, provides net.http_post instead.
CREATE_PG_NET = 'CREATE EXTENSION IF NOT EXISTS "pg_net" WITH SCHEMA "public";\n'
# pg_cron before 1.5 (Debian's postgresql-15-cron is 1.4.2) has no schedules in seconds:
# there the jobs pgflow schedules every second (ensure_workers) and every 15 s (requeue) are
# scheduled every minute instead, and the tests run a job's command themselves, as the
# scheduler would, instead of waiting for it.
MINUTELY = {
    "SELECT pgflow.setup_ensure_workers_cron('1 second');\n":
        "SELECT pgflow.setup_ensure_workers_cron('* * * * *');\n",
    "SELECT pgflow.setup_requeue_stalled_tasks_cron();\n":
        "SELECT pgflow.setup_requeue_stalled_tasks_cron('* * * * *');\n",
}
# pg_cron runs jobs in one database of the cluster, named when the cluster starts.
CRON_DATABASE = "pgflow14"


def missing(pgbin: Path | None = None) -> str | None:
    """Why pgflow 0.14.1 cannot be installed on the server of ``pgbin`` (default
    ``default_pgbin()``), or None where it can."""
    if not MIGRATIONS.is_dir():
        return (f"pgflow 0.14.1's migrations are absent ({MIGRATIONS}): the vendor folder "
                "is not part of this repository (../shared/vendor/pgflow-core-0.14.1)")
    pgbin = pgbin or default_pgbin()
    if not (pgbin.parent / "lib" / "pg_cron.so").exists():
        return (f"pg_cron is not installed for {pgbin} (Debian's postgresql-15-cron: "
                "scripts/setup)")
    return None


def skip_without_pgflow14(pgbin: Path | None = None) -> None:
    """Skips the calling test (or fixture) where pgflow 0.14.1 cannot be installed."""
    why = missing(pgbin)
    if why is not None:
        pytest.skip(why)


def migrations() -> list[Path]:
    found = sorted(MIGRATIONS.glob("*.sql"))
    assert len(found) == 20, f"expected pgflow 0.14.1's 20 migrations in {MIGRATIONS}"
    return found


def install_pgflow14(cluster: Cluster, database: str, tmp: Path) -> None:
    """pgmq, the stand-ins and pgflow 0.14.1 into ``database`` (the cluster's cron database:
    pg_cron's extension can be created there only)."""
    cluster.psql(database, "-c", "create extension if not exists pgmq")
    cluster.psql(database, "--single-transaction", "-f", REALTIME_STAND_IN)
    cluster.psql(database, "--single-transaction", "-f", NET_VAULT_STAND_IN)
    version = cluster.psql(database, "-At", "-c", "select default_version from "
                           "pg_available_extensions where name = 'pg_cron'").strip()
    adapt = {CREATE_PG_NET: "-- pg_net: the test-only stand-in\n"}
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()  # type: ignore[union-attr]
    if (int(major), int(minor)) < (1, 5):
        adapt.update(MINUTELY)
    for migration in migrations():
        text = migration.read_text()
        changed = text
        for old, new in adapt.items():
            assert changed.count(old) <= 1
            changed = changed.replace(old, new)
        if changed != text:
            migration = tmp / migration.name
            migration.write_text(changed)
        cluster.psql(database, "--single-transaction", "-f", migration)


# A cluster's settings for pg_cron: preloaded, its jobs run in CRON_DATABASE by background
# workers, not libpq connections to cron.host (the cluster listens on its own loopback address
# and socket only).
CRON_SETTINGS = ("shared_preload_libraries=pg_cron", f"cron.database_name={CRON_DATABASE}",
                 "cron.use_background_workers=on", "max_worker_processes=16")


@contextmanager
def cron_cluster() -> Iterator[Cluster]:
    """A cluster of its own with pg_cron preloaded, its jobs run in CRON_DATABASE."""
    skip_without_pgflow14()
    c = Cluster.start(["fsync=off", *CRON_SETTINGS])
    try:
        yield c
    finally:
        c.remove()
