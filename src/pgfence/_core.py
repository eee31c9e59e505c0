"""The client's rules, written once for both drivers: pgfence.client (threads) and pgfence.aio
(asyncio).

Sans-I/O, as psycopg's own generators are: every operation of an owner or a worker is a
generator that yields what it needs done, and gets the answer sent back or the error thrown in:

    Call(link, step, query, params)   one statement on one of the owner's connections -> rows
    Together(calls)                   statements on one connection sent at once and committed
                                      together (one round trip, one commit) -> their rows
    Sleep(seconds, wake)              a pause that ``wake`` (the driver's event) may end early
    Handle(held)                      the user's handler for one task -> its result
    StartRenewer(), StopRenewer()     the background renewal, started after acquire, stopped
                                      (and waited for) before release
    Notify(event, detail)             a control-plane replica was elected or stepped down:
                                      the application's callback

A driver only performs these. Every decision — what is retried and for how long, when the
lease is doubted and how it is trusted again, when a task is extended or skipped, what a
verdict means — is made here, so the two drivers cannot drift apart.

The retry rules (docs/python.md, "Faults"):

- A lost connection is reconnected, with capped, fully jittered exponential backoff
  (``Retry``). 40P01 and 40001 (the statement was rolled back) are sent again the same way,
  and so is 55P03: a row another session held past the bound of pgfence's wait (a layer's
  result waits for its run or its message at most 5 s; the holder's own idle time is bounded
  too, so a later try gets through). Any other error is not guessed at: it is raised.
- After any lost connection the lease is doubted: not trusted (``valid`` is false) until a
  renewal *sent after* the loss succeeds. PF001 from it means the lease is lost: claim nothing
  more, start no other handler, leave.
- A ``complete`` or ``fail`` whose answer was lost is sent again with the same attempt id:
  ``accepted`` or ``duplicate`` both mean the result is recorded, once; ``stale`` means a
  newer attempt holds the task. A ``claim`` whose answer was lost is never sent again: its
  tasks come back when their visibility runs out and are claimed again by a new attempt.
- A claim holds its batch for the batch: ``qty`` handlers' time (``WorkerCore.hold``), so
  that with handlers within their deadlines no task is extended before its handler.
- No handler starts after its task's visibility ran out: before each handler, if the task's
  visibility does not last until the handler's deadline, it is extended first (NULL: the
  attempt is stale, and its handler is skipped). That happens only when handlers ran long
  (one that extended itself, or no deadline at all).
- A batch's results go in one statement (``complete_many``; the pgmq layer's
  ``archive_many``) when its handlers are done, or before the next handler starts once
  ``report_within`` has passed since the first result in hand began (slow handlers: a result
  each); a failure is sent on its own (``fail``), as soon as its handler raised.
  The rule of a lost answer is the same for a batch: sent again with the same attempt ids,
  each id's verdict taken.
- A batch's results ride with the next claim (``Together``: one round trip, one commit, where
  sending them alone and then claiming took two of each). If that transaction fails, nothing
  of it was applied, or (a lost answer) all of it may have been: the results are sent again by
  themselves, by the rules above; the claim is sent again only when it was rolled back, never
  after a lost answer. A run that ends, or a lease in doubt, sends its results alone first.
- Capabilities (lease ids, attempt ids) never appear in a log line or an exception message of
  the client: a lease is named by its resource and generation.
"""

from __future__ import annotations

import enum
import logging
import math
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Literal, Protocol, TypeVar

import psycopg
from psycopg.types.json import Jsonb

from pgfence.sql import label_ok

T = TypeVar("T")
Row = tuple[Any, ...]
log = logging.getLogger("pgfence")
log.addHandler(logging.NullHandler())    # a library's: the application decides what is shown

ACQUIRE = ("select lease_id, generation "
           "from pgfence.acquire(%s, %s, make_interval(secs => %s), %s)")
RENEW = "select state from pgfence.renew(%s, make_interval(secs => %s))"
DRAIN = "select pgfence.drain(%s)"
RELEASE = "select pgfence.release(%s)"
FENCE = "select pgfence.fence(%s)"
CLAIM = ("select task_id, attempt_id, attempt, payload "
         "from pgfence.claim(%s, %s, %s, make_interval(secs => %s))")
EXTEND = "select pgfence.extend(%s, make_interval(secs => %s))"
REPORT = {"complete": "select pgfence.complete(%s, %s)", "fail": "select pgfence.fail(%s, %s)"}
COMPLETE_MANY = "select outcome from pgfence.complete_many(%s, %s)"
REQUEUE = "select pgfence.requeue_expired()"
# The pgmq layer's (docs/pgmq.md): the same rules over a pgmq queue. A message's msg_id is its
# task id (every read of it shares it), its read_ct the attempt number.
PGMQ_READ = ("select msg_id, attempt_id, read_ct, message "
             "from pgfence_pgmq.read(%s, %s, qty => %s, vt => make_interval(secs => %s))")
PGMQ_SET_VT = "select pgfence_pgmq.set_vt(%s, make_interval(secs => %s))"
PGMQ_FINISH = {"archive": "select pgfence_pgmq.archive(%s)",
               "delete": "select pgfence_pgmq.delete(%s)"}
PGMQ_FINISH_MANY = {"archive": "select outcome from pgfence_pgmq.archive_many(%s)",
                    "delete": "select outcome from pgfence_pgmq.delete_many(%s)"}

