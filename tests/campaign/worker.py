"""A campaign worker process: ``python -m tests.campaign.worker --dsn DSN --resource R ...``.

pgfence mode, the real thing: a standby that polls ``Owner.acquire`` until it owns the
resource (presenting ``--invocation`` when the supervisor started it after ``request_start``),
then a ``Worker`` of the reference client (with ``--layer pgmq``, a ``PgmqWorker`` over the
pgmq queue: a message's msg_id is its task id, its read count the attempt, and ``archive`` the
result, recorded the same way). Its handler writes one row per attempt to the
resource's protected table inside ``Owner.fenced``, stamped with lease, generation, task and
attempt (from the handler's context); the task is then completed by one statement that also
records what ``complete`` answered (sent again, with the same attempt id, after a lost
answer). An invocation worker exits when its one term of ownership ends; a process worker goes
back to standby.

advisory mode, a negative control: the "lease" is ``pg_try_advisory_lock`` taken through a
transaction pooler, and the writes are unfenced.

The supervisor steers a worker through stdin, one command a line, and reads answers on stdout:

    pause POINT   pause at the next POINT (before-fence, in-fence, before-complete): the worker
                  answers ``paused POINT`` and stops itself with SIGSTOP; SIGCONT resumes it
    disarm        cancels a pause not taken yet, answering ``disarmed``

Every ``pause`` gets exactly one answer. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from pgfence._core import Held, Kind
from pgfence.client import Context, LeaseLost, Owner, PgmqWorker, Worker
from pgfence.connection import connect

POINTS = ("before-fence", "in-fence", "before-complete")


def log(name: str, message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {name}: {message}", file=sys.stderr, flush=True)


def die_with_parent() -> None:
    """A worker must not outlive its supervisor, not even while stopped: SIGKILL reaches a
    stopped process, a closed stdin does not."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() == 1:                   # the supervisor died before prctl
        os._exit(1)


class Control:
    """The pause commands from the supervisor (see the module's docstring)."""

    def __init__(self, stop: threading.Event) -> None:
        self._lock = threading.Lock()
        self._armed: str | None = None
        self._stop = stop
        threading.Thread(target=self._read, daemon=True, name="control").start()

    def _read(self) -> None:
        for line in sys.stdin:
            command, _, point = line.strip().partition(" ")
            with self._lock:
                if command == "pause" and point in POINTS:
                    self._armed = point
                elif command == "disarm" and self._armed is not None:
                    self._armed = None
                    self._answer("disarmed")
        self._stop.set()                    # stdin closed: the supervisor is gone

    def _answer(self, line: str) -> None:
        print(line, flush=True)

    def armed(self, point: str) -> bool:
        with self._lock:
            return self._armed == point

    def pause_at(self, *points: str) -> None:
        with self._lock:
            point = self._armed
            if point not in points:
                return
            self._armed = None
            self._answer(f"paused {point}")
        os.kill(os.getpid(), signal.SIGSTOP)  # the whole process, renewer thread included


@dataclass(frozen=True)
class Task:
    task_id: int
    attempt: int
    attempt_id: uuid.UUID


