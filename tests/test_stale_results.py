"""I5 for older attempts: a stale result is checked against the lease its attempt was claimed
under, so nobody can fill pgfence.stale_results with made-up rows; the negative control,
without that check, records a forged one."""

from __future__ import annotations

import uuid

import psycopg

from testkit.harness import Database


def forged_stale_result(db: Database) -> str | None:
    """Task claimed twice (attempt 1 superseded); a forger sends a result for attempt 1 under an
    id it made up. The outcome, or the SQLSTATE it was refused with."""
    db.sql("select pgfence.register('r')")
    db.sql("select pgfence.enqueue('q')")
    lease = db.one("select lease_id from pgfence.acquire('r', 'a', '1 hour')")
    first = db.one("select attempt_id from pgfence.claim(%s, 'q')", (lease,))
    db.expire_attempt(first)
    db.sql("select pgfence.requeue_expired()")
    db.sql("select pgfence.claim(%s, 'q')", (lease,))
    # The same task and attempt number, signed over a lease the forger does not have.
    task = db.one("select task_id from pgfence.tasks")
    forged = db.one("select pgfence.attempt_uuid(%s, 1, %s)", (task, uuid.uuid4()))
    assert forged != first
    try:
        return str(db.one("select pgfence.complete(%s, '{\"forged\": true}')", (forged,)))
    except psycopg.Error as e:
        return e.sqlstate


def test_a_forged_stale_result_is_refused(db: Database) -> None:
    assert forged_stale_result(db) == "22023"
    assert db.one("select count(*) from pgfence.stale_results") == 0


def test_negative_control_without_the_check_a_forged_result_is_recorded(db: Database) -> None:
    db.install_mutant("report-older-attempt-unsigned")
    assert forged_stale_result(db) == "stale"
    assert db.one("select count(*) from pgfence.stale_results") == 1