Kind = Literal["complete", "fail"]
Finish = Literal["archive", "delete"]     # what a pgmq handler's return does to its message
Verdict = Literal["accepted", "duplicate", "stale"]
RECORDED = ("accepted", "duplicate")    # the result is in the database, exactly once

DAY = 86400.0   # seconds: the longest ttl or visibility pgfence takes (checks.sql)


class LeaseLost(Exception):
    """Ownership is lost or in doubt: stop claiming and writing at once."""


# -- the operations a driver performs ---------------------------------------------------------

class Link(enum.Enum):
    """One of the owner's connections; its application_name is the owner's name and this
    suffix (how a test or an operator finds its backend)."""

    OWNER = ""            # acquire, drain, release; the renewals that confirm a fenced write
    RENEW = "-renew"      # the background renewer
    WORK = "-work"        # claim, extend, complete, fail, requeue_expired; confirmations
    READY = "-ready"      # a control-plane replica's readiness probes and leader look-ups


class Event(Protocol):
    """threading.Event or asyncio.Event: what the core sets and reads."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...
    def clear(self) -> None: ...


@dataclass(frozen=True)
class Call:
    link: Link
    step: str             # acquire, renew, claim, extend, complete, fail, requeue, drain, ...
    query: str
    params: tuple[Any, ...]


@dataclass(frozen=True)
class Together:
    calls: tuple[Call, ...]   # on one link; an error rolls back all of them

    @property
    def link(self) -> Link:
        return self.calls[0].link


@dataclass(frozen=True)
class Sleep:
    seconds: float
    wake: Event | None = None     # ends the pause early when set
    clear: bool = False           # and is cleared after (the renewer's wake-up)


@dataclass(frozen=True)
class Handle:
    held: Held


@dataclass(frozen=True)
class StartRenewer:
    pass


@dataclass(frozen=True)
class StopRenewer:
    pass


@dataclass(frozen=True)
class Notify:
    event: Literal["elected", "stepped_down"]
    detail: str           # the lease (resource and generation), or why it stepped down


Op = Call | Together | Sleep | Handle | StartRenewer | StopRenewer | Notify
Steps = Generator[Op, Any, T]


# -- failures and the retry policy ------------------------------------------------------------

class Failure(enum.Enum):
    CONNECTION = "connection lost"    # reconnect; doubt the lease
    ROLLED_BACK = "rolled back"       # 40P01, 40001, 55P03: the statement did nothing; again
    REFUSED = "refused"               # PF001: the lease is not current
    OTHER = "error"                   # not guessed at: raised


_CONNECTION_STATES = ("57P01", "57P02", "57P03")   # admin / crash shutdown, cannot connect now


def classify(e: BaseException) -> Failure:
    if not isinstance(e, psycopg.Error):
        return Failure.OTHER
    state = e.sqlstate
    if state in ("40P01", "40001", "55P03"):
        return Failure.ROLLED_BACK
    if state == "PF001":
        return Failure.REFUSED
    if isinstance(e, psycopg.OperationalError | psycopg.InterfaceError) and (
            state is None or state.startswith("08") or state in _CONNECTION_STATES):
        return Failure.CONNECTION
    return Failure.OTHER


@dataclass(frozen=True)
class Retry:
    """How a failed call is sent again: after a pause drawn uniformly from
    ``[0, min(cap, base * 2**n)]`` before the n-th retry (full jitter, so that workers that lost
    one database do not come back in step), for at most ``give_up`` seconds per call. Calls made
    for the lease stop sooner, when the lease is lost."""

    base: float = 0.1
    cap: float = 10.0
    give_up: float = 60.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def bound(self, n: int) -> float:
        return min(self.cap, self.base * 2.0 ** min(n, 64))

    def delay(self, n: int) -> float:
        return self.rng.uniform(0.0, self.bound(n))


class Backoff:
    """The pauses of one call's retries; None once ``give_up`` has passed (real time)."""

    def __init__(self, retry: Retry) -> None:
        self.retry = retry
        self.n = 0
        self.until = time.monotonic() + retry.give_up

    def next(self) -> float | None:
        if time.monotonic() >= self.until:
            return None
        delay = self.retry.delay(self.n)
        self.n += 1
        return delay


_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


def redact(text: str) -> str:
    """A database message without the ids in it (lease and attempt ids are capabilities)."""
    return _ID.sub("…", text)


def reason(e: psycopg.Error) -> str:
    """A database error's message, for a log line: without the ids in it."""
    return redact(e.diag.message_primary or str(e))


# -- the lease --------------------------------------------------------------------------------

