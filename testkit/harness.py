"""Named sessions and steps for interleaving tests, after PostgreSQL's isolation tester.

Each session is its own connection (autocommit unless it opens a transaction with ``begin``).
A step that is expected to block runs in a thread: :meth:`Step.settle` waits until the step is
either finished or waiting on a lock, which it learns from ``pg_blocking_pids()`` and never from
a sleep, so a test's verdict does not depend on timing.

    db = Database(dsn)
    a, b = db.session("a"), db.session("b")
    a.begin(); a.fence(lease)
    step = b.start("select pgfence.acquire('r', 'b', '30 s')")
    assert step.settle() and step.blocked_by == [a.pid]
    a.commit()
    step.result()
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from pgfence.connection import connect
from testkit import mutants

Query = str | sql.SQL | sql.Composed
Params = Sequence[Any] | dict[str, Any] | None


# A test's lease runs out only when the test says so (pgfence_test.expire, or a short ttl of
# its own): an hour outlasts any test on any machine, however loaded, and so does the idle
# limit a fence derives from it (hold_current). A 30 s default lost a lease to four Supabase
# CLI commands on a busy machine (tests/test_cli_install.py, issue 23).
LONG_TTL = "1 hour"
# The longest pause between two polls of another session's state (wait_until, Step.settle):
# they start at a millisecond or two and double.
POLL_AT_MOST = 0.05
# How long a wait for another process's effect may last before a test calls it hung: a bound
# for a failure only, never a verdict, so it is long (a loaded machine is slow, not wrong).
HANG = 600.0


@dataclass(frozen=True)
class Lease:
    """A lease as ``pgfence.acquire`` returns it."""

    lease_id: uuid.UUID
    resource: str
    generation: int
    expires_at: datetime


def sqlstate(step: Callable[[], object]) -> str | None:
    """The SQLSTATE of the database error that ``step`` raises, or None if it raises none."""
    try:
        step()
    except psycopg.Error as e:
        return e.sqlstate
    return None


class Database:
    """One database: an admin connection for set-up and checks, and named sessions.

    Sessions connect to ``dsn``, which may be a transaction pooler; the admin connection goes
    to ``admin_dsn``, the server itself, where locks and blocking are observed. Session names
    must be unique: through a pooler a session's server backend is found by its name.
    """

    def __init__(self, dsn: str, admin_dsn: str | None = None) -> None:
        self.dsn = dsn
        self.server_dsn = admin_dsn or dsn
        self.pooled = self.server_dsn != dsn
        self._admin = connect(self.server_dsn, "harness")
        self._sessions: list[Session] = []

    def session(self, name: str) -> Session:
        s = Session(self, name)
        self._sessions.append(s)
        return s

    def sql(self, query: Query, params: Params = None) -> list[tuple[Any, ...]]:
        return _execute(self._admin, query, params)

    def one(self, query: Query, params: Params = None) -> Any:
        return _one(self.sql(query, params))

    def wait_until(self, query: Query, params: Params = None, timeout: float = HANG) -> None:
        """Polls until ``query`` returns true: for waiting on another process's effect. The
        timeout bounds a hung test only (no verdict rests on it), so it is long: a replica
        that replays behind a loaded machine's other work is still right."""
        deadline = time.monotonic() + timeout
        pause = 0.001
        while not self.one(query, params):
            if time.monotonic() > deadline:
                raise AssertionError(f"still false after {timeout}s: {query!r}")
            # The pace of the polls, never a verdict: without it a wait of seconds (a pg_cron
            # tick, an idle bound) kept a core of the server and one of the client busy.
            time.sleep(pause)
            pause = min(pause * 2, POLL_AT_MOST)

    def blocking_pids(self, session: Session) -> list[int]:
        """The backends that a running step of ``session`` waits for (none if not waiting)."""
        # Names are unique in one database; another test's database may use the same ones.
        rows = self.sql("select pg_blocking_pids(pid) from pg_stat_activity "
                        "where application_name = %s and state = 'active' "
                        "and datname = current_database()", (session.name,))
        return [pid for (pids,) in rows for pid in pids]

    def expire(self, lease: Lease | uuid.UUID) -> None:
        """Time passes for a lease's owner: its expiry moves into the past."""
        lease_id = lease.lease_id if isinstance(lease, Lease) else lease
        self.sql("select pgfence_test.expire(%s)", (lease_id,))

    def expire_attempt(self, attempt_id: uuid.UUID) -> None:
        """Time passes for a task's handler: its visibility runs out."""
        self.sql("select pgfence_test.expire_attempt(%s)", (attempt_id,))

    def install_mutant(self, *ids: str) -> None:
        """Installs deliberately broken variants, for a negative control: mutants of the one
        catalogue (tests/mutation/mutants.toml, testkit.mutants), named by their ids.

        Each is the real definition with a piece of text replaced, so the control breaks
        exactly the mechanism it is about, and scripts/mutate runs the same variant against the
        whole suite; it fails loudly if that text is gone.
        """
        mutants.install(self.one, self.replace_in_function, ids)

    def replace_in_function(self, signature: str, old: str, new: str) -> None:
        """The definition of function ``signature`` with ``old`` replaced (install_mutant's
        step; tests name a mutant instead)."""
        src = self.one("select pg_get_functiondef(%s::regprocedure)", (signature,))
        assert old in src, f"{old!r} not found in {signature}: the negative control is out of date"
        self.sql(src.replace(old, new))

    def close(self) -> None:
        for s in self._sessions:
            s.close()
        self._admin.close()


