"""What test files share, beside the fixtures of tests/conftest.py: the repository, small
checks, and both Python clients behind one interface (at the end). Clusters, PgBouncer and
connections are testkit.cluster's; named sessions and steps are testkit.harness's; installing
pgfence, its layers and what they stand on is testkit.install's."""

from __future__ import annotations

import asyncio
import fcntl
import importlib.machinery
import importlib.util
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import pgfence.aio
import pgfence.client
from pgfence.connection import aconnect, connect
from pgfence.releases import key
from testkit.cluster import DENO as DENO  # the tests' Deno is the workers bench's
from testkit.harness import Database, Lease

ROOT = Path(__file__).resolve().parent.parent
PGMQ_SQL = ROOT / ".tools/pgmq/pgmq.sql"  # pgmq's own install, put there by scripts/setup
# pgflow's own migrations, as npm's @pgflow/core (pinned in .tools/package.json) ships them.
PGFLOW_MIGRATIONS = ROOT / ".tools/node_modules/@pgflow/core/dist/supabase/migrations"
# The Supabase CLI's own binary from npm's platform package, as npm's .bin/supabase (a Node
# shim that spawns it with the same argv, stdio and environment) runs it: without the shim's
# Node start, about 1.5 s of CPU less for each of the tests' hundreds of calls.
SUPABASE = ROOT / ".tools/node_modules/@supabase/cli-linux-x64/bin/supabase"
# TEST-ONLY: Supabase Realtime's realtime.send, which pgflow's migrations call, as a stand-in
# that records its calls (realtime.stand_in_calls).
REALTIME_STAND_IN = ROOT / "tests/sql/realtime_stand_in.sql"


# How long a subprocess (the CLI, the Supabase CLI, Deno, pip, a build, a benchmark, a nested
# pytest) may take before a test calls it hung: a bound for a failure only, never a budget for
# the work. A Supabase CLI call took 25 s on a loaded 2-core machine, and one pgfence command
# makes several; a bound of 60-120 s failed good code there (issue 23).
HUNG = 1800

# A client's ttl or visibility, in seconds, that runs out only when a test moves time: no
# machine is so loaded that a test's real time reaches it (issue 23).
LONG = 600


def package_of(release: str, root: Path) -> Path:
    """The SQL files of this package as release ``release`` shipped them, in ``root``: its full
    installs (core and layers) as the newest, no upgrade file past it. For `pgfence init` as an
    older package ran it (pgfence.releases.Files(root))."""
    shutil.copytree(ROOT / "sql", root)
    (root / "pgfence.sql").write_text((root / f"releases/pgfence--{release}.sql").read_text())
    for layer in root.glob("pgfence-*.sql"):
        old = root / "releases" / layer.name.replace(".sql", f"--{release}.sql")
        if old.exists():
            layer.write_text(old.read_text())
        else:
            layer.unlink()
    for upgrade in (root / "upgrades").glob("*.sql"):
        if key(upgrade.stem.rpartition("--")[2]) > key(release):
            upgrade.unlink()
    return root


def bundle() -> Any:
    """scripts/bundle as a module: its rules (the plan, which script an entry runs, the
    queries it inlines), which the tests read rather than write again."""
    module = sys.modules.get("pgfence_bundle")
    if module is None:
        loader = importlib.machinery.SourceFileLoader("pgfence_bundle",
                                                      str(ROOT / "scripts/bundle"))
        spec = importlib.util.spec_from_loader(loader.name, loader)
        assert spec is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[loader.name] = module
        loader.exec_module(module)
    return module


def bundle_query(name: str, subject: str = "pgfence") -> str:
    """migrations/NAME.sql (fingerprint.sql, sqitch_registry.sql) about pgfence's schema and
    Sqitch project or a layer's (``subject``: pgfence_pgflow, say), as scripts/bundle puts it
    into the upgrade files: the script's own rule, loaded from it."""
    return str(bundle().query(name, subject))


def xdist_worker(config: pytest.Config) -> bool:
    """Whether this process is a pytest-xdist worker. (Not PYTEST_XDIST_WORKER: a pytest that
    a test starts, as scripts/mutate does, inherits it without being one.)"""
    return hasattr(config, "workerinput")


def once_per_run(config: pytest.Config, name: str, build: Callable[[Path], str]) -> str:
    """What ``build`` makes (a file's path, a database's name), made once for the whole run:
    by the first of the run's pytest-xdist workers to ask, under a file lock, in the dir the
    workers share (each worker's basetemp is inside the run's); the others wait and read it.
    ``build`` gets an empty dir of its own. Without xdist, the run is this one process."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    base = factory.getbasetemp()
    shared = (base.parent if xdist_worker(config) else base) / "once"
    shared.mkdir(exist_ok=True)
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / f"{name}.done"
        if done.exists():
            return done.read_text()
        work = shared / name
        work.mkdir(exist_ok=True)
        value = build(work)
        done.write_text(value)
        return value


def acquired(lease: Lease | None) -> Lease:
    assert lease is not None, "expected a lease"
    return lease


# -- the Python clients: every client scenario runs against pgfence.client and pgfence.aio --

AnyOwner = pgfence.client.Owner | pgfence.aio.Owner
AnyWorker = pgfence.client.Worker | pgfence.aio.Worker
AnyContext = pgfence.client.Context | pgfence.aio.Context
# Called first by every test handler: may raise to fail the task. What it returns is awaited
# by an asyncio handler if it is a coroutine (e.g. another worker's run).
Pre = Callable[[Any, AnyContext], Any]

KINDS = ("sync", "async")


class Clock:
    """A fake monotonic clock: time passes for an owner only when a test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def effects_table(db: Database, resource: str) -> None:
    """``effects``: one row per handler that got as far as its fenced write."""
    db.sql("create table effects (task_id bigint, attempt int, generation bigint)")
    db.sql("select pgfence.protect('effects', %s)", (resource,))