@dataclass
class LeaseCore:
    """The rules of one owner's hold on one resource; pgfence.client.Owner and
    pgfence.aio.Owner drive them."""

    dsn: str = field(repr=False)              # may hold a password
    resource: str
    owner: str = field(default_factory=lambda: f"owner-{uuid.uuid4().hex[:8]}")
    ttl: float = 30.0
    renew_every: float | None = None          # default ttl / 3, in real time
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    retry: Retry = field(default_factory=Retry, repr=False)
    # Prepared statements on the owner's and its workers' connections: None where the
    # connection reaches the server directly (pgfence.connection.direct), True also through
    # a pooler that keeps them itself, False never.
    prepare: bool | None = None
    lease_id: uuid.UUID | None = field(default=None, init=False, repr=False)   # a capability
    generation: int | None = field(default=None, init=False)
    lost: str | None = field(default=None, init=False)
    state: str | None = field(default=None, init=False)   # the last renewal's: active, draining
    _valid_until: float = field(default=0.0, init=False, repr=False)
    # Doubt: every lost connection counts one; a renewal sent after the n-th confirms up to n.
    # (From several threads, hence the lock; never held across a yield.)
    _doubts: int = field(default=0, init=False, repr=False)
    _doubt_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _confirmed: int = field(default=0, init=False, repr=False)
    _progress: tuple[float, str] | None = field(default=None, init=False, repr=False)
    _stopping: bool = field(default=True, init=False, repr=False)
    _wake: Event = field(init=False, repr=False)           # the renewer: stop, or a deadline
    # When the renewer wakes by itself, on `clock`; infinity while it is not asleep (then any
    # deadline wakes it: it may have read the progress before it was set).
    _wakes_at: float = field(default=math.inf, init=False, repr=False)
    _lost_signal: Event = field(init=False, repr=False)    # set when the lease is given up

    def __post_init__(self) -> None:
        # The database refuses such a label (22023) at the first acquire; refused here, it
        # never starts a renewer or a retry loop.
        if not label_ok(self.owner):
            raise ValueError(f"owner label {self.owner!r}: 1 to 256 characters, at least one "
                             "visible, none a control, format or separator character")
        self._wake = self._event()
        self._lost_signal = self._event()

    def _event(self) -> Event:
        raise NotImplementedError

    # -- what the owner knows ----------------------------------------------------------------
    @property
    def valid(self) -> bool:
        """Whether this owner may claim and start work: it holds a lease, nothing refused it or
        gave it up, its local deadline (the last renewal's send plus the ttl) is ahead, and a
        renewal has succeeded since the last lost connection."""
        return self.lease_id is not None and self.lost is None and self.confirmed and \
            self.clock() < self._valid_until

    @property
    def confirmed(self) -> bool:
        return self._confirmed >= self._doubts

    @property
    def deadline(self) -> float:
        """The local deadline on ``clock``: past it, this owner trusts its lease no longer."""
        return self._valid_until

    @property
    def cancelled(self) -> Event:
        """Set when this term's lease is given up or found lost (a new one with each acquire)."""
        return self._lost_signal

    def describe(self) -> str:
        """The lease as logs and messages name it: never by its id."""
        if self.generation is None:
            return f"{self.resource} (no lease)"
        return f"{self.resource} generation {self.generation}"

    def check(self) -> None:
        """Raises LeaseLost unless ``valid``."""
        if not self.valid:
            raise LeaseLost(self.lost or self._why_not())

    def _why_not(self) -> str:
        if self.lease_id is None:
            return f"no lease on {self.resource}"
        if self.clock() >= self._valid_until:
            return f"{self.describe()}: expired locally"
        return f"{self.describe()}: not renewed since a lost connection"

    def mark_lost(self, why: str) -> None:
        """Stops trusting the lease (the first reason is kept) and sets ``cancelled``."""
        if self.lost is None:
            self.lost = why
            log.info("%s", why)
        self._lost_signal.set()

    def doubt(self) -> None:
        """A connection was lost: trust the lease again only after a renewal sent from now on."""
        with self._doubt_lock:
            self._doubts += 1

    def renew_until(self, deadline: float | None, why: str = "a progress deadline") -> None:
        """Ties renewal to progress: the renewer renews only until ``deadline`` (on ``clock``);
        None lifts the limit. If the deadline passes first, the renewer stops for good, drains
        the lease so that a successor is admitted at once, and marks it lost (``why``):
        whoever set the deadline is not making progress, and must not keep the resource by
        proxy. Nothing is killed: the late holder runs on, its fences are refused, and what it
        reports is judged by the database (I5)."""
        self._progress = None if deadline is None else (deadline, why)
        # Woken only when it would otherwise sleep past the deadline (a handler's deadline is
        # set and lifted around every handler: two wake-ups a task that cost a thread switch or
        # a task of the loop each). A lifted one needs none: woken at it, the renewer finds it
        # gone. A clock moved past the renewer's wake-up (a test's) wakes it too.
        wakes_at = self._wakes_at
        if deadline is not None and (deadline < wakes_at or self.clock() >= wakes_at):
            self._wake.set()

    def _refused(self, e: psycopg.Error, what: str) -> LeaseLost | None:
        """A fence refused (PF001, PF007) marks the lease lost; the error to raise instead."""
        if e.sqlstate in ("PF001", "PF007"):
            why = f"{self.describe()}: {what} refused ({reason(e)})"
            self.mark_lost(why)
            return LeaseLost(why)
        if classify(e) is Failure.CONNECTION:
            self.doubt()
        return None

    def _locally_current(self) -> bool:
        return self.lost is None and self.clock() < self._valid_until

    # -- calls -------------------------------------------------------------------------------
    def _call(self, link: Link, step: str, query: str, params: tuple[Any, ...], *,
              reconnect: bool = True, keep_going: Callable[[], bool] = lambda: True,
              wake: Event | None = None) -> Steps[list[Row]]:
        """One statement, sent again after a lost connection (unless ``reconnect`` is false)
        or a rollback (40P01, 40001), with backoff, while ``keep_going()`` and the retry
        policy allow. Every lost connection doubts the lease."""
        backoff = Backoff(self.retry)
        while True:
            try:
                rows: list[Row] = yield Call(link, step, query, params)
                return rows
            except psycopg.Error as e:
                failure = classify(e)
                if failure is Failure.CONNECTION:
                    self.doubt()
                    if not reconnect:
                        raise
                elif failure is not Failure.ROLLED_BACK:
                    raise
                delay = backoff.next()
                if delay is None or not keep_going():
                    raise
                log.warning("%s: %s: %s; sent again in %.2f s", self.describe(), step,
                            failure.value, delay)
                error = e
            yield Sleep(delay, wake)
            if not keep_going():
                raise error

    def _acquire(self, invocation_id: uuid.UUID | None,
                 keep_going: Callable[[], bool] = lambda: True,
                 wake: Event | None = None) -> Steps[bool]:
        if not self._stopping:
            raise RuntimeError(f"{self.describe()}: this Owner holds a lease; release it first")
        sent = self.clock()
        # Sent again after a lost connection: if the lost one had been granted, the retry
        # answers NULL (that lease is current), and this owner stays a standby until it
        # expires unrenewed. The database never grants two (I1).
        rows = yield from self._call(
            Link.OWNER, "acquire", ACQUIRE, (self.resource, self.owner, self.ttl, invocation_id),
            keep_going=keep_going, wake=wake)
        if not rows or rows[0][0] is None:
            return False
        self.lease_id, self.generation = rows[0][0], int(rows[0][1])
        self.lost, self._progress, self.state = None, None, "active"
        self._valid_until = sent + self.ttl
        self._doubts = self._confirmed = 0
        self._lost_signal = self._event()
        self._stopping = False
        self._wake.clear()
        yield StartRenewer()
        return True

    def _renewed(self, sent: float, seq: int) -> None:
        """A renewal sent at ``sent`` (on ``clock``) succeeded. Counted from the send, a slow
        answer cannot stretch the lease: the database started the new term no earlier than
        the request left. It confirms the lease for every lost connection before the send."""
        with self._doubt_lock:
            self._valid_until = max(self._valid_until, sent + self.ttl)
            self._confirmed = max(self._confirmed, seq)

    def _renew(self, link: Link) -> Steps[str]:
        """One renewal, not sent again here; PF001 marks the lease lost."""
        sent, seq = self.clock(), self._doubts
        try:
            rows: list[Row] = yield Call(link, "renew", RENEW, (self.lease_id, self.ttl))
        except psycopg.Error as e:
            failure = classify(e)
            if failure is Failure.REFUSED:
                self.mark_lost(f"{self.describe()}: renewal refused ({reason(e)})")
            elif failure is Failure.CONNECTION:
                self.doubt()
            raise
        self._renewed(sent, seq)
        self.state = str(rows[0][0]) if rows else "active"
        return self.state

    def _trust(self, link: Link, stop: Event | None = None) -> Steps[bool]:
        """True once the lease may be worked under: if a connection was lost since the last
        renewal, a new renewal must succeed first. False when the lease is lost, expired
        locally, or ``stop`` is set."""
        backoff = Backoff(self.retry)
        while self._locally_current() and not (stop is not None and stop.is_set()):
            if self.confirmed:
                return True
            try:
                yield from self._renew(link)
            except psycopg.Error as e:
                if self.lost is not None:
                    break
                if classify(e) is Failure.OTHER:
                    raise
                delay = backoff.next()
                if delay is None:
                    raise
                yield Sleep(delay, stop)
        return False

    def _renew_loop(self) -> Steps[None]:
        every = self.renew_every or self.ttl / 3
        backoff = Backoff(self.retry)
        # The renewal cadence is real time; a progress deadline is judged on `clock`.
        next_renewal = time.monotonic() + every
        while not self._stopping:
            progress = self._progress
            wait = next_renewal - time.monotonic()
            if progress is not None:
                wait = min(wait, progress[0] - self.clock())
            if wait > 0:
                self._wakes_at = self.clock() + wait
                if self._progress is progress:   # else set meanwhile: read it again
                    yield Sleep(wait, self._wake, clear=True)   # then read the state again
                self._wakes_at = math.inf
                continue
            if progress is not None and self.clock() >= progress[0]:
                # Checked before every renewal: none is sent for a holder past its deadline.
                yield from self._abandon(progress[1])
                return
            try:
                yield from self._renew(Link.RENEW)
            except psycopg.Error as e:
                if self.lost is not None:
                    return                   # refused (PF001)
                # Transient or not, it only costs time: the local deadline decides. Tried
                # again soon, not a whole period later.
                delay = backoff.next()
                if delay is None:
                    backoff = Backoff(self.retry)
                    delay = self.retry.delay(0)
                log.warning("%s: renewal failed (%s); again in %.2f s", self.describe(),
                            classify(e).value, delay)
                next_renewal = time.monotonic() + min(delay, every)
                continue
            backoff = Backoff(self.retry)
            next_renewal = time.monotonic() + every

    def _abandon(self, why: str) -> Steps[None]:
        """Past a progress deadline: stop trusting the lease, and drain it (not release: the
        holder may still hold tasks, and monitoring should show a draining lease, not an
        ended one). If the drain fails, the unrenewed lease expires within its ttl anyway."""
        why = f"{self.describe()}: renewal stopped: {why}"
        if self.lost is None:
            self.lost = why           # trusted no more, at once; the handler is told after
            log.info("%s", why)       # the drain, when its successor may already be admitted
        try:
            yield Call(Link.RENEW, "drain", DRAIN, (self.lease_id,))
        except psycopg.Error as e:
            log.warning("%s: drain failed (%s)", self.describe(), classify(e).value)
        finally:
            self.mark_lost(why)

    def _drain(self) -> Steps[None]:
        """Stops claiming; the resource is free for a successor at once."""
        if self.lease_id is None or self.lost is not None:
            return
        try:
            # Sent again while the lease could still be current: after that it has expired.
            yield from self._call(Link.OWNER, "drain", DRAIN, (self.lease_id,),
                                  keep_going=lambda: self.clock() < self._valid_until)
        except psycopg.Error as e:
            if e.sqlstate != "PF001":
                raise

    def _release(self) -> Steps[None]:
        """Stops the renewer, then ends the lease (one already ended is no error)."""
        self._stopping = True
        self._wake.set()
        yield StopRenewer()
        try:
            if self.lease_id is not None:
                yield from self._call(Link.OWNER, "release", RELEASE, (self.lease_id,),
                                      keep_going=lambda: self.clock() < self._valid_until)
        except psycopg.Error as e:
            if e.sqlstate != "PF001":
                raise
        finally:
            if self.lost is None:
                log.info("%s: released", self.describe())
            self.lost = self.lost or "released"
            self._lost_signal.set()


