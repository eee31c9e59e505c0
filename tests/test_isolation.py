"""I2 for callers whose transactions run at REPEATABLE READ or SERIALIZABLE.

Such a transaction reads the database as of its snapshot. fence and claim lock the lease row
FOR KEY SHARE, and a lock on a row that a later transaction updated goes through quietly
unless that transaction locked or updated it in a mode that conflicts with KEY SHARE: then
the caller would judge the version its snapshot holds. So (1) every path that ends a lease
(drain, release, takeover, deprecate, an update window) takes the row FOR UPDATE before it
changes the state, which such a caller meets as a serialization failure (40001: an acceptable
refusal); and (2) a renewal, whose FOR NO KEY UPDATE does not conflict, never moves expires_at
backwards, so the expiry a snapshot holds is never later than the real one. A stale lease
passing is never acceptable. Each has a negative control. Every interleaving of a fence or a
claim at these levels with a lease's end and a takeover: tests/test_permutations.py.
"""

from __future__ import annotations

from datetime import datetime

import psycopg
import pytest

from testkit.harness import Database, Lease
from tests.support import acquired

LEVELS = ["repeatable read", "serializable"]
FENCE = "select pgfence.fence(%s)"
CLAIM = "select task_id from pgfence.claim(%s, 'q')"


def check_after_the_lease_ended(db: Database, level: str, check: str,
                                end: str = "drain") -> str | None:
    """A's transaction takes its snapshot; then its lease ends (drained by B, or released) and C
    takes over; then A checks the lease. The SQLSTATE A gets, or None if the check passed."""
    db.sql("select pgfence.register('r')")
    db.sql("select pgfence.enqueue('q')")
    a, b, c = db.session("a"), db.session("b"), db.session("c")
    la = acquired(a.acquire("r"))
    a.run(f"begin isolation level {level}")
    a.run("select count(*) from pgfence.tasks")  # the snapshot is taken here
    getattr(b, end)(la)
    lc = acquired(c.acquire("r"))
    assert lc.generation > la.generation
    try:
        a.run(check, (la.lease_id,))
        return None
    except psycopg.Error as e:
        return e.sqlstate
    finally:
        a.rollback()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("check", [FENCE, CLAIM], ids=["fence", "claim"])
@pytest.mark.parametrize("end", ["drain", "release"])
def test_snapshot_older_than_the_leases_end_cannot_pass(db: Database, level: str, check: str,
                                                        end: str) -> None:
    assert check_after_the_lease_ended(db, level, check, end) in {"40001", "PF001"}


@pytest.mark.parametrize("check", [FENCE, CLAIM], ids=["fence", "claim"])
def test_read_committed_sees_the_end_and_refuses(db: Database, check: str) -> None:
    assert check_after_the_lease_ended(db, "read committed", check) == "PF001"


@pytest.mark.parametrize("check", [FENCE, CLAIM], ids=["fence", "claim"])
def test_negative_control_a_drain_without_for_update_lets_the_old_snapshot_pass(
        db: Database, check: str) -> None:
    # The drain's lock weakened to one that does not conflict with FOR KEY SHARE.
    db.install_mutant("drain-no-key-update")
    assert check_after_the_lease_ended(db, "repeatable read", check) is None


def fence_after_a_shorter_renewal(db: Database, level: str) -> tuple[datetime, datetime] | None:
    """A's snapshot sees its lease with an hour to go; then a renewal asks for a millisecond,
    and the clock passes it. If A's fence passes, (when it passed, the lease's real expiry)."""
    db.sql("select pgfence.register('r')")
    a, b = db.session("a"), db.session("b")
    la: Lease = acquired(a.acquire("r", ttl="1 hour"))
    a.run(f"begin isolation level {level}")
    a.run("select count(*) from pgfence.leases")  # the snapshot
    b.renew(la, ttl="1 millisecond")
    renewed = db.one("select renewed_at from pgfence.leases where lease_id = %s", (la.lease_id,))
    db.wait_until("select clock_timestamp() > %s + interval '2 milliseconds'", (renewed,))
    try:
        a.run(FENCE, (la.lease_id,))
        at = a.one("select clock_timestamp()")
    except psycopg.Error:
        return None
    finally:
        a.rollback()
    return at, db.one("select expires_at from pgfence.leases where lease_id = %s", (la.lease_id,))


@pytest.mark.parametrize("level", LEVELS)
def test_a_renewal_never_shortens_a_lease(db: Database, level: str) -> None:
    passed = fence_after_a_shorter_renewal(db, level)
    # The fence may pass, but only while the lease really is current.
    assert passed is not None
    at, expires_at = passed
    assert expires_at > at


def test_negative_control_a_shortening_renewal_lets_an_expired_lease_pass(db: Database) -> None:
    db.install_mutant("renew-may-shorten")
    passed = fence_after_a_shorter_renewal(db, "repeatable read")
    assert passed is not None
    at, expires_at = passed
    assert expires_at < at, "the fence passed a lease that had expired"
