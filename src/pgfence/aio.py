"""The reference client over asyncio (``psycopg.AsyncConnection``), for FastAPI-style services.

``Owner``, ``Worker`` and ``Leader`` here are ``pgfence.client``'s, with coroutines where those
block: ``await owner.acquire()``, ``async with owner.fenced(conn)``, ``await worker.run()``, an
``async def handler(payload, context)``, ``await context.extend(seconds)``, and
``asyncio.Event`` for ``stop`` and ``context.cancelled``. The renewer is a task of the running
loop. Both modules drive one set of rules (``pgfence._core``): the same retries, the same
doubt after a lost connection, the same deadlines and extensions.

A handler must not block the loop: a blocking call stops the renewer too, and the lease then
expires within its ttl (run blocking work with ``asyncio.to_thread``). Connections are made
with autocommit and prepared statements only where they reach the server directly
(``pgfence.connection.aconnect``, ``Owner.prepare``), so a
transaction pooler may sit in between.

    owner = Owner(dsn, "mailer", ttl=30)
    if await owner.acquire():
        await Worker(owner, "emails", send).run()     # drains and releases however it ends

``LeaderService`` is a control-plane replica's whole life (elect, lead, step down, elect
again), for a FastAPI lifespan:

    @asynccontextmanager
    async def lifespan(app):
        async with LeaderService(Owner(dsn, "control-plane", owner=url)) as app.state.leader:
            yield
"""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
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
)
from pgfence.connection import AsyncConnection, aconnect
from pgfence.errors import typed

__all__ = ["Context", "Finish", "Handler", "Leader", "LeaderService", "LeaseLost", "Owner",
           "PgmqWorker", "Retry", "Task", "Worker"]


class Context(_core.ContextBase):
    """``pgfence.client.Context`` for coroutines: ``task``, ``deadline``, ``remaining()``,
    ``cancelled`` (an ``asyncio.Event``) and ``await extend(seconds)``."""

    def __init__(self, held: _core.Held, worker: Worker) -> None:
        super().__init__(held, worker.owner)
        self._worker = worker

    @property
    def cancelled(self) -> asyncio.Event:
        """Set when the owner gives the lease up or learns it is lost (the handler ran past its
        deadline, a renewal was refused). The worker never cancels a handler itself."""
        event = self._worker.owner.cancelled
        assert isinstance(event, asyncio.Event)
        return event

    async def extend(self, seconds: float) -> datetime | None:
        """Keeps the task ``seconds`` more from now, and moves the handler's deadline to then;
        None when this attempt no longer holds the task."""
        return await self._worker._drive(self._worker._extend_for_handler(self._held, seconds))


Handler = Callable[[Any, Context], Awaitable[Any]]
"""``async def handler(payload, context)``: returns the task's result, raises to fail it."""


async def drive(performer: Callable[[Op], Awaitable[Any]], steps: Steps[T]) -> T:
    """``pgfence.client.drive`` with awaited operations."""
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
            answer = await performer(op)
        except BaseException as e:
            error = e


class _Links:
    """The async connections of one owner or worker, opened on first use, dropped when lost;
    one task at a time on each (a service's readiness probes come from the server's requests)."""

    def __init__(self, dsn: str, name: str, prepare: bool | None) -> None:
        self.dsn, self.name, self.prepare = dsn, name, prepare
        self._conns: dict[Link, AsyncConnection] = {}
        self._locks = {link: asyncio.Lock() for link in Link}

    async def execute(self, op: Call | Together) -> Any:
        """A Call's rows, or a Together's list of them (``pgfence.client``'s, awaited)."""
        async with self._locks[op.link]:
            conn = self._conns.get(op.link)
            if conn is None or conn.closed:
                conn = self._conns[op.link] = await aconnect(
                    self.dsn, self.name + op.link.value, prepare=self.prepare)
            try:
                if isinstance(op, Call):
                    cursor = await conn.execute(op.query, op.params)
                    return await cursor.fetchall()
                async with conn.pipeline() if psycopg.AsyncPipeline.is_supported() else \
                        conn.transaction():
                    cursors = [await conn.execute(c.query, c.params) for c in op.calls]
                return [await c.fetchall() for c in cursors]
            except psycopg.Error as e:
                if conn.broken or conn.closed or _core.classify(e) is _core.Failure.CONNECTION:
                    await conn.close()
                    del self._conns[op.link]
                raise

    async def close(self, *links: Link) -> None:
        for link in links:
            conn = self._conns.pop(link, None)
            if conn is not None:
                await conn.close()


async def _sleep(op: Sleep) -> None:
    if op.wake is None:
        await asyncio.sleep(op.seconds)
        return
    assert isinstance(op.wake, asyncio.Event)
    with suppress(TimeoutError):
        await asyncio.wait_for(op.wake.wait(), op.seconds)
    if op.clear:
        op.wake.clear()


