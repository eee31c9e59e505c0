"""A peer's worker or filler for scripts/bench --only workers, run by the bench-only
environment's Python (bench/.peers/venv; bench/peers/setup installs it):

    run.py procrastinate|pgqueuer DSN fill N          queue N no-op jobs with the peer's API
    run.py procrastinate|pgqueuer DSN work QTY INDEX  "ready", then on a line of stdin work
                                                      until the queue is empty, then exit

Each with its documented settings for a worker that takes QTY jobs at a time: pgqueuer's
batch_size, procrastinate's concurrency (it fetches one job per query); both in their drain
mode (procrastinate wait=False, pgqueuer QueueExecutionMode.drain).
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta
from typing import Any

import psycopg


def ready() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


async def installed(dsn: str, table: str) -> bool:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        row = await (await conn.execute("select to_regclass(%s) is not null", (table,))).fetchone()
        return bool(row and row[0])


async def procrastinate(dsn: str, mode: str, n: int) -> None:
    import procrastinate as p

    app = p.App(connector=p.PsycopgConnector(conninfo=dsn))

    @app.task(name="job", queue="bench")
    async def job(**_: Any) -> None:
        return None

    async with app.open_async():
        if mode == "fill":
            if not await installed(dsn, "procrastinate_jobs"):
                await app.schema_manager.apply_schema_async()
            await job.batch_defer_async(*({"n": i} for i in range(n)))
            return
        ready()
        await app.run_worker_async(queues=["bench"], concurrency=n, wait=False,
                                   install_signal_handlers=False)


async def pgqueuer(dsn: str, mode: str, n: int) -> None:
    from pgqueuer.db import PsycopgDriver
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    driver = PsycopgDriver(conn)
    if mode == "fill":
        if not await installed(dsn, "pgqueuer"):
            await Queries(driver).install()
        await Queries(driver).enqueue(["job"] * n, [b"{}"] * n, [0] * n)
        return
    qm = QueueManager(Queries(driver))

    @qm.entrypoint("job")
    async def job(_: Any) -> None:
        return None

    ready()
    await qm.run(batch_size=n, mode=QueueExecutionMode.drain,
                 dequeue_timeout=timedelta(seconds=1))


def main(argv: list[str]) -> None:
    peer, dsn, mode, n = argv[0], argv[1], argv[2], int(argv[3])
    run = {"procrastinate": procrastinate, "pgqueuer": pgqueuer}[peer]
    asyncio.run(run(dsn, mode, n))


if __name__ == "__main__":
    main(sys.argv[1:])