class FencedWrite:
    """The task handler: one row per attempt in the resource's protected table, written in a
    transaction that fenced the lease, on a connection of its own."""

    def __init__(self, owner: Owner, name: str, work: float, control: Control) -> None:
        self.owner = owner
        self.name = name
        self.work = work
        self.control = control
        self.table = sql.Identifier("campaign", f"writes_{owner.resource}")
        self._conn: psycopg.Connection[tuple[Any, ...]] | None = None

    def __call__(self, payload: Any, ctx: Context) -> dict[str, Any]:
        task = Task(ctx.task.task_id, ctx.task.attempt, ctx.task.attempt_id)
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.owner.dsn, f"{self.name}-write")
        conn = self._conn
        try:
            if self.control.armed("before-fence"):
                write_id = self._late_fence(conn, task)
            else:
                with self.owner.fenced(conn):
                    self.control.pause_at("in-fence")
                    time.sleep(self.work)    # the handler's work, inside the fenced transaction
                    # Owner.fenced sent BEGIN right before fence: now() is no later than fence.
                    write_id = self._insert(conn, task, None)
        except psycopg.Error as e:
            # Any database error of the write (its connection lost, the session ended by the
            # fence's idle limit once the lease ran out, 25P03) ends the term, as a refused
            # fence does: not a fail(), which would cost the task a backoff for what is not
            # its fault. The attempt is left to requeue_expired.
            self.close()
            raise LeaseLost(f"the handler's write failed: {type(e).__name__}") from e
        self.control.pause_at("before-complete")
        return {"task_id": task.task_id, "attempt": task.attempt, "write_id": write_id}

    def _late_fence(self, conn: psycopg.Connection[tuple[Any, ...]], task: Task) -> int:
        """A client that checked its local deadline and began its transaction, and then was
        paused (or its next message delayed) before fence reached the server. The database's
        clock alone can refuse it now: now() still says the transaction began in time.
        (Owner.fenced checks the deadline right before BEGIN: the pause falls between the
        two, which no code of the client can close.)"""
        self.owner.check()
        with conn.transaction():
            self.control.pause_at("before-fence")
            try:
                row = conn.execute("select pgfence.fence(%s), statement_timestamp()",
                                   (self.owner.lease_id,)).fetchone()
            except psycopg.Error as e:
                if e.sqlstate == "PF001":
                    self.owner.lost = f"fence refused: {e.diag.message_primary}"
                    raise LeaseLost(self.owner.lost) from e
                raise
            assert row is not None
            return self._insert(conn, task, row[1])

    def _insert(self, conn: psycopg.Connection[tuple[Any, ...]], task: Task,
                fence_sent: datetime | None) -> int:
        row = conn.execute(
            sql.SQL("insert into {} (lease_id, generation, task_id, attempt, attempt_id, worker, "
                    "fenced_not_before) values (%s, %s, %s, %s, %s, %s, coalesce(%s, now())) "
                    "returning id").format(self.table),
            (self.owner.lease_id, self.owner.generation, task.task_id, task.attempt,
             task.attempt_id, self.name, fence_sent)).fetchone()
        assert row is not None
        return int(row[0])

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass
class CampaignWorker(Worker):
    """The reference Worker, with the verdict of each complete recorded in
    ``campaign.reports`` by the statement that reports it (one statement: committed with the
    result or not at all)."""

    name: str = ""

    def _report_statement(self, kind: Kind, held: Held, body: Any) -> tuple[str, tuple[Any, ...]]:
        query, params = super()._report_statement(kind, held, body)
        if kind != "complete":
            return query, params    # (never: the handler raises LeaseLost or returns)
        return (f"with v as ({query} as verdict), "
                "r as (insert into campaign.reports (task_id, attempt, outcome, worker) "
                "      select %s, %s, verdict, %s from v) "
                "select verdict from v",
                (*params, held.task.task_id, held.task.attempt, self.name))

    def _results_statement(self, results: list[tuple[Held, Any]]
                           ) -> tuple[str, str, tuple[Any, ...]]:
        """A batch's complete_many, each id's verdict recorded the same way."""
        step, _query, params = super()._results_statement(results)
        return (step,
                "with v as (select c.outcome, c.n from pgfence.complete_many(%s, %s) "
                "                  with ordinality c(a, outcome, n)), "
                "r as (insert into campaign.reports (task_id, attempt, outcome, worker) "
                "      select t.task_id, t.attempt, v.outcome, %s "
                "        from v join unnest(%s::bigint[], %s::int[]) with ordinality "
                "                    t(task_id, attempt, n) using (n)) "
                "select outcome from v order by n",
                (*params, self.name, [h.task.task_id for h, _ in results],
                 [h.task.attempt for h, _ in results]))


@dataclass
class CampaignPgmqWorker(PgmqWorker):
    """The reference PgmqWorker, with what each archive answered recorded in
    ``campaign.reports`` by the statement that archives (by attempt id: the pgmq layer's record
    of the read says which message and read count it was)."""

    name: str = ""

    def _report_statement(self, kind: Kind, held: Held, body: Any) -> tuple[str, tuple[Any, ...]]:
        query, params = super()._report_statement(kind, held, body)
        return (f"with v as ({query} as verdict), "
                "r as (insert into campaign.reports (attempt_id, outcome, worker) "
                "      select %s, verdict, %s from v) "
                "select verdict from v",
                (*params, held.task.attempt_id, self.name))

    def _results_statement(self, results: list[tuple[Held, Any]]
                           ) -> tuple[str, str, tuple[Any, ...]]:
        step, _query, params = super()._results_statement(results)
        return (step,
                f"with v as (select a.attempt_id, a.outcome, a.n from pgfence_pgmq.{step}(%s) "
                "                  with ordinality a(attempt_id, outcome, n)), "
                "r as (insert into campaign.reports (attempt_id, outcome, worker) "
                "      select attempt_id, outcome, %s from v) "
                "select outcome from v order by n",
                (*params, self.name))