# -- the worker -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """One claimed task. ``attempt_id`` is what its result is reported with (a capability:
    kept out of repr); key external effects by ``task_id``, which every attempt shares."""

    task_id: int
    attempt_id: uuid.UUID = field(repr=False)
    attempt: int
    payload: Any


@dataclass
class Held:
    """A task in hand, and what the worker knows of its visibility, on the owner's clock."""

    task: Task
    visible_from: float       # the send of the claim or extend that set its visibility
    visible_until: float      # visible_from + the visibility granted: no later than the database's
    fresh: bool               # that visibility was granted for this handler, and none ran since
    deadline: float | None = None


class ContextBase:
    """What a handler gets beside its payload (the same in both drivers)."""

    def __init__(self, held: Held, owner: LeaseCore) -> None:
        self._held = held
        self._owner = owner

    @property
    def task(self) -> Task:
        return self._held.task

    @property
    def deadline(self) -> float | None:
        """When the handler is due, on the owner's clock (``Owner.clock``), or None
        (``handler_timeout=math.inf``). Past it, the lease is drained and ``cancelled`` set."""
        return self._held.deadline

    def remaining(self) -> float | None:
        """Seconds until ``deadline`` (negative once past), or None."""
        deadline = self._held.deadline
        return None if deadline is None else deadline - self._owner.clock()


