"""The control-plane replica of server.py on FastAPI and ``pgfence.aio``: the same HTTP surface,
tables and rules, with ``pgfence.aio.LeaderService`` run by the app's lifespan.

    server.py --init --dsn DSN                       register the resource, create and protect
                                                     the tables (once, shared with server.py)
    fastapi_app.py --dsn DSN --port PORT [--ttl S]   run one replica on 127.0.0.1:PORT (uvicorn)

FastAPI and uvicorn are the repository's dev extras, not pgfence's dependencies. See
docs/control-plane.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg.types.json import Jsonb
from server import ASSIGN, CREATE, EVENT, JOB_KEYS, JOBS

from pgfence.aio import LeaderService, LeaseLost, Owner
from pgfence.connection import aconnect


def create_app(dsn: str, resource: str, name: str, ttl: float, poll: float) -> FastAPI:
    def log(msg: str) -> None:
        print(f"[{name}] {msg}", file=sys.stderr, flush=True)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Elected: rebuild in-memory state from the database; stepped down: drop it.
        service = LeaderService(Owner(dsn, resource, owner=name, ttl=ttl), poll_interval=poll,
                                on_elected=lambda g: log(f"leader, generation {g}"),
                                on_stepped_down=lambda why: log(f"standby ({why})"))
        async with service:                   # leaves as a standby: releases, a successor in
            app.state.leader = service
            yield

    app = FastAPI(lifespan=lifespan)

    def leader(request: Request) -> LeaderService:
        service: LeaderService = request.app.state.leader
        return service

    async def refuse(service: LeaderService, error: str, **extra: Any) -> JSONResponse:
        return JSONResponse({"error": error, "leader": await service.current_leader(), **extra},
                            status_code=503)

    async def mutate(request: Request, status: int, work: Any) -> JSONResponse:
        """One durable mutation, fenced, on the leader; a standby refuses it."""
        service = leader(request)
        if not service.leads:
            return await refuse(service, "not the leader")
        try:
            async with await aconnect(dsn, name) as conn, service.owner.fenced(conn) as tx:
                answer = await work(tx, service.owner.generation or 0)
        except LeaseLost as e:               # marked lost: the service steps down
            log(f"write refused, stepping down: {e}")
            return await refuse(service, "lease lost: stepped down", detail=str(e))
        except psycopg.Error as e:
            if e.sqlstate and e.sqlstate.startswith("PF"):
                return await refuse(service, "refused by the database", sqlstate=e.sqlstate,
                                    detail=e.diag.message_primary)
            raise
        if "error" in answer:
            status = 409
        return JSONResponse(answer, status_code=status)

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        return {**leader(request).health(), "mode": "fenced (asyncio)"}

    @app.get("/ready")
    async def ready(request: Request) -> JSONResponse:
        status, body = await leader(request).readiness()
        return JSONResponse(body, status_code=status)

    @app.get("/jobs")
    async def jobs() -> dict[str, Any]:                 # reads: every replica serves them
        async with await aconnect(dsn, name) as conn:
            rows = await (await conn.execute(JOBS)).fetchall()
        return {"jobs": [dict(zip(JOB_KEYS, r, strict=True)) for r in rows]}

    @app.post("/jobs")
    async def create(request: Request) -> JSONResponse:
        body = await request.json()

        async def work(tx: psycopg.AsyncConnection[Any], generation: int) -> dict[str, Any]:
            row = await (await tx.execute(CREATE, (Jsonb(body.get("spec", {})), generation))
                         ).fetchone()
            assert row is not None
            await tx.execute(EVENT, (row[0], "created", generation))
            return {"id": row[0], "generation": generation}
        return await mutate(request, 201, work)

    @app.post("/jobs/{job_id}/assign")
    async def assign(job_id: int, request: Request) -> JSONResponse:
        runner = (await request.json()).get("runner")

        async def work(tx: psycopg.AsyncConnection[Any], generation: int) -> dict[str, Any]:
            if await (await tx.execute(ASSIGN, (runner, generation, job_id))).fetchone() is None:
                return {"error": f"job {job_id} does not exist or is assigned already"}
            await tx.execute(EVENT, (job_id, "assigned", generation))
            return {"id": job_id, "runner": runner, "generation": generation}
        return await mutate(request, 200, work)

    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--dsn", default="", help="libpq connection string (default: PG* variables)")
    p.add_argument("--resource", default="control-plane")
    p.add_argument("--port", type=int, required=True, help="serve on 127.0.0.1:PORT")
    p.add_argument("--name", help="owner name (default: the replica's URL)")
    p.add_argument("--ttl", type=float, default=10.0, help="lease ttl, seconds")
    p.add_argument("--poll", type=float, default=0.5, help="standby's acquire poll, seconds")
    args = p.parse_args(argv)
    name = args.name or f"http://127.0.0.1:{args.port}"
    app = create_app(args.dsn, args.resource, name, args.ttl, args.poll)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