def run_pgfence(args: argparse.Namespace, control: Control, stop: threading.Event) -> None:
    standby: psycopg.Connection[tuple[Any, ...]] | None = None
    while not stop.is_set():
        owner = Owner(args.dsn, args.resource, owner=args.name, ttl=args.ttl)
        try:
            acquired = owner.acquire(args.invocation)
        except psycopg.Error as e:
            if args.invocation and e.sqlstate == "PF003":
                log(args.name, "started for a paused resource: exit")
                return
            log(args.name, f"acquire: {e.sqlstate or type(e).__name__}")
            stop.wait(args.poll)
            continue
        if not acquired:
            if args.invocation:
                log(args.name, "another owner is current: exit")
                return
            try:                            # a standby returns tasks of dead owners too
                if standby is None or standby.closed:
                    standby = connect(args.dsn, args.name)
                standby.execute("select pgfence.requeue_expired()")
            except psycopg.Error:
                standby = None
            stop.wait(args.poll)
            continue
        log(args.name, f"owns {args.resource} generation {owner.generation}")
        handler = FencedWrite(owner, args.name, args.work, control)
        kind = CampaignPgmqWorker if args.layer == "pgmq" else CampaignWorker
        worker = kind(owner, args.queue, handler, qty=args.qty, visibility=args.visibility,
                      idle_wait=args.idle_wait, stop=stop, name=args.name)
        try:
            worker.run()
        except (LeaseLost, psycopg.Error) as e:
            log(args.name, f"term ended: {type(e).__name__}: {str(e).splitlines()[0]}")
        finally:
            handler.close()
            # Worker.run drains and releases, but not when the drain itself fails (the database
            # is away): then its renewer thread would go on renewing a lease nobody works under.
            with suppress(psycopg.Error):
                owner.release()
        log(args.name, f"gave up generation {owner.generation}: "
                       f"{owner.lost or 'could not release'}")
        if args.invocation:
            return


def run_advisory(args: argparse.Namespace, control: Control, stop: threading.Event) -> None:
    """The negative control: ownership by a session advisory lock, through a transaction
    pooler, so the "session" is whichever server connection the pooler hands out next."""
    conn: psycopg.Connection[tuple[Any, ...]] | None = None
    generation: int | None = None
    table = sql.Identifier("campaign", f"writes_{args.resource}")
    while not stop.is_set():
        try:
            conn = conn if conn and not conn.closed else connect(args.dsn, args.name)
            if generation is None:
                row = conn.execute("select pg_try_advisory_lock(hashtext(%s))",
                                   (args.resource,)).fetchone()
                if not (row and row[0]):
                    stop.wait(args.poll)
                    continue
                row = conn.execute("insert into campaign.advisory_leases (resource, owner) "
                                   "values (%s, %s) returning generation",
                                   (args.resource, args.name)).fetchone()
                assert row is not None
                generation = int(row[0])
                log(args.name, f"owns {args.resource} by advisory lock, generation {generation}")
            with conn.transaction():
                control.pause_at(*POINTS)   # its only point: inside its write
                conn.execute(sql.SQL("insert into {} (generation, worker, fenced_not_before) "
                                     "values (%s, %s, now())").format(table),
                             (generation, args.name))
            stop.wait(args.work * 2)
        except psycopg.Error as e:
            # Its session is gone, it believes, and its lock with it: it will lock again.
            log(args.name, f"lost the connection: {type(e).__name__}")
            if conn is not None:
                conn.close()
            conn, generation = None, None
            stop.wait(args.poll)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dsn", required=True)
    p.add_argument("--resource", required=True)
    p.add_argument("--queue", default="jobs")
    p.add_argument("--name", required=True, help="owner name and application_name prefix")
    p.add_argument("--mode", choices=("pgfence", "advisory"), default="pgfence")
    p.add_argument("--layer", choices=("pgmq",), help="work a pgmq queue through the layer")
    p.add_argument("--invocation", type=uuid.UUID, help="acquire presenting this invocation")
    p.add_argument("--ttl", type=float, default=1.5)
    p.add_argument("--visibility", type=float, default=2.5)
    # A batch of three: its results go in one complete_many, whose lost answers the campaign
    # judges as it judges a complete's.
    p.add_argument("--qty", type=int, default=3)
    p.add_argument("--work", type=float, default=0.08)
    p.add_argument("--poll", type=float, default=1.0)
    p.add_argument("--idle-wait", type=float, default=0.3)
    args = p.parse_args()
    die_with_parent()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # drain: finish the task, release
    control = Control(stop)
    log(args.name, f"started ({args.mode}{', invocation' if args.invocation else ''})")
    if args.mode == "advisory":
        run_advisory(args, control, stop)
    else:
        run_pgfence(args, control, stop)
    log(args.name, "exit")


if __name__ == "__main__":
    main()
