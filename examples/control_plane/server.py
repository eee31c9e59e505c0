"""One replica of a tiny control plane that uses pgfence for leader fencing.

Replicas share one leader resource; ``pgfence.client.LeaderService`` runs each one's life
(a standby polls ``pgfence.acquire``; the leader renews its lease in the background and steps
down as soon as it is lost). Every durable mutation runs in a ``fence`` transaction against
tables protected with ``pgfence.protect`` and stamps the lease's generation on what it writes,
so a paused or partitioned old leader cannot write once a successor took over. Reads are served
by every replica. See docs/control-plane.md; examples/control_plane/fastapi_app.py is the same
service on FastAPI and ``pgfence.aio``.

    server.py --init --dsn DSN [--observe]         register the resource, create and protect tables
    server.py --dsn DSN --port PORT [--ttl S]      run one replica on 127.0.0.1:PORT

    GET  /health                 {"role": "leader"|"standby", "generation", "name", "mode"}
                                 (200 on every replica that is up: liveness)
    GET  /ready                  200 on the leader whose lease the database's fence accepts
                                 now, else 503 with a "reason" (readiness: what a load
                                 balancer routes by)
    GET  /jobs                   every job (any replica)
    POST /jobs                   {"spec": {...}}     -> 201 {"id", "generation"}
    POST /jobs/<id>/assign       {"runner": "r-1"}   -> 200 {"id", "runner", "generation"}

A replica that does not lead answers mutations with 503 and names the current leader.

Demonstration flags, not for production:
  --no-local-check   ignore the client's local lease deadline: the replica believes it leads
                     until PostgreSQL refuses its lease (a renewal, a fence, the readiness
                     probe), so the refusal you see is PostgreSQL's.
  --unsafe-no-fence  BROKEN ON PURPOSE: the failure pgfence exists to prevent. Once leader, the
                     replica trusts its in-memory role and writes without fence(). Protected
                     tables refuse its writes (PF007) unless they are in observe mode.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgfence.client import LeaderService, LeaseLost, Owner
from pgfence.connection import connect

Conn = psycopg.Connection[tuple[Any, ...]]
Reply = tuple[int, dict[str, Any]]
Work = Callable[[Conn, int], Reply]

SCHEMA = """
create table if not exists jobs (
  id         bigint generated always as identity primary key,
  spec       jsonb not null default '{}',
  state      text not null default 'queued' check (state in ('queued', 'assigned')),
  runner     text,
  generation bigint not null,                          -- the writer's fencing token
  updated_at timestamptz not null default clock_timestamp()
);
create table if not exists job_events (                -- append-only history of mutations
  id         bigint generated always as identity primary key,
  job_id     bigint not null references jobs,
  action     text not null,
  generation bigint not null,
  at         timestamptz not null default clock_timestamp()
);
"""


def init(dsn: str, resource: str, mode: str) -> None:
    with connect(dsn, "control-plane-init") as conn, conn.transaction():
        conn.execute("select pgfence.register(%s)", (resource,))
        conn.execute(SCHEMA)
        for table in ("jobs", "job_events"):
            conn.execute("select pgfence.protect(%s, %s, %s)", (table, resource, mode))
    print(f"resource {resource!r} registered; jobs and job_events protected ({mode})")


class BelievingOwner(Owner):
    """Believes it holds the lease past the local deadline: only PostgreSQL's refusals (of a
    renewal, a fence, the readiness probe) end its term."""

    @property
    def valid(self) -> bool:
        return self.lease_id is not None and self.lost is None


class Replica:
    def __init__(self, args: argparse.Namespace) -> None:
        self.dsn: str = args.dsn
        self.name: str = args.name or f"http://127.0.0.1:{args.port}"
        self.unsafe: bool = args.unsafe_no_fence
        believing = args.no_local_check or self.unsafe
        self.mode = ("unsafe-no-fence" if self.unsafe else
                     "fenced, no local check" if believing else "fenced")
        owner_cls = BelievingOwner if believing else Owner
        self.owner = owner_cls(self.dsn, args.resource, owner=self.name, ttl=args.ttl)
        self.service = LeaderService(self.owner, poll_interval=args.poll,
                                     on_elected=self.elected, on_stepped_down=self.stepped_down)
        self.elected_once = False

    def log(self, msg: str) -> None:
        print(f"[{self.name}] {msg}", file=sys.stderr, flush=True)

    def elected(self, generation: int) -> None:
        # A real control plane rebuilds its in-memory state from the database here.
        self.elected_once = True
        self.log(f"leader, generation {generation}")

    def stepped_down(self, why: str) -> None:
        # ... and drops it here, never writing it back.
        self.log(f"standby ({why})")

    def leading(self) -> bool:
        # --unsafe-no-fence, the failure on purpose: once elected, it trusts its memory.
        return self.service.leads or (self.unsafe and self.elected_once)

    def refuse(self, error: str, **extra: Any) -> Reply:
        return 503, {"error": error, "leader": self.service.current_leader(), **extra}

    def mutate(self, work: Work) -> Reply:
        """Runs one durable mutation, fenced, on the leader; a standby refuses it."""
        if not self.leading():
            return self.refuse("not the leader")
        try:
            with connect(self.dsn, self.name) as conn:
                if self.unsafe:                     # the failure on purpose: no fence
                    with conn.transaction():
                        return work(conn, self.owner.generation or 0)
                with self.owner.fenced(conn) as tx:
                    # fenced() has run fence(): the lease (and its generation) is current
                    # until this transaction ends, and no successor can be granted before.
                    return work(tx, self.owner.generation or 0)
        except LeaseLost as e:
            # The lease is marked lost: the service steps down (releases) and polls again.
            self.log(f"write refused, stepping down: {e}")
            return self.refuse("lease lost: stepped down", detail=str(e))
        except psycopg.Error as e:
            if e.sqlstate and e.sqlstate.startswith("PF"):
                return self.refuse("refused by the database", sqlstate=e.sqlstate,
                                   detail=e.diag.message_primary)
            raise

    def serve(self, port: int) -> None:
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.guarded(self.get)

            def do_POST(self) -> None:
                self.guarded(self.post)

            def guarded(self, method: Callable[[], None]) -> None:
                try:
                    method()
                except Exception as e:                 # e.g. the database is away
                    replica.log(f"{self.command} {self.path} failed: {e!r}")
                    self.reply(500, {"error": type(e).__name__, "detail": str(e)})

            def get(self) -> None:
                if self.path == "/health":
                    health = replica.service.health()
                    if replica.leading():
                        health.update(role="leader", generation=replica.owner.generation)
                    self.reply(200, {**health, "mode": replica.mode})
                elif self.path == "/ready":
                    self.reply(*replica.service.readiness())
                elif self.path == "/jobs":                 # reads: every replica serves them
                    with connect(replica.dsn, replica.name) as conn:
                        rows = conn.execute(JOBS).fetchall()
                    self.reply(200, {"jobs": [dict(zip(JOB_KEYS, r, strict=True))
                                              for r in rows]})
                else:
                    self.reply(404, {"error": "not found"})

            def post(self) -> None:
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"] or 0))
                                      or b"{}")
                except ValueError:
                    body = None
                if not isinstance(body, dict):
                    self.reply(400, {"error": "the body must be a JSON object"})
                    return
                assign = re.fullmatch(r"/jobs/(\d+)/assign", self.path)
                if self.path == "/jobs":
                    self.reply(*replica.mutate(lambda tx, gen: create_job(tx, gen, body)))
                elif assign and isinstance(body.get("runner"), str):
                    job_id = int(assign.group(1))
                    self.reply(*replica.mutate(
                        lambda tx, gen: assign_job(tx, gen, job_id, body["runner"])))
                else:
                    self.reply(404 if not assign else 400, {"error": "no such mutation"})

            def reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                replica.log(format % args)

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        leader = threading.Thread(target=self.service.run)
        leader.start()
        self.log(f"listening on 127.0.0.1:{port}, mode {self.mode}")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
        self.service.stop_now()
        leader.join()                              # releases the lease if it held one
        server.shutdown()


# The service's SQL, which examples/control_plane/fastapi_app.py shares. A job is assigned
# once: the update takes only a queued job, and a concurrent assignment waits for this one's row
# lock, then finds it assigned (READ COMMITTED re-reads the row).
JOBS = "select id, spec, state, runner, generation from jobs order by id"
JOB_KEYS = ("id", "spec", "state", "runner", "generation")
CREATE = "insert into jobs (spec, generation) values (%s, %s) returning id"
ASSIGN = ("update jobs set state = 'assigned', runner = %s, generation = %s, "
          "updated_at = clock_timestamp() where id = %s and state = 'queued' returning id")
EVENT = "insert into job_events (job_id, action, generation) values (%s, %s, %s)"


def create_job(tx: Conn, generation: int, body: dict[str, Any]) -> Reply:
    row = tx.execute(CREATE, (Jsonb(body.get("spec", {})), generation)).fetchone()
    assert row is not None
    tx.execute(EVENT, (row[0], "created", generation))
    return 201, {"id": row[0], "generation": generation}


def assign_job(tx: Conn, generation: int, job_id: int, runner: str) -> Reply:
    if tx.execute(ASSIGN, (runner, generation, job_id)).fetchone() is None:
        return 409, {"error": f"job {job_id} does not exist or is assigned already"}
    tx.execute(EVENT, (job_id, "assigned", generation))
    return 200, {"id": job_id, "runner": runner, "generation": generation}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--dsn", default="", help="libpq connection string (default: PG* variables)")
    p.add_argument("--resource", default="control-plane")
    p.add_argument("--init", action="store_true", help="register the resource, create tables")
    p.add_argument("--observe", action="store_true",
                   help="with --init: protect in observe mode (record unfenced writes only)")
    p.add_argument("--port", type=int, help="serve on 127.0.0.1:PORT")
    p.add_argument("--name", help="owner name (default: the replica's URL)")
    p.add_argument("--ttl", type=float, default=10.0, help="lease ttl, seconds")
    p.add_argument("--poll", type=float, default=0.5, help="standby's acquire poll, seconds")
    p.add_argument("--no-local-check", action="store_true",
                   help="demonstration: only the database's fence decides (still safe)")
    p.add_argument("--unsafe-no-fence", action="store_true",
                   help="demonstration, BROKEN ON PURPOSE: write without fence()")
    args = p.parse_args(argv)
    if args.init:
        init(args.dsn, args.resource, "observe" if args.observe else "enforce")
    elif args.port:
        Replica(args).serve(args.port)
    else:
        p.error("give --init or --port")


if __name__ == "__main__":
    main()
