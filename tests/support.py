"""What test files share, beside the fixtures of tests/conftest.py: the repository, installing
pgfence into a database, and small checks. Clusters, PgBouncer and connections are
pgfence.cluster's; named sessions and steps are pgfence.harness's."""

from __future__ import annotations

from pathlib import Path

from pgfence.cluster import Cluster
from pgfence.harness import Lease

ROOT = Path(__file__).resolve().parent.parent
BUNDLE = ROOT / "sql/pgfence.sql"
TEST_HELPERS = ROOT / "pgtap/helpers/pgfence_test.sql"


def install_bundle(cluster: Cluster, database: str) -> None:
    """pgfence from the one-file install, as `psql -f` installs it."""
    cluster.psql(database, "--single-transaction", "-f", BUNDLE)


def install_test_helpers(cluster: Cluster, database: str) -> None:
    """Schema pgfence_test (pgtap/helpers): expire() and the other helpers of the tests."""
    cluster.psql(database, "-f", TEST_HELPERS)


def acquired(lease: Lease | None) -> Lease:
    assert lease is not None, "expected a lease"
    return lease