Start = Literal["start", "skip", "stop"]


@dataclass
class WorkerCore:
    """The rules of a worker's loop; pgfence.client.Worker and pgfence.aio.Worker drive them."""

    owner: LeaseCore
    queue: str
    handler: Any
    qty: int = 1
    visibility: float = 30.0
    idle_wait: float = 1.0
    handler_timeout: float | None = None     # default: visibility; math.inf: no deadline
    report_within: float = 1.0               # results in hand go before the next handler
                                             # once this passed since the first one began
    handled: int = field(default=0, init=False)
    skipped: int = field(default=0, init=False)    # stale before their handler started
    verdicts: Counter[str] = field(default_factory=Counter, init=False)
    stop: Event = field(init=False, repr=False)    # each driver's own kind, set to drain
    # What is worked: the package's own queue (pgfence.claim); PgmqRules names a pgmq queue's.
    claim_sql: ClassVar[str] = CLAIM
    extend_sql: ClassVar[str] = EXTEND
    requeues: ClassVar[bool] = True         # requeue_expired when the queue is empty
    _pending: list[tuple[Held, float, Any]] = field(default_factory=list, init=False,
                                                    repr=False)   # results not sent yet

    @property
    def budget(self) -> float:
        """The time a handler is given: ``handler_timeout``, or the visibility without one."""
        t = self.handler_timeout
        return self.visibility if t is None or math.isinf(t) else t

    @property
    def hold(self) -> float:
        """The visibility a claim asks for: its batch's handlers in a row, each within its
        deadline, so that none needs an extend before it starts; at most a day, the longest
        interval pgfence takes (a longer batch extends its later tasks as they start)."""
        return min(self.qty * self.budget, DAY)

    def _run(self, max_tasks: int | None, until_idle: bool) -> Steps[None]:
        try:
            while not self.stop.is_set() and (max_tasks is None or self.handled < max_tasks):
                if self._pending and not self.owner.confirmed:
                    yield from self._send_results()   # not held back while the lease is doubted
                if not (yield from self.owner._trust(Link.WORK, self.stop)):
                    break                    # ownership lost or in doubt: claim nothing more
                batch = yield from self._claim()     # with the last batch's results
                if batch is None:
                    continue                 # the connection was lost: trust, then claim anew
                if not batch:
                    requeued = yield from self._requeue()
                    if requeued == 0:
                        if until_idle:
                            break
                        yield Sleep(self.idle_wait, self.stop)
                    continue
                for held in batch:
                    # Quick handlers' results wait for their batch's; once a result's
                    # handler began report_within ago, what is in hand goes first.
                    if self._pending and \
                            self.owner.clock() - self._pending[0][1] >= self.report_within:
                        yield from self._send_results()
                    start = yield from self._ready(held)
                    if start == "stop":
                        break                # the rest returns when its visibility runs out
                    if start == "start":
                        yield from self._handle(held)
        finally:
            # Results in hand are sent whatever ended the run (a lost lease too: a result is
            # judged by its attempt, I5), before the lease is given up.
            try:
                yield from self._send_results()
            finally:
                yield from self._leave()

    def _claim(self) -> Steps[list[Held] | None]:
        """The next batch; the results in hand go in the same transaction. None when the
        claim's answer was lost or the lease was refused."""
        owner = self.owner
        claim = (owner.lease_id, self.queue, self.qty, self.hold)
        pending, self._pending = self._pending, []
        sent = owner.clock()
        if pending:
            try:
                done, rows = yield Together((self._results_call(pending),
                                             Call(Link.WORK, "claim", self.claim_sql, claim)))
            except psycopg.Error as e:
                # Rolled back, or its answer lost: the results go again by themselves (a
                # lost answer's are answered duplicate); a claim that may have run is not
                # sent again, its tasks come back when their visibility runs out.
                lost = classify(e) is Failure.CONNECTION
                if lost:
                    owner.doubt()
                self._pending = pending
                yield from self._send_results()
                if lost:
                    return None
                sent = owner.clock()
            else:
                self._take_verdicts(pending, done)
                return self._held(rows, sent)
        try:
            rows = yield from owner._call(
                Link.WORK, "claim", self.claim_sql, claim,
                reconnect=False, keep_going=owner._locally_current, wake=self.stop)
        except psycopg.Error as e:
            failure = classify(e)
            if failure is Failure.REFUSED:
                owner.mark_lost(f"{owner.describe()}: claim refused ({reason(e)})")
                return None
            if failure is Failure.CONNECTION:
                # Never sent again: if it was carried out, its tasks come back when their
                # visibility runs out, and are claimed again by a new attempt.
                return None
            raise
        return self._held(rows, sent)

    def _held(self, rows: list[Row], sent: float) -> list[Held]:
        return [Held(Task(int(r[0]), r[1], int(r[2]), r[3]), sent, sent + self.hold,
                     fresh=i == 0) for i, r in enumerate(rows)]

    def _requeue(self) -> Steps[int | None]:
        if not self.requeues:
            return 0
        try:
            rows = yield from self.owner._call(Link.WORK, "requeue", REQUEUE, (), reconnect=False)
        except psycopg.Error as e:
            if classify(e) is Failure.CONNECTION:
                return None
            raise
        return int(rows[0][0])

    def _needs_extension(self, held: Held, now: float) -> bool:
        """Whether the task's visibility ends before the handler's deadline would. A handler's
        time counts from the claim for the first task of a batch, from its start for the
        others; the claim's ``hold`` covers them all while each keeps to its deadline."""
        start = held.visible_from if held.fresh else now
        return held.visible_until < start + self.budget

    def _ready(self, held: Held) -> Steps[Start]:
        """Before a handler starts: the lease trusted (renewed after any lost connection) and
        the task visible until the handler's deadline, extended if need be."""
        owner = self.owner
        while True:
            if self.stop.is_set() or not (yield from owner._trust(Link.WORK, self.stop)):
                return "stop"
            now = owner.clock()
            if not self._needs_extension(held, now):
                break
            doubts = owner._doubts
            if (yield from self._extend(held, self.budget)) is None:
                self.skipped += 1
                log.info("%s: task %s attempt %s is no longer held (visibility ran out); "
                         "skipped", owner.describe(), held.task.task_id, held.task.attempt)
                return "skip"
            if owner._doubts == doubts:
                break                        # else trusted again, then checked again
        held.deadline = self._deadline(held, owner.clock())
        held.fresh = False
        return "start"

    def _deadline(self, held: Held, now: float) -> float | None:
        """The handler's deadline (None without one): its time, and never past its task's
        visibility, whoever else might then claim it."""
        if self.handler_timeout is not None and math.isinf(self.handler_timeout):
            return None
        start = held.visible_from if held.fresh else now
        return min(start + self.budget, held.visible_until)

    def _extend(self, held: Held, seconds: float) -> Steps[datetime | None]:
        sent = self.owner.clock()
        rows = yield from self.owner._call(Link.WORK, "extend", self.extend_sql,
                                           (held.task.attempt_id, seconds))
        until: datetime | None = rows[0][0]
        if until is not None:
            held.visible_from, held.visible_until, held.fresh = sent, sent + seconds, True
        return until

    def _extend_for_handler(self, held: Held, seconds: float) -> Steps[datetime | None]:
        """``Context.extend``: a handler that extends shows progress, so its deadline moves to
        the task's new visibility end (if it has one)."""
        until = yield from self._extend(held, seconds)
        if until is not None and held.deadline is not None:
            held.deadline = held.visible_until
            self.owner.renew_until(held.deadline, self._overrun())
        return until

    def _overrun(self) -> str:
        return f"a handler ran past its deadline ({self.budget:g} s)"

    def _handle(self, held: Held) -> Steps[None]:
        """Runs the handler; its result waits for the batch's (``_send_results``), a failure
        is sent at once."""
        owner = self.owner
        started = owner.clock()
        if held.deadline is not None:
            owner.renew_until(held.deadline, self._overrun())
        try:
            body = yield Handle(held)
        except LeaseLost:
            raise
        except Exception as e:
            self.handled += 1
            yield from self._report(held, "fail", {"error": redact(str(e))})
            return
        finally:
            owner.renew_until(None)
        self.handled += 1
        self._pending.append((held, started, body))

    def _send_results(self) -> Steps[None]:
        """The results in hand, in one statement (one alone as ``complete``), sent again with
        the same attempt ids until the database answers; each id's verdict (I5) is counted in
        ``verdicts``. If no answer comes (the retries gave up, or another error), the error is
        raised and the results are not sent again: their tasks come back when their visibility
        runs out."""
        pending, self._pending = self._pending, []
        if pending:
            call = self._results_call(pending)
            rows = yield from self.owner._call(call.link, call.step, call.query, call.params)
            self._take_verdicts(pending, rows)

    def _results_call(self, pending: list[tuple[Held, float, Any]]) -> Call:
        """The statement of the results in hand: ``complete`` for one, else one for all."""
        if len(pending) == 1:
            held, _, body = pending[0]
            query, params = self._report_statement("complete", held, body)
            return Call(Link.WORK, "complete", query, params)
        step, query, params = self._results_statement([(h, b) for h, _, b in pending])
        return Call(Link.WORK, step, query, params)

    def _take_verdicts(self, pending: list[tuple[Held, float, Any]], rows: list[Row]) -> None:
        for (held, _, _), row in zip(pending, rows, strict=True):
            self._count(held, "complete", str(row[0]))

    def _results_statement(self, results: list[tuple[Held, Any]]
                           ) -> tuple[str, str, tuple[Any, ...]]:
        return "complete_many", COMPLETE_MANY, ([h.task.attempt_id for h, _ in results],
                                                [None if b is None else Jsonb(b)
                                                 for _, b in results])

    def _report_statement(self, kind: Kind, held: Held, body: Any) -> tuple[str, tuple[Any, ...]]:
        return REPORT[kind], (held.task.attempt_id, None if body is None else Jsonb(body))

    def _report(self, held: Held, kind: Kind, body: Any) -> Steps[str]:
        """complete or fail of one task, sent again with the same attempt id until the
        database answers: its verdict (I5) is counted in ``verdicts``."""
        query, params = self._report_statement(kind, held, body)
        rows = yield from self.owner._call(Link.WORK, kind, query, params)
        return self._count(held, kind, str(rows[0][0]))

    def _count(self, held: Held, kind: Kind, verdict: str) -> str:
        self.verdicts[verdict] += 1
        if verdict not in RECORDED:
            log.info("%s: %s of task %s attempt %s: %s", self.owner.describe(), kind,
                     held.task.task_id, held.task.attempt, verdict)
        return verdict

    def _leave(self) -> Steps[None]:
        # Release even when drain fails (the database away, a timeout): release is what stops
        # the renewer, which would otherwise keep the lease alive for a worker that has quit.
        # A database still away after the retries leaves the lease to expire by its ttl.
        try:
            yield from _unless_away(self.owner._drain(), self.owner, "drain")
        finally:
            yield from _unless_away(self.owner._release(), self.owner, "release")


