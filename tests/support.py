"""What test files share, beside the fixtures of tests/conftest.py: the repository, installing
pgfence into a database, and small checks. Clusters, PgBouncer and connections are
testkit.cluster's; named sessions and steps are testkit.harness's."""

from __future__ import annotations

from pathlib import Path

from testkit.cluster import Cluster
from testkit.harness import Lease

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "sql/pgfence.sql"
TEST_HELPERS = ROOT / "pgtap/helpers/pgfence_test.sql"
PGMQ_SQL = ROOT / ".tools/pgmq/pgmq.sql"  # pgmq's own install, put there by scripts/setup
PGMQ_LAYER = ROOT / "sql/pgfence-pgmq.sql"
PGFLOW_LAYER = ROOT / "sql/pgfence-pgflow.sql"
# pgflow's own migrations, as npm's @pgflow/core (pinned in .tools/package.json) ships them.
PGFLOW_MIGRATIONS = ROOT / ".tools/node_modules/@pgflow/core/dist/supabase/migrations"
# TEST-ONLY: Supabase Realtime's realtime.send, which pgflow's migrations call, as a stand-in
# that records its calls (realtime.stand_in_calls).
# Deno's own binary from npm's platform package (scripts/setup), not npm's .bin/deno shim.
DENO = ROOT / ".tools/node_modules/@deno/linux-x64-glibc/deno"
REALTIME_STAND_IN = ROOT / "tests/sql/realtime_stand_in.sql"


def install_bundle(cluster: Cluster, database: str) -> None:
    """pgfence from the one-file install, as `psql -f` installs it."""
    cluster.psql(database, "--single-transaction", "-f", BUNDLE)


def install_pgmq(cluster: Cluster, database: str, how: str = "extension") -> None:
    """The real pgmq: as the extension (Supabase's and pgflow's form) or from its SQL file."""
    if how == "extension":
        cluster.psql(database, "-c", "create extension pgmq")
    else:
        cluster.psql(database, "-f", PGMQ_SQL)


def install_pgmq_layer(cluster: Cluster, database: str) -> None:
    """pgfence's pgmq layer from its one-file install (after pgmq and pgfence)."""
    cluster.psql(database, "--single-transaction", "-f", PGMQ_LAYER)


def install_pgflow(cluster: Cluster, database: str) -> None:
    """The real pgflow (npm @pgflow/core): its migrations in order, each in a transaction as
    Supabase applies them, after pgmq (the extension, which they expect) and the test-only
    stand-in for realtime.send. They need nothing else (no roles, no pg_net or pg_cron)."""
    cluster.psql(database, "-c", "create extension if not exists pgmq")
    cluster.psql(database, "--single-transaction", "-f", REALTIME_STAND_IN)
    migrations = sorted(PGFLOW_MIGRATIONS.glob("*.sql"))
    assert migrations, f"no pgflow migrations in {PGFLOW_MIGRATIONS}: run scripts/setup"
    for migration in migrations:
        cluster.psql(database, "--single-transaction", "-f", migration)


def install_pgflow_layer(cluster: Cluster, database: str) -> None:
    """pgfence's pgflow layer from its one-file install (after pgfence, the pgmq layer and
    pgflow)."""
    cluster.psql(database, "--single-transaction", "-f", PGFLOW_LAYER)


def install_test_helpers(cluster: Cluster, database: str) -> None:
    """Schema pgfence_test (pgtap/helpers): expire() and the other helpers of the tests."""
    cluster.psql(database, "-f", TEST_HELPERS)


def acquired(lease: Lease | None) -> Lease:
    assert lease is not None, "expected a lease"
    return lease
