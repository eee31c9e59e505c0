"""A transaction is its own successor (docs/guarantees.md): inside one fenced transaction the
holder releases its lease and acquires the next generation; nobody else sees either before the
commit, and then both at once. Its negative control: the same release committed on its own lets
another session's acquire in between.
"""

from __future__ import annotations

from testkit.harness import Database
from tests.support import acquired


def test_release_and_acquire_inside_ones_own_fenced_transaction(db: Database) -> None:
    db.sql("select pgfence.register('r')")
    db.sql("create table audit (generation bigint)")
    db.sql("grant all on audit to public")
    db.sql("select pgfence.protect('audit', 'r')")
    a, other = db.session("a"), db.session("other")
    first = acquired(a.acquire("r"))
    a.begin()
    a.run("insert into audit select pgfence.fence(%s)", (first.lease_id,))
    assert a.release(first) is True
    second = acquired(a.acquire("r"))
    a.run("insert into audit select pgfence.fence(%s)", (second.lease_id,))
    # Meanwhile nobody else gets the resource, nor sees the release.
    assert other.acquire("r") is None
    assert db.one("select state from pgfence.leases where generation = %s",
                  (first.generation,)) == "active"
    a.commit()
    assert db.sql("select generation from audit order by 1") == [(first.generation,),
                                                                  (second.generation,)]
    committed = db.sql("select pg_xact_commit_timestamp(xmin) from pgfence.leases "
                       "union select pg_xact_commit_timestamp(xmin) from audit")
    assert len(committed) == 1  # the release (the first lease's row), the grant, both writes
    assert other.acquire("r") is None  # the second lease is current


def test_negative_control_a_release_committed_alone_lets_another_in(db: Database) -> None:
    db.sql("select pgfence.register('r')")
    a, other = db.session("a"), db.session("other")
    first = acquired(a.acquire("r"))
    assert a.release(first) is True
    assert other.acquire("r") is not None