EFFECT = "insert into effects values (%s, %s, %s)"


async def later(result: Any) -> None:
    if asyncio.iscoroutine(result):
        await result


@dataclass
class Client:
    """One of the two clients; ``call`` runs what its methods return (a value for the threaded
    one, a coroutine for asyncio's, run on this client's loop)."""

    kind: str
    effect_dsn: str
    _loop: asyncio.AbstractEventLoop | None = None
    _closers: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def aio(self) -> bool:
        return self.kind == "async"

    def owner(self, *args: Any, **kwargs: Any) -> Any:
        cls = pgfence.aio.Owner if self.aio else pgfence.client.Owner
        return cls(*args, **kwargs)

    def worker(self, owner: Any, queue: str, pre: Pre, cls: type[Any] | None = None,
               effect: bool = True, **kwargs: Any) -> Any:
        """A worker whose handler runs ``pre(payload, context)``, then (``effect``) writes its
        effect in a transaction fenced by ``owner``, and returns ``{"n": payload["n"]}``."""
        cls = cls or (pgfence.aio.Worker if self.aio else pgfence.client.Worker)
        return cls(owner, queue, self.handler(owner, pre, effect), **kwargs)

    def handler(self, owner: Any, pre: Pre, effect: bool = True) -> Any:
        if not effect:
            if self.aio:
                async def plain(payload: Any, ctx: pgfence.aio.Context) -> Any:
                    await later(pre(payload, ctx))
                    return {"n": payload["n"]}
                return plain

            def plain_sync(payload: Any, ctx: pgfence.client.Context) -> Any:
                pre(payload, ctx)
                return {"n": payload["n"]}
            return plain_sync
        if self.aio:
            aconns: list[Any] = []

            async def ahandler(payload: Any, ctx: pgfence.aio.Context) -> Any:
                await later(pre(payload, ctx))
                if not aconns:
                    aconns.append(await aconnect(self.effect_dsn, "effects"))
                    self._closers.append(lambda: self.call(aconns[0].close()))
                async with owner.fenced(aconns[0]) as tx:
                    await tx.execute(EFFECT, (ctx.task.task_id, ctx.task.attempt,
                                              owner.generation))
                return {"n": payload["n"]}
            return ahandler
        conn = connect(self.effect_dsn, "effects")
        self._closers.append(conn.close)

        def handler(payload: Any, ctx: pgfence.client.Context) -> Any:
            pre(payload, ctx)
            with owner.fenced(conn) as tx:
                tx.execute(EFFECT, (ctx.task.task_id, ctx.task.attempt, owner.generation))
            return {"n": payload["n"]}
        return handler

    def call(self, result: Any) -> Any:
        if not asyncio.iscoroutine(result):
            return result
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(result)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Waits for ``event`` while this client's renewers run (on asyncio's loop, too)."""
        if self.aio:
            return bool(self.call(asyncio.to_thread(event.wait, timeout)))
        return event.wait(timeout)

    def close(self) -> None:
        for closer in reversed(self._closers):
            closer()
        if self._loop is not None:
            # The renewer tasks of owners that were never released end with the loop.
            for task in asyncio.all_tasks(self._loop):
                task.cancel()
            self._loop.run_until_complete(asyncio.sleep(0))
            self._loop.close()


@contextmanager
def client(kind: str, db: Database) -> Iterator[Client]:
    c = Client(kind, db.server_dsn)
    try:
        yield c
    finally:
        c.close()


# -- a Deno program that serves HTTP (the example edge functions) -----------------------------

DENO_PERMISSIONS = ["--allow-net=127.0.0.1", "--allow-env", "--allow-read", "--allow-sys"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class DenoServer:
    """`deno run SCRIPT` in ``cwd`` listening on a free loopback port (HOST, PORT), started
    once Deno.serve says it listens; ``post`` sends a request as a supervisor or pg_net would."""

    def __init__(self, script: str, cwd: Path, env: dict[str, str],
                 flags: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(DENO), "run", *DENO_PERMISSIONS, *flags, script], cwd=cwd,
            env={**env, "HOST": "127.0.0.1", "PORT": str(self.port)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert "Listening on" in line, line or f"it exited ({self.proc.wait()})"

    def post(self, body: bytes | dict[str, Any], path: str = "/",
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data,
                                         {"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=HUNG) as r:
                answer: dict[str, Any] = json.loads(r.read())
                return r.status, answer
        except urllib.error.HTTPError as e:
            refused: dict[str, Any] = json.loads(e.read())
            return e.code, refused

    def stop(self) -> int:
        """SIGTERM, as a process supervisor stops it: the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=HUNG)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def refuses_what_is_not_a_fresh_invocation(server: DenoServer, path: str = "/",
                                           headers: dict[str, str] | None = None) -> None:
    """The handshake every shipped example documents: a malformed body is refused with 400, a
    request without an invocation id, or with one never issued, with 409; JSON, no stack."""
    for body, why in ((b"{not json", "the body is not JSON"),
                      (b"[1, 2]", "the body is not a JSON object"),
                      ({"invocation_id": "not-a-uuid"}, "invocation_id is not a uuid")):
        assert server.post(body, path, headers) == (400, {"error": "Bad Request",
                                                          "message": why})
    status, said = server.post({}, path, headers)
    assert status == 409 and said["started"] is False and "no invocation id" in said["message"]
    status, said = server.post({"invocation_id": str(uuid.uuid4())}, path, headers)
    assert status == 409 and said["started"] is False, said