class Session:
    """A named connection that runs steps in order."""

    def __init__(self, db: Database, name: str) -> None:
        self.db = db
        self.name = name
        self.conn = connect(db.dsn, name)

    @property
    def pid(self) -> int:
        """The server backend serving this session. Through a transaction pooler it is known
        only while the session is inside a transaction (or running a statement)."""
        if not self.db.pooled:
            return self.conn.info.backend_pid
        return int(self.db.one("select pid from pg_stat_activity "
                               "where application_name = %s and state <> 'idle' "
                               "and datname = current_database()", (self.name,)))

    # -- plain steps ---------------------------------------------------------------------
    def run(self, query: Query, params: Params = None) -> list[tuple[Any, ...]]:
        return _execute(self.conn, query, params)

    def one(self, query: Query, params: Params = None) -> Any:
        return _one(self.run(query, params))

    def begin(self) -> None:
        self.run("begin")

    def commit(self) -> None:
        self.run("commit")

    def rollback(self) -> None:
        self.run("rollback")

    def start(self, query: Query, params: Params = None) -> Step:
        """Runs a step in a thread, for a step that may block on another session's lock."""
        return Step(self, query, params)

    def hold_open(self) -> None:
        """Lifts the idle limit of this session's open transaction, as any session may: a
        pgfence call that locks rows others need limits how long its transaction may then stay
        idle (5 s, or what the lease had left; tests/test_idle_bound.py), and a test that holds
        the transaction open while it works elsewhere must not race that limit (issue 23)."""
        self.run("set local idle_in_transaction_session_timeout = 0")

    # -- pgfence calls -------------------------------------------------------------------
    def acquire(self, resource: str, owner: str | None = None, ttl: str = LONG_TTL,
                invocation_id: uuid.UUID | None = None) -> Lease | None:
        row = self.run("select * from pgfence.acquire(%s, %s, %s::interval, %s)",
                       (resource, owner or self.name, ttl, invocation_id))[0]
        return None if row[0] is None else Lease(*row)

    def renew(self, lease: Lease, ttl: str = LONG_TTL) -> tuple[datetime, str]:
        expires_at, state = self.run("select * from pgfence.renew(%s, %s::interval)",
                                     (lease.lease_id, ttl))[0]
        return expires_at, state

    def fence(self, lease: Lease) -> int:
        return int(self.one("select pgfence.fence(%s)", (lease.lease_id,)))

    def drain(self, lease: Lease) -> str:
        return str(self.one("select pgfence.drain(%s)", (lease.lease_id,)))

    def release(self, lease: Lease) -> bool:
        return bool(self.one("select pgfence.release(%s)", (lease.lease_id,)))

    def close(self) -> None:
        self.conn.close()


class Step:
    """A step running in its own thread."""

    def __init__(self, session: Session, query: Query, params: Params) -> None:
        self.session = session
        self.blocked_by: list[int] = []
        self._rows: list[tuple[Any, ...]] = []
        self._error: BaseException | None = None
        self._done = threading.Event()
        self.finished_at: float | None = None  # time.monotonic() when the step ended
        self._thread = threading.Thread(target=self._run, args=(query, params),
                                        name=f"step-{session.name}", daemon=True)
        self._thread.start()

    def _run(self, query: Query, params: Params) -> None:
        try:
            self._rows = self.session.run(query, params)
        except BaseException as e:  # handed to the test by result()
            self._error = e
        finally:
            self.finished_at = time.monotonic()
            self._done.set()

    def settle(self, timeout: float = 30.0) -> bool:
        """Waits until the step waits on a lock (True) or has finished (False)."""
        deadline = time.monotonic() + timeout
        # Most steps finish at once: no need to ask the server about those.
        if self._done.wait(0.001):
            return False
        pause = 0.002
        while time.monotonic() < deadline:
            if self._done.is_set():
                return False
            pids = self.session.db.blocking_pids(self.session)
            if pids:
                self.blocked_by = pids
                return True
            self._done.wait(pause)        # the poll's pace (see wait_until), not a verdict
            pause = min(pause * 2, POLL_AT_MOST)
        raise AssertionError(
            f"step of {self.session.name} neither finished nor blocked in {timeout}s")

    def result(self, timeout: float = 30.0) -> list[tuple[Any, ...]]:
        """The step's rows once it finished; re-raises its error."""
        if not self._done.wait(timeout):
            raise AssertionError(f"step of {self.session.name} still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._rows

    def one(self, timeout: float = 30.0) -> Any:
        return _one(self.result(timeout))


def _execute(conn: psycopg.Connection[tuple[Any, ...]], query: Query,
             params: Params) -> list[tuple[Any, ...]]:
    with conn.cursor() as cur:
        cur.execute(query, params)
        return cur.fetchall() if cur.description else []


def _one(rows: list[tuple[Any, ...]]) -> Any:
    assert len(rows) == 1 and len(rows[0]) == 1, f"expected one value, got {rows!r}"
    return rows[0][0]