@dataclass
class PgmqRules(WorkerCore):
    """The worker's rules over a pgmq queue, through the pgmq layer (schema ``pgfence_pgmq``):
    read under the lease, ``set_vt`` to extend, ``archive`` (or ``delete``, ``finish``) for a
    handler's return, the same verdicts. pgmq keeps no result and no failure: a handler's
    return value is dropped, and a message whose handler raised is left hidden until its
    visibility runs out, then read again (``read_ct`` counts the reads; ``failed`` counts these).
    pgmq has nothing to requeue: a message comes back by itself."""

    finish: Finish = "archive"
    failed: int = field(default=0, init=False)
    claim_sql: ClassVar[str] = PGMQ_READ
    extend_sql: ClassVar[str] = PGMQ_SET_VT
    requeues: ClassVar[bool] = False

    def _report(self, held: Held, kind: Kind, body: Any) -> Steps[str]:
        if kind == "fail":
            self.failed += 1
            log.info("%s: message %s (read %s) failed: %s; it is read again when its "
                     "visibility runs out", self.owner.describe(), held.task.task_id,
                     held.task.attempt, body["error"] if isinstance(body, dict) else body)
            return "failed"
        return (yield from super()._report(held, kind, body))

    def _report_statement(self, kind: Kind, held: Held, body: Any) -> tuple[str, tuple[Any, ...]]:
        return PGMQ_FINISH[self.finish], (held.task.attempt_id,)

    def _results_statement(self, results: list[tuple[Held, Any]]
                           ) -> tuple[str, str, tuple[Any, ...]]:
        return (f"{self.finish}_many", PGMQ_FINISH_MANY[self.finish],
                ([h.task.attempt_id for h, _ in results],))


