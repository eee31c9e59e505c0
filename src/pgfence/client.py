"""The reference client: how a worker or a control-plane replica uses pgfence from Python.

Owner    holds one lease: acquires it, renews it in a background thread, knows locally when it
         must stop trusting it, runs fenced transactions, drains and releases. Renewal can be
         tied to progress (``renew_until``): past the deadline the renewer drains and stops.
Worker   claims tasks under an Owner, calls a handler with the task's ``Context`` under a
         deadline (``handler_timeout``), reports results by attempt id.
Leader   a standby that polls until it owns the resource, for control planes.
LeaderService  a control-plane replica's whole life: elect, lead, step down, elect again, with
         callbacks, and the answers of its ``/health`` and ``/ready`` endpoints.

The same classes over asyncio are in ``pgfence.aio``; both drive one set of rules
(``pgfence._core``), so they behave alike, faults included: lost connections are reconnected
with jittered backoff, results whose answer was lost are sent again and their verdict taken,
and after any lost connection the lease is trusted again only once a renewal succeeds. See
docs/python.md.

Safety never rests on this module: the database refuses a stale owner whatever the client
believes (I1-I5). The client's job is liveness and good manners: stop claiming as soon as
ownership is in doubt, so a stale process does as little unfenced work as possible.

Sync API on psycopg 3, one statement per call and no session state but prepared statements,
and those only on a connection that reaches the server directly (``Owner.prepare``,
``pgfence.connection.direct``): it works through PgBouncer or Supavisor in transaction pooling
mode.
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from pgfence import _core
from pgfence._core import (
    FENCE,
    Call,
    Finish,
    Handle,
    LeaseLost,
    Link,
    Notify,
    Op,
    Retry,
    Sleep,
    StartRenewer,
    Steps,
    StopRenewer,
    T,
    Task,
    Together,
    reason,
)
from pgfence.connection import Connection, connect
from pgfence.errors import typed

__all__ = ["Context", "Finish", "Handler", "Leader", "LeaderService", "LeaseLost", "Owner",
           "PgmqWorker", "Retry", "Task", "Worker", "reason"]


class Context(_core.ContextBase):
    """What a handler gets beside its payload: the ``task`` (``task_id``, ``attempt_id``,
    ``attempt``, ``payload``), its ``deadline`` on the owner's clock and ``remaining()``
    seconds, ``cancelled``, and ``extend()``."""

    def __init__(self, held: _core.Held, worker: Worker) -> None:
        super().__init__(held, worker.owner)
        self._worker = worker

    @property
    def cancelled(self) -> threading.Event:
        """Set when the owner gives the lease up or learns it is lost (the handler ran past its
        deadline, a renewal was refused): stop, and leave nothing half done outside the
        database. The worker never interrupts a handler itself."""
        event = self._worker.owner.cancelled
        assert isinstance(event, threading.Event)
        return event

    def extend(self, seconds: float) -> datetime | None:
        """Keeps the task ``seconds`` more from now, and moves the handler's deadline to then;
        the database's new visibility end, or None when this attempt no longer holds the task
        (its visibility ran out and another attempt claimed it: stop, the result will be
        stale)."""
        return self._worker._drive(self._worker._extend_for_handler(self._held, seconds))


Handler = Callable[[Any, Context], Any]
"""``handler(payload, context)``: returns the task's result (JSON), raises to fail it."""


def drive(performer: Callable[[Op], Any], steps: Steps[T]) -> T:
    """Runs one of the core's operations: performs what it yields, sends back the answer or
    throws in the error (any, so that its ``finally`` blocks run their steps too). A database
    error that ends the operation is raised as its ``pgfence.errors`` class."""
    answer: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = steps.send(answer) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except psycopg.Error as e:
            if (t := typed(e)) is e:
                raise
            raise t from None
        answer, error = None, None
        try:
            answer = performer(op)
        except BaseException as e:
            error = e


class _Links:
    """The connections of one owner or worker, opened on first use and dropped when lost; one
    thread at a time on each (a service's readiness probes come from the server's threads)."""

    def __init__(self, dsn: str, name: str, prepare: bool | None) -> None:
        self.dsn, self.name, self.prepare = dsn, name, prepare
        self._conns: dict[Link, Connection] = {}
        self._locks = {link: threading.Lock() for link in Link}

    def execute(self, op: Call | Together) -> Any:
        """A Call's rows, or a Together's list of them."""
        with self._locks[op.link]:
            conn = self._conns.get(op.link)
            if conn is None or conn.closed:
                conn = self._conns[op.link] = connect(self.dsn, self.name + op.link.value,
                                                      prepare=self.prepare)
            try:
                if isinstance(op, Call):
                    return conn.execute(op.query, op.params).fetchall()
                # One pipeline and one Sync: one round trip, one implicit transaction. (A
                # libpq without pipelines: the same transaction, a round trip a statement.)
                with conn.pipeline() if psycopg.Pipeline.is_supported() else \
                        conn.transaction():
                    cursors = [conn.execute(c.query, c.params) for c in op.calls]
                return [c.fetchall() for c in cursors]
            except psycopg.Error as e:
                if conn.broken or conn.closed or _core.classify(e) is _core.Failure.CONNECTION:
                    conn.close()
                    del self._conns[op.link]
                raise

    def close(self, *links: Link) -> None:
        for link in links:
            conn = self._conns.pop(link, None)
            if conn is not None:
                conn.close()


