"""What a fenced transaction leaves behind on its connection: nothing.

fence limits how long its transaction may stay idle (what the lease had left) and marks the
transaction as fenced; both are transaction-local (set_config(..., true)). On a pooled server
connection (PgBouncer, transaction pooling) the next transaction may be another client's:

- it may idle past the fenced transaction's bound and is not cut off; the negative control
  sets the bound for the session (the mutant `idle-limit-for-the-session`), and it is;
- the 5 s that renew (and every other call of limit_idle) sets for its transaction is gone
  from the next one: judged where it is in force, the next transaction's
  idle_in_transaction_session_timeout; the negative control sets it for the session (the
  mutant `limit-idle-for-the-session`, issue 43 item 8 b), and the next transaction, perhaps
  another client's behind the pooler, would be cut off after idling 5 s;
- the marker, replayed in a later transaction on the same connection after the lease ended,
  opens no guard: the write is refused (PF007); the negative control ties the marker to no
  transaction (the mutant `fence-token-replayable`), and the replay writes.
"""

from __future__ import annotations

import psycopg

from testkit.harness import Database, Session
from tests.support import acquired

# The lease's ttl, and so the fenced transaction's bound (what the lease had left). It must
# last from the acquire to the commit after the fence; a machine too slow for that (the fence
# refused, or the session ended before its commit) gets the scenario again with twice the ttl.
TTL_S = 1.0
PAST_S = 1.5  # how far past that bound the later transaction idles


def fenced_once(db: Database, ttl: float) -> tuple[Session, int] | None:
    """A session whose fenced transaction, under a lease of ``ttl`` seconds, committed, and its
    server backend; None if the lease ran out first."""
    s = db.session(f"s-{ttl:g}")
    lease = acquired(s.acquire("r", ttl=f"{ttl:.6f} seconds"))
    try:
        s.begin()
        backend = int(s.one("select pg_backend_pid()"))
        s.fence(lease)
        s.commit()
        return s, backend
    except psycopg.Error:
        s.close()
        db.expire(lease)
        return None


def unfenced_after_fenced(db: Database) -> str | None:
    """A fenced transaction, then an unfenced one on the same server connection that idles
    well past the first one's bound; the second one's SQLSTATE, or None if it committed."""
    db.sql("select pgfence.register('r')")
    ttl = TTL_S
    while (fenced := fenced_once(db, ttl)) is None:
        ttl *= 2
    s, backend = fenced
    s.begin()
    assert s.one("select pg_backend_pid()") == backend, "not the same server connection"
    db.wait_until("select clock_timestamp() > %s + make_interval(secs => %s)",
                  (db.one("select now()"), ttl + PAST_S))
    try:
        s.run("select 1")
        s.commit()
        return None
    except psycopg.Error as e:
        return e.sqlstate or type(e).__name__


def test_a_later_transaction_may_idle_past_the_fenced_ones_bound(any_db: Database) -> None:
    assert unfenced_after_fenced(any_db) is None


def test_negative_control_a_bound_for_the_session_cuts_it_off(any_db: Database) -> None:
    any_db.install_mutant("idle-limit-for-the-session")
    assert unfenced_after_fenced(any_db) is not None


SHOW = "select current_setting('idle_in_transaction_session_timeout')"


def limit_after_a_renewal(db: Database) -> tuple[str, str, str]:
    """The idle limit in force on a connection before pgfence was called on it, in a
    transaction that renews, and in the next transaction on the same server connection."""
    db.sql("select pgfence.register('r')")
    s = db.session("s")
    s.begin()
    backend = s.one("select pg_backend_pid()")
    before = str(s.one(SHOW))
    s.commit()
    lease = acquired(s.acquire("r"))
    s.begin()
    assert s.one("select pg_backend_pid()") == backend, "not the same server connection"
    s.renew(lease)
    during = str(s.one(SHOW))
    s.commit()
    s.begin()
    assert s.one("select pg_backend_pid()") == backend, "not the same server connection"
    after = str(s.one(SHOW))
    s.commit()
    return before, during, after


def test_a_renewals_idle_limit_ends_with_its_transaction(any_db: Database) -> None:
    before, during, after = limit_after_a_renewal(any_db)
    assert during == "5s" and before != during, (before, during)
    assert after == before


def test_negative_control_a_renewals_limit_for_the_session_stays(any_db: Database) -> None:
    any_db.install_mutant("limit-idle-for-the-session")
    before, during, after = limit_after_a_renewal(any_db)
    assert during == "5s" and after == "5s" != before


def replayed_on_the_same_connection(db: Database) -> str | None:
    """A marker read in a fenced transaction, set again in a later one on the same connection
    after the lease was released; the write's SQLSTATE, or None if it was written."""
    db.sql("select pgfence.register('r')")
    db.sql("create table audit (generation bigint)")
    db.sql("grant all on audit to public")
    db.sql("select pgfence.protect('audit', 'r')")
    s = db.session("s")
    lease = acquired(s.acquire("r"))
    s.begin()
    backend = s.one("select pg_backend_pid()")
    s.fence(lease)
    marker = s.one("select current_setting('pgfence.fenced')")
    s.commit()
    s.release(lease)
    s.begin()
    assert s.one("select pg_backend_pid()") == backend, "not the same server connection"
    s.run("select set_config('pgfence.fenced', %s, true)", (marker,))
    try:
        s.run("insert into audit values (1)")
        s.commit()
        return None
    except psycopg.Error as e:
        s.rollback()
        return e.sqlstate
    finally:
        assert db.sql("select * from audit") in ([], [(1,)])


def test_a_replayed_marker_writes_nothing(any_db: Database) -> None:
    assert replayed_on_the_same_connection(any_db) == "PF007"
    assert any_db.sql("select * from audit") == []


def test_negative_control_a_marker_tied_to_no_transaction(any_db: Database) -> None:
    any_db.install_mutant("fence-token-replayable")
    assert replayed_on_the_same_connection(any_db) is None
    assert any_db.sql("select * from audit") == [(1,)]