def _unless_away(steps: Steps[None], owner: LeaseCore, what: str) -> Steps[None]:
    try:
        yield from steps
    except psycopg.Error as e:
        if classify(e) not in (Failure.CONNECTION, Failure.ROLLED_BACK):
            raise
        log.warning("%s: %s not sent (%s); the lease expires by its ttl", owner.describe(),
                    what, classify(e).value)


# -- the standby ------------------------------------------------------------------------------

def lead(owner: LeaseCore, stop: Event, poll_interval: float,
         polled: Callable[[], None]) -> Steps[bool]:
    """A standby's polls until it owns the resource (True) or ``stop`` is set (False). While
    the database is away it keeps polling."""
    while not stop.is_set():
        polled()
        try:
            if (yield from owner._acquire(None, lambda: not stop.is_set(), stop)):
                return True
        except psycopg.Error as e:
            if classify(e) is not Failure.CONNECTION:
                raise
        yield Sleep(poll_interval, stop)
    return False


# -- the control-plane replica ----------------------------------------------------------------

# What a standby's refusal names: the current leader as monitors see it (no capability).
CURRENT_LEADER = ("select owner, generation, expires_at from pgfence.resource_status "
                  "where resource = %s and not stale")


@dataclass
class LeaderCore:
    """The rules of a control-plane replica (docs/control-plane.md, "The leader's recipe");
    pgfence.client.LeaderService and pgfence.aio.LeaderService drive them.

    Elect: poll ``acquire`` until the lease is granted (a refusal, such as PF003 while an
    operator's update window pauses the resource, is logged and polled again). Lead: while the
    lease is trusted locally (renewed from its send, ``Owner``), nothing refused it, and the
    last renewal did not find it drained. Step down at once when any of that ends: stop
    answering as leader, release, tell the application. Then elect again, for a new generation.
    """

    owner: LeaseCore
    poll_interval: float = 1.0
    leading: bool = field(default=False, init=False)
    why: str = field(default="starting", init=False)      # why it is not leading, if it is not
    polls: int = field(default=0, init=False)
    stop: Event = field(init=False, repr=False)           # each driver's own kind

    def _polled(self) -> None:
        self.polls += 1

    def _serve(self) -> Steps[None]:
        owner = self.owner
        while not self.stop.is_set():
            try:
                elected = yield from lead(owner, self.stop, self.poll_interval, self._polled)
            except psycopg.Error as e:
                self.why = f"acquire refused ({reason(e)})"
                log.warning("%s: %s", owner.describe(), self.why)
                yield Sleep(self.poll_interval, self.stop)
                continue
            if not elected:
                break
            self.leading, why = True, "the elected callback failed"
            try:
                yield Notify("elected", owner.describe())
                why = yield from self._lead()
            finally:                                  # also when a callback raised
                self.leading, self.why = False, why   # nothing is answered as leader from now
                try:
                    yield from owner._release()
                except psycopg.Error as e:            # the lease expires by its ttl, unrenewed
                    log.warning("%s: release failed (%s)", owner.describe(), classify(e).value)
            log.info("%s: stepped down: %s", owner.describe(), why)
            yield Notify("stepped_down", why)

    def _lead(self) -> Steps[str]:
        """Waits while this replica may lead; why it may not any more."""
        owner = self.owner
        every = owner.renew_every or owner.ttl / 3
        while True:
            if self.stop.is_set():
                return "stopping"
            if owner.lost is not None:
                return owner.lost
            if not owner.valid:
                return owner._why_not()
            if owner.state != "active":
                return f"{owner.describe()}: {owner.state} (an operator drained it)"
            # Woken when the lease is found lost (a refused fence or renewal) or given up;
            # else at the local deadline, or a renewal period from now for the state it read.
            left = owner.deadline - owner.clock()
            yield Sleep(left if 0 < left < every else every, owner.cancelled)

    def _ready(self) -> Steps[tuple[bool, str]]:
        """Whether writes should be routed here, and why not: leading, the lease trusted
        locally, and the database's ``fence`` passing for it now, in a transaction of its own
        that changes nothing. A refusal marks the lease lost: the replica steps down."""
        owner = self.owner
        if not self.leading:
            return False, f"standby ({self.why})"
        if not owner.valid:
            return False, f"lease not trusted locally ({owner.lost or owner._why_not()})"
        try:
            yield Call(Link.READY, "ready", FENCE, (owner.lease_id,))
        except psycopg.Error as e:
            lost = owner._refused(e, "readiness check")
            return False, str(lost) if lost is not None else f"database: {classify(e).value}"
        return True, "leader"

    def _readiness(self) -> Steps[tuple[int, dict[str, Any]]]:
        """The HTTP status and body of a readiness answer (``/ready``): 200 on the current
        owner only, 503 with the reason everywhere else."""
        ready, why = yield from self._ready()
        return (200 if ready else 503), {
            "ready": ready, "reason": why, "name": self.owner.owner,
            "generation": self.owner.generation if ready else None}

    def _current_leader(self) -> Steps[dict[str, Any] | None]:
        rows = yield Call(Link.READY, "leader", CURRENT_LEADER, (self.owner.resource,))
        if not rows or rows[0][0] is None:
            return None
        owner, generation, expires_at = rows[0]
        return {"owner": owner, "generation": generation, "expires_at": expires_at.isoformat()}

    @property
    def leads(self) -> bool:
        """Whether to act as leader now: elected, and the lease trusted locally (the database's
        word is ``fence``'s, in every mutating transaction)."""
        return self.leading and self.owner.valid

    def health(self) -> dict[str, Any]:
        """The body of a liveness answer (``/health``): 200 from every replica that is up."""
        leads = self.leads
        return {"name": self.owner.owner, "role": "leader" if leads else "standby",
                "generation": self.owner.generation if leads else None}

    def stop_now(self) -> None:
        """Ends ``run``: a leader steps down (releases: a successor gets in at once)."""
        self.stop.set()
        self.owner.cancelled.set()