def _sleep(op: Sleep) -> None:
    if op.wake is None:
        threading.Event().wait(op.seconds)
        return
    assert isinstance(op.wake, threading.Event)
    op.wake.wait(op.seconds)
    if op.clear:
        op.wake.clear()


@dataclass
class Owner(_core.LeaseCore):
    """One owner's hold on one resource.

    ``valid`` turns false when a renewal fails, when ownership is refused, when the local
    deadline passes (the last successful renewal's *send* time plus the ttl: a slow success
    cannot stretch the lease), when a progress deadline set with ``renew_until`` passes, and
    after any lost connection until a renewal succeeds again. ``cancelled`` is set when the
    lease is given up or found lost. ``lease_id`` is a capability: it never appears in a
    message of the client; ``describe()`` names the lease by resource and generation.
    """

    _links: _Links = field(init=False, repr=False)
    _renewer: threading.Thread | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._links = _Links(self.dsn, self.owner, self.prepare)

    def _event(self) -> threading.Event:
        return threading.Event()

    def _perform(self, op: Op) -> Any:
        if isinstance(op, Call):
            return self._links.execute(op)
        if isinstance(op, Sleep):
            return _sleep(op)
        if isinstance(op, StartRenewer):
            self._renewer = threading.Thread(target=self._renew_in_background, daemon=True,
                                             name=f"renew-{self.resource}")
            self._renewer.start()
            return None
        if isinstance(op, StopRenewer):
            if self._renewer is not None and self._renewer is not threading.current_thread():
                self._renewer.join()
            return None
        raise TypeError(f"an Owner does not perform {op!r}")

    def _renew_in_background(self) -> None:
        try:
            drive(self._perform, self._renew_loop())
        finally:
            self._links.close(Link.RENEW)

    def _drive(self, steps: Steps[T]) -> T:
        return drive(self._perform, steps)

    def acquire(self, invocation_id: uuid.UUID | None = None) -> bool:
        """Takes the lease if nobody holds it and starts the renewer; False while another owns
        it. A lost connection is retried (``retry``); if the lost attempt had been granted,
        the retry answers False, and that lease, renewed by nobody, expires within its ttl.

        Raises psycopg errors as they come: PF003 means the resource is disabled (exit).
        """
        return self._drive(self._acquire(invocation_id))

    def renew(self) -> str:
        """One renewal now (the renewer does this by itself); the lease's state, ``active``
        or ``draining``. PF001 marks the lease lost, and is raised."""
        return self._drive(self._renew(Link.OWNER))

    def trust(self) -> bool:
        """Whether the lease may be worked under, renewing first if a connection was lost
        since the last renewal (retried with backoff while the lease could still be current)."""
        return self._drive(self._trust(Link.OWNER))

    @contextmanager
    def fenced(self, conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on ``conn`` that is the owner's only if fence() passes in it (I2).
        LeaseLost when the lease is not trusted locally or the database refuses the fence."""
        if not self.trust():
            self.check()
        try:
            with conn.transaction():
                conn.execute(FENCE, (self.lease_id,))
                yield conn
        except psycopg.Error as e:
            lost = self._refused(e, "fence")
            if lost is not None:
                raise lost from e
            raise

    def drain(self) -> None:
        """Stops claiming; the resource is free for a successor at once."""
        self._drive(self._drain())

    def release(self) -> None:
        """Stops the renewer, then ends the lease (a lease already ended is no error)."""
        try:
            self._drive(self._release())
        finally:
            self._links.close(Link.OWNER)


@dataclass
class Worker(_core.WorkerCore):
    """Claims and handles tasks of one queue while its Owner is valid.

    ``handler(payload, context)`` is called for each task (``Context``): its return value
    completes the task, an exception fails it (``{"error": message}``), LeaseLost ends the run.

    Each handler call runs under a deadline, ``handler_timeout`` seconds on the owner's clock
    (default: ``visibility``; for the first task of a claim, counted from the claim). A claim
    of ``qty`` tasks holds them for ``qty`` such deadlines (``hold``), so handlers that keep to
    theirs need no extend. Before a handler starts, its task is extended if its visibility
    would end before that deadline (an attempt found stale is skipped), so no handler runs on
    a task that someone else may claim. A batch's results are sent in one ``complete_many``
    when its handlers are done, in one transaction with the next claim (one round trip, one
    commit), or before the next handler once ``report_within`` seconds passed since the first
    result in hand began; a failure is sent at once.

    A handler still running at its deadline makes the owner stop renewing and drain
    (``Owner.renew_until``) and sets ``context.cancelled``: a hung handler cannot keep the
    lease alive forever. The worker then starts no other handler; when the hung one returns,
    its result is reported (accepted if nobody re-claimed the task, stale otherwise) and the
    worker releases and returns. ``handler_timeout=math.inf`` disables the deadline.

    ``verdicts`` counts the database's answers to the reports (accepted, duplicate, stale);
    ``skipped`` the tasks found stale before their handler started.
    """

    owner: Owner
    handler: Handler
    stop: threading.Event = field(default_factory=threading.Event)
    _links: _Links = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._links = _Links(self.owner.dsn, self.owner.owner, self.owner.prepare)

    def install_sigterm(self) -> None:
        """SIGTERM drains: stop claiming, finish what is held, release."""
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())

    def run(self, max_tasks: int | None = None, until_idle: bool = False) -> None:
        """The loop; drains and releases the lease when it ends, however it ends. It ends after
        ``max_tasks`` handler calls, on ``stop``, when ownership is lost, or (``until_idle``)
        when the queue has nothing to claim and nothing to requeue."""
        try:
            self._drive(self._run(max_tasks, until_idle))
        finally:
            self._links.close(Link.WORK)

    def _drive(self, steps: Steps[T]) -> T:
        return drive(self._perform, steps)

    def _perform(self, op: Op) -> Any:
        if isinstance(op, Call | Together) and op.link is Link.WORK:
            return self._links.execute(op)
        if isinstance(op, Sleep):
            return _sleep(op)
        if isinstance(op, Handle):
            return self.handler(op.held.task.payload, Context(op.held, self))
        return self.owner._perform(op)


@dataclass
class PgmqWorker(Worker, _core.PgmqRules):
    """A ``Worker`` of a pgmq queue, through the pgmq layer (schema ``pgfence_pgmq``; see
    ``pgfence._core.PgmqRules`` and docs/pgmq.md): ``context.task`` is the message, with its
    ``msg_id`` as ``task_id`` and its ``read_ct`` as ``attempt``; a handler's return archives
    the message (``finish="delete"`` deletes it), an exception leaves it to be read again.
    (Worker first: its fields, ``stop`` with its default, are the ones a dataclass keeps.)"""

@dataclass
class Leader:
    """A control-plane replica: a standby until it owns the resource, then the leader.

    Every durable mutation goes through ``Owner.fenced``; a standby refuses mutations.
    """

    owner: Owner
    poll_interval: float = 1.0
    polls: int = 0

    def wait_for_leadership(self, stop: threading.Event) -> bool:
        """Polls ``acquire`` until this replica owns the resource (True) or ``stop`` is set
        (False); while the database is away it keeps polling."""
        def polled() -> None:
            self.polls += 1
        return self.owner._drive(_core.lead(self.owner, stop, self.poll_interval, polled))


@dataclass
class LeaderService(_core.LeaderCore):
    """A control-plane replica (docs/control-plane.md): ``run()`` elects, leads while the lease
    holds, steps down (releases) as soon as it does not, and elects again, until ``stop_now()``.
    ``on_elected(generation)`` and ``on_stepped_down(why)`` are called from ``run``'s thread:
    rebuild in-memory state from the database when elected, drop it when stepping down.

    Every durable mutation goes through ``owner.fenced`` (a refusal steps the replica down);
    a standby refuses mutations, naming ``current_leader()``. ``health()`` and ``readiness()``
    are the answers of ``/health`` (liveness, every replica) and ``/ready`` (200 only on the
    current owner: leading, its lease trusted locally and ``fence`` passing in the database).
    """

    owner: Owner
    on_elected: Callable[[int], None] | None = None
    on_stepped_down: Callable[[str], None] | None = None
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        """Serves until ``stop_now()``; a leader releases on the way out."""
        drive(self._perform, self._serve())

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """``/ready``: the HTTP status (200 or 503) and a JSON body with the reason."""
        return drive(self._perform, self._readiness())

    def current_leader(self) -> dict[str, Any] | None:
        """The current leader as ``pgfence.resource_status`` shows it (owner, generation,
        expires_at), or None: what a standby's refusal names."""
        return drive(self._perform, self._current_leader())

    def _perform(self, op: Op) -> Any:
        if isinstance(op, Notify):
            if op.event == "elected" and self.on_elected is not None:
                self.on_elected(self.owner.generation or 0)
            elif op.event == "stepped_down" and self.on_stepped_down is not None:
                self.on_stepped_down(op.detail)
            return None
        return self.owner._perform(op)