@dataclass
class Owner(_core.LeaseCore):
    """``pgfence.client.Owner`` over asyncio: its renewer is a task of the running loop."""

    _links: _Links = field(init=False, repr=False)
    _renewer: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._links = _Links(self.dsn, self.owner, self.prepare)

    def _event(self) -> asyncio.Event:
        return asyncio.Event()

    async def _perform(self, op: Op) -> Any:
        if isinstance(op, Call):
            return await self._links.execute(op)
        if isinstance(op, Sleep):
            return await _sleep(op)
        if isinstance(op, StartRenewer):
            self._renewer = asyncio.create_task(self._renew_in_background(),
                                                name=f"renew-{self.resource}")
            return None
        if isinstance(op, StopRenewer):
            if self._renewer is not None and self._renewer is not asyncio.current_task():
                await self._renewer
            return None
        raise TypeError(f"an Owner does not perform {op!r}")

    async def _renew_in_background(self) -> None:
        try:
            await drive(self._perform, self._renew_loop())
        finally:
            await self._links.close(Link.RENEW)

    async def _drive(self, steps: Steps[T]) -> T:
        return await drive(self._perform, steps)

    async def acquire(self, invocation_id: uuid.UUID | None = None) -> bool:
        """``pgfence.client.Owner.acquire``; the renewer is a task of the running loop."""
        return await self._drive(self._acquire(invocation_id))

    async def renew(self) -> str:
        """One renewal now; the lease's state. PF001 marks the lease lost, and is raised."""
        return await self._drive(self._renew(Link.OWNER))

    async def trust(self) -> bool:
        """Whether the lease may be worked under, renewing first after a lost connection."""
        return await self._drive(self._trust(Link.OWNER))

    @asynccontextmanager
    async def fenced(self, conn: psycopg.AsyncConnection[Any]
                     ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A transaction on ``conn`` that is the owner's only if fence() passes in it (I2)."""
        if not await self.trust():
            self.check()
        try:
            async with conn.transaction():
                await conn.execute(FENCE, (self.lease_id,))
                yield conn
        except psycopg.Error as e:
            lost = self._refused(e, "fence")
            if lost is not None:
                raise lost from e
            raise

    async def drain(self) -> None:
        """Stops claiming; the resource is free for a successor at once."""
        await self._drive(self._drain())

    async def release(self) -> None:
        """Stops the renewer, then ends the lease (a lease already ended is no error)."""
        try:
            await self._drive(self._release())
        finally:
            await self._links.close(Link.OWNER)


@dataclass
class Worker(_core.WorkerCore):
    """``pgfence.client.Worker`` over asyncio, with ``async def handler(payload, context)``."""

    owner: Owner
    handler: Handler
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _links: _Links = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._links = _Links(self.owner.dsn, self.owner.owner, self.owner.prepare)

    def install_sigterm(self) -> None:
        """SIGTERM drains (on the running loop): stop claiming, finish what is held, release."""
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.stop.set)

    async def run(self, max_tasks: int | None = None, until_idle: bool = False) -> None:
        """The loop; drains and releases the lease when it ends, however it ends."""
        try:
            await self._drive(self._run(max_tasks, until_idle))
        finally:
            await self._links.close(Link.WORK)

    async def _drive(self, steps: Steps[T]) -> T:
        return await drive(self._perform, steps)

    async def _perform(self, op: Op) -> Any:
        if isinstance(op, Call | Together) and op.link is Link.WORK:
            return await self._links.execute(op)
        if isinstance(op, Sleep):
            return await _sleep(op)
        if isinstance(op, Handle):
            return await self.handler(op.held.task.payload, Context(op.held, self))
        return await self.owner._perform(op)


@dataclass
class PgmqWorker(Worker, _core.PgmqRules):
    """A ``Worker`` of a pgmq queue, through the pgmq layer (schema ``pgfence_pgmq``; see
    ``pgfence._core.PgmqRules`` and docs/pgmq.md): ``context.task`` is the message, with its
    ``msg_id`` as ``task_id`` and its ``read_ct`` as ``attempt``; a handler's return archives
    the message (``finish="delete"`` deletes it), an exception leaves it to be read again."""

@dataclass
class Leader:
    """``pgfence.client.Leader`` over asyncio."""

    owner: Owner
    poll_interval: float = 1.0
    polls: int = 0

    async def wait_for_leadership(self, stop: asyncio.Event) -> bool:
        """Polls ``acquire`` until this replica owns the resource (True) or ``stop`` is set."""
        def polled() -> None:
            self.polls += 1
        return await self.owner._drive(_core.lead(self.owner, stop, self.poll_interval, polled))


Callback = Callable[[Any], Awaitable[None] | None]


@dataclass
class LeaderService(_core.LeaderCore):
    """``pgfence.client.LeaderService`` over asyncio: ``run()`` is a coroutine, the callbacks
    may be coroutine functions, and ``async with service:`` runs it as a task of the loop for
    as long as the block lasts (a FastAPI lifespan), stepping down on the way out."""

    owner: Owner
    on_elected: Callback | None = None
    on_stepped_down: Callback | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    async def run(self) -> None:
        """Serves until ``stop_now()``; a leader releases on the way out."""
        await drive(self._perform, self._serve())

    async def readiness(self) -> tuple[int, dict[str, Any]]:
        """``/ready``: the HTTP status (200 or 503) and a JSON body with the reason."""
        return await drive(self._perform, self._readiness())

    async def current_leader(self) -> dict[str, Any] | None:
        """The current leader as ``pgfence.resource_status`` shows it, or None."""
        return await drive(self._perform, self._current_leader())

    async def __aenter__(self) -> LeaderService:
        self._task = asyncio.create_task(self.run(), name=f"lead-{self.owner.resource}")
        return self

    async def __aexit__(self, *exc: type[BaseException] | BaseException | TracebackType | None
                        ) -> None:
        self.stop_now()
        if self._task is not None:
            await self._task

    async def _perform(self, op: Op) -> Any:
        if isinstance(op, Notify):
            callback = self.on_elected if op.event == "elected" else self.on_stepped_down
            if callback is not None:
                answer = callback((self.owner.generation or 0) if op.event == "elected"
                                  else op.detail)
                if answer is not None:
                    await answer
            return None
        return await self.owner._perform(op)
