"""The reference client: how a worker or a control-plane replica uses pgfence from Python.

Owner    holds one lease: acquires it, renews it in a background thread, knows locally when it
         must stop trusting it, runs fenced transactions, drains and releases. Renewal can be
         tied to progress (``renew_until``): past the deadline the renewer drains and stops.
Worker   claims tasks under an Owner, runs a handler under a deadline (``handler_timeout``),
         reports results by attempt id.
Leader   a standby that polls until it owns the resource, for control planes.

Safety never rests on this module: the database refuses a stale owner whatever the client
believes (I1-I5). The client's job is liveness and good manners: stop claiming as soon as
ownership is in doubt, so a stale process does as little unfenced work as possible.

Sync API on psycopg 3, one statement per call and no session state (``prepare_threshold=None``):
it works through PgBouncer or Supavisor in transaction pooling mode.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from pgfence.connection import connect

Handler = Callable[[Any], Any]


class LeaseLost(Exception):
    """Ownership is lost or in doubt: stop claiming and writing at once."""


@dataclass
class Owner:
    """One owner's hold on one resource.

    ``valid`` turns false when a renewal fails, when ownership is refused, or when the local
    deadline passes: the last successful renewal's *send* time plus the ttl. Measuring from
    the send keeps a slow success from stretching the lease: the database started the new
    term no earlier than the request left. It also turns false when a progress deadline set
    with ``renew_until`` passes.
    """

    dsn: str
    resource: str
    owner: str = field(default_factory=lambda: f"owner-{uuid.uuid4().hex[:8]}")
    ttl: float = 30.0
    renew_every: float | None = None         # default ttl / 3
    clock: Callable[[], float] = time.monotonic
    lease_id: uuid.UUID | None = None
    generation: int | None = None
    lost: str | None = None
    _valid_until: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _wake: threading.Event = field(default_factory=threading.Event)   # stop or a new deadline
    _progress: tuple[float, str] | None = None   # renew only until then (on clock), and why
    _renewer: threading.Thread | None = None

    @property
    def valid(self) -> bool:
        return self.lease_id is not None and self.lost is None and self.clock() < self._valid_until

    def check(self) -> None:
        if not self.valid:
            raise LeaseLost(self.lost or f"no lease on {self.resource} (expired locally)")

    def acquire(self, invocation_id: uuid.UUID | None = None) -> bool:
        """Takes the lease if nobody holds it; starts the renewer. False while another owns it.

        Raises psycopg errors as they come: PF003 means the resource is disabled (exit).
        """
        sent = self.clock()
        with connect(self.dsn, self.owner) as conn:
            row = conn.execute(
                "select lease_id, generation "
                "from pgfence.acquire(%s, %s, make_interval(secs => %s), %s)",
                (self.resource, self.owner, self.ttl, invocation_id)).fetchone()
        if row is None or row[0] is None:
            return False
        self.lease_id, self.generation, self.lost = row[0], row[1], None
        self._valid_until = sent + self.ttl
        self._progress = None
        self._stop.clear()
        self._wake.clear()
        self._renewer = threading.Thread(target=self._renew_loop, daemon=True,
                                         name=f"renew-{self.resource}")
        self._renewer.start()
        return True

    def renew_once(self, conn: psycopg.Connection[tuple[Any, ...]]) -> str:
        """One renewal; returns the lease's state (active or draining)."""
        sent = self.clock()
        try:
            row = conn.execute("select state from pgfence.renew(%s, make_interval(secs => %s))",
                               (self.lease_id, self.ttl)).fetchone()
        except psycopg.Error as e:
            if e.sqlstate == "PF001":
                self.lost = f"renewal refused: {e.diag.message_primary}"
            raise
        self._valid_until = max(self._valid_until, sent + self.ttl)
        return str(row[0]) if row else "active"

    def renew_until(self, deadline: float | None, why: str = "a progress deadline") -> None:
        """Ties renewal to progress: the renewer renews only until ``deadline`` (on ``clock``);
        None lifts the limit. If the deadline passes first, the renewer stops for good, drains
        the lease so that a successor is admitted at once, and marks it lost (``why``): whoever
        set the deadline is not making progress, and must not keep the resource by proxy.

        Nothing is killed: the late holder runs on, its fences are refused (the lease is no
        longer active), and what it reports is judged by the database (I5).
        """
        self._progress = None if deadline is None else (deadline, why)
        self._wake.set()

    def _renew_loop(self) -> None:
        every = self.renew_every or self.ttl / 3
        conn: psycopg.Connection[tuple[Any, ...]] | None = None
        # The renewal cadence is real time; a progress deadline is judged on `clock`.
        next_renewal = time.monotonic() + every
        while not self._stop.is_set():
            progress = self._progress
            wait = next_renewal - time.monotonic()
            if progress is not None:
                wait = min(wait, progress[0] - self.clock())
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()          # then read the state again: no wake-up is lost
                continue
            if progress is not None and self.clock() >= progress[0]:
                # Checked before every renewal: none is sent for a holder past its deadline.
                conn = self._abandon(conn, progress[1])
                break
            next_renewal = time.monotonic() + every
            try:
                conn = conn or connect(self.dsn, f"{self.owner}-renew")
                self.renew_once(conn)
            except psycopg.Error:
                # A transient failure only costs time: the local deadline decides. A refusal
                # (PF001) has set `lost` and ends the loop.
                if conn is not None:
                    conn.close()
                conn = None
                if self.lost:
                    break
        if conn is not None:
            conn.close()

    def _abandon(self, conn: psycopg.Connection[tuple[Any, ...]] | None,
                 why: str) -> psycopg.Connection[tuple[Any, ...]] | None:
        """Past a progress deadline: stop trusting the lease, and drain it (not release: the
        holder may still hold tasks, and monitoring should show a draining lease, not an
        ended one). If the drain fails, the unrenewed lease expires within its ttl anyway."""
        self.lost = f"renewal stopped: {why}"
        try:
            conn = conn or connect(self.dsn, f"{self.owner}-renew")
            with _suppress_not_current():
                conn.execute("select pgfence.drain(%s)", (self.lease_id,))
        except psycopg.Error:
            if conn is not None:
                conn.close()
            conn = None
        return conn

    @contextmanager
    def fenced(self, conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
        """A transaction that is the owner's only if fence() passes in it (I2)."""
        self.check()
        try:
            with conn.transaction():
                conn.execute("select pgfence.fence(%s)", (self.lease_id,))
                yield conn
        except psycopg.Error as e:
            if e.sqlstate in ("PF001", "PF007"):
                self.lost = f"fence refused: {e.diag.message_primary}"
                raise LeaseLost(self.lost) from e
            raise

    def drain(self) -> None:
        if self.lease_id is not None and self.lost is None:
            with connect(self.dsn, self.owner) as conn, _suppress_not_current():
                conn.execute("select pgfence.drain(%s)", (self.lease_id,))

    def release(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._renewer is not None:
            self._renewer.join()
        if self.lease_id is not None:
            with connect(self.dsn, self.owner) as conn, _suppress_not_current():
                conn.execute("select pgfence.release(%s)", (self.lease_id,))
        self.lost = self.lost or "released"


@contextmanager
def _suppress_not_current() -> Iterator[None]:
    try:
        yield
    except psycopg.Error as e:
        if e.sqlstate != "PF001":
            raise


@dataclass
class Worker:
    """Claims and handles tasks of one queue while its Owner is valid.

    Each handler call runs under a deadline, ``handler_timeout`` seconds on the owner's clock
    (default: ``visibility``, after which the task may be handed to someone else anyway).
    A handler still running at its deadline makes the owner stop renewing and drain
    (``Owner.renew_until``): a hung handler cannot keep the lease alive forever. The worker
    then starts no other handler; when the hung one returns, its result is reported (accepted
    if nobody re-claimed the task, stale otherwise) and the worker releases and returns.
    ``handler_timeout=math.inf`` disables the deadline. ``verdicts`` counts the database's
    answers to the reports (accepted, duplicate, stale).
    """

    owner: Owner
    queue: str
    handler: Handler
    qty: int = 1
    visibility: float = 30.0
    idle_wait: float = 1.0
    stop: threading.Event = field(default_factory=threading.Event)
    handled: int = 0
    handler_timeout: float | None = None     # default: visibility; math.inf: no deadline
    verdicts: Counter[str] = field(default_factory=Counter)

    def install_sigterm(self) -> None:
        """SIGTERM drains: stop claiming, finish what is held, release."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())

    def run(self, max_tasks: int | None = None) -> None:
        with connect(self.owner.dsn, self.owner.owner) as conn:
            try:
                while not self.stop.is_set() and (max_tasks is None or self.handled < max_tasks):
                    if not self.owner.valid:
                        break                   # ownership in doubt: claim nothing more
                    tasks = self._claim(conn)
                    if not tasks:
                        conn.execute("select pgfence.requeue_expired()")
                        self.stop.wait(self.idle_wait)
                        continue
                    for attempt_id, payload in tasks:
                        # After a handler ran past its deadline, start no other: the rest of
                        # the batch returns to the queue when its visibility runs out.
                        if not self.owner.valid:
                            break
                        self._handle(conn, attempt_id, payload)
            finally:
                self._leave()

    def _leave(self) -> None:
        # Release even when drain fails (the database away, a timeout): release is what stops
        # the renewer, which would otherwise keep the lease alive for a worker that has quit.
        try:
            self.owner.drain()
        finally:
            self.owner.release()

    def _claim(self, conn: psycopg.Connection[tuple[Any, ...]]) -> list[tuple[uuid.UUID, Any]]:
        try:
            return [(r[0], r[1]) for r in conn.execute(
                "select attempt_id, payload "
                "from pgfence.claim(%s, %s, %s, make_interval(secs => %s))",
                (self.owner.lease_id, self.queue, self.qty, self.visibility)).fetchall()]
        except psycopg.Error as e:
            if e.sqlstate == "PF001":
                self.owner.lost = f"claim refused: {e.diag.message_primary}"
                return []
            raise

    @contextmanager
    def _deadline(self) -> Iterator[None]:
        """The renewer keeps the lease for this handler call only until its deadline."""
        timeout = self.visibility if self.handler_timeout is None else self.handler_timeout
        if timeout != math.inf:
            self.owner.renew_until(self.owner.clock() + timeout,
                                   f"a handler ran past its deadline ({timeout:g} s)")
        try:
            yield
        finally:
            self.owner.renew_until(None)

    def _handle(self, conn: psycopg.Connection[tuple[Any, ...]], attempt_id: uuid.UUID,
                payload: Any) -> None:
        try:
            with self._deadline():
                result = self.handler(payload)
        except LeaseLost:
            raise
        except Exception as e:
            self._report(conn, "fail", attempt_id, {"error": str(e)})
        else:
            self._report(conn, "complete", attempt_id, result)
        self.handled += 1

    def _report(self, conn: psycopg.Connection[tuple[Any, ...]], kind: str,
                attempt_id: uuid.UUID, body: Any) -> None:
        """complete or fail; the database's verdict (I5) is counted in ``verdicts``."""
        query = ("select pgfence.complete(%s, %s)" if kind == "complete"
                 else "select pgfence.fail(%s, %s)")
        row = conn.execute(query, (attempt_id, json.dumps(body))).fetchone()
        assert row is not None
        self.verdicts[str(row[0])] += 1


@dataclass
class Leader:
    """A control-plane replica: a standby until it owns the resource, then the leader.

    Every durable mutation goes through ``Owner.fenced``; a standby refuses mutations.
    """

    owner: Owner
    poll_interval: float = 1.0
    polls: int = 0

    def wait_for_leadership(self, stop: threading.Event) -> bool:
        while not stop.is_set():
            self.polls += 1
            try:
                if self.owner.acquire():
                    return True
            except psycopg.OperationalError:
                pass                            # the database is away; keep polling
            stop.wait(self.poll_interval)
        return False
