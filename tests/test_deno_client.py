"""The Deno client (clients/deno): deno fmt, lint and check clean, with negative controls (its
API reference: tests/test_apidoc.py); then its own tests (`deno test`) against a fresh database
of this run's cluster, reached directly and through PgBouncer in transaction pooling mode;
docs/deno.md's example, and a worker as a real process (paused past its lease with SIGSTOP, or
drained with SIGTERM), through PgBouncer.

Deno and postgres.js are the versions pinned in .tools/package.json, installed by scripts/setup
from npm. Each run gets an empty DENO_DIR, so nothing is found in a cache of an earlier run: the
client resolves postgres.js from .tools/node_modules (clients/deno/deno.json), offline.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from testkit.cluster import LOOPBACK, USER, Cluster, PgBouncer
from testkit.harness import Database
from tests.support import DENO, HUNG, ROOT, DenoServer, refuses_what_is_not_a_fresh_invocation
from tests.test_docs import example

CLIENT = ROOT / "clients/deno"
# What the tests need and no more: the cluster and PgBouncer on loopback, their own env
# variables, and the files of the client and of postgres.js.
PERMISSIONS = ["--allow-net=" + LOOPBACK, "--allow-env", "--allow-read", "--allow-sys"]


def deno(env: dict[str, str], *args: str, cwd: Path = CLIENT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DENO), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=HUNG)


def test_fmt_lint_and_check_are_clean(deno_env: dict[str, str]) -> None:
    bench = "../../bench/driver/deno_worker.ts"     # the workers bench's, with this config
    for args in (["fmt", "--check"], ["lint"], ["fmt", "--check", bench], ["lint", bench],
                 ["check", "mod.ts", "pgflow.ts", "client_test.ts", "pgflow_test.ts",
                  "testdata/worker_process.ts",
                  "testdata/fault_worker.ts", "testdata/pgflow_worker_process.ts",
                  "testdata/edge_runtime.ts", "testdata/campaign_flow.ts",
                  "examples/pgflow_edge_function.ts", "examples/supabase_worker.ts",
                  "pgmq_test.ts", "examples/pgmq_edge_function.ts", bench]):
        out = deno(deno_env, *args)
        assert out.returncode == 0, f"deno {' '.join(args)}:\n{out.stdout}{out.stderr}"


def test_negative_control_fmt_lint_and_check_catch_a_bad_file(
        deno_env: dict[str, str], tmp_path: Path) -> None:
    """They look at the files: a badly formatted, lint-failing, ill-typed one is refused."""
    bad = tmp_path / "bad.ts"
    bad.write_text('var unused   = 1\nconst n: number = "one";\nexport { n }\n')
    for args, said in ((["fmt", "--check"], "Found 1 not formatted file"),
                       (["lint"], "no-var"), (["check"], "TS2322")):
        out = deno(deno_env, *args, str(bad), cwd=tmp_path)
        assert out.returncode != 0 and said in out.stdout + out.stderr, out.stdout + out.stderr


def url(port: int, database: str) -> str:
    return f"postgres://{USER}@{LOOPBACK}:{port}/{database}"


@pytest.fixture
def deno_test(db: Database, cluster: Cluster, bouncer: PgBouncer,
              deno_env: dict[str, str]) -> Iterator[subprocess.CompletedProcess[str]]:
    name = conninfo_to_dict(db.dsn)["dbname"]
    assert isinstance(name, str)
    env = {**deno_env, "PGFENCE_DENO_DIRECT_URL": url(cluster.port, name),
           "PGFENCE_DENO_BOUNCER_URL": url(bouncer.port, name)}
    yield deno(env, "test", *PERMISSIONS, "client_test.ts")


def test_deno_client_tests_pass_directly_and_through_pgbouncer(
        deno_test: subprocess.CompletedProcess[str]) -> None:
    out = deno_test.stdout + deno_test.stderr
    assert deno_test.returncode == 0, out
    summary = re.search(r"^ok \| (\d+) passed \| 0 failed(?: \| (\d+) ignored)?", out, re.M)
    assert summary and summary.group(2) in (None, "0"), out
    results = re.findall(r"^(.+) \[(direct|pgbouncer)\] \.\.\. (\w+)", out, re.M)
    passed = [(name, target) for name, target, verdict in results if verdict == "ok"]
    direct = {name for name, target in passed if target == "direct"}
    through = {name for name, target in passed if target == "pgbouncer"}
    # Every test of the pooler's kind ran through PgBouncer as well as directly.
    assert direct and through == direct, out


def test_docs_example_works_the_queue_through_pgbouncer(
        db: Database, bouncer: PgBouncer, deno_env: dict[str, str], tmp_path: Path) -> None:
    db.sql("select pgfence.register('mailer')")
    for to in ("ada@example.org", "grace@example.org"):
        db.sql("select pgfence.enqueue('emails', jsonb_build_object('to', %s::text))", (to,))
    script = tmp_path / "worker.ts"
    script.write_text(example("docs/deno.md", "deno example", "ts"))
    name = conninfo_to_dict(db.dsn)["dbname"]
    assert isinstance(name, str)
    for args in (["fmt", "--check", "--line-width", "100"], ["lint"]):   # as clients/deno's
        out = deno(deno_env, *args, str(script), cwd=tmp_path)
        assert out.returncode == 0, out.stdout + out.stderr
    env = {**deno_env, "DATABASE_URL": url(bouncer.port, name)}
    out = deno(env, "run", "--check", "--config", str(CLIENT / "deno.json"), *PERMISSIONS,
               str(script))
    assert out.returncode == 0, out.stdout + out.stderr
    assert db.sql("select state, result->>'to' from pgfence.tasks order by task_id") == [
        ("completed", "ada@example.org"), ("completed", "grace@example.org")]
    assert db.one("select status from pgfence.lease_status") == "released"


class WorkerProcess:
    """clients/deno/testdata/worker_process.ts as a process of its own, through PgBouncer."""

    def __init__(self, db: Database, bouncer: PgBouncer, env: dict[str, str]) -> None:
        name = conninfo_to_dict(db.dsn)["dbname"]
        assert isinstance(name, str)
        self.proc = subprocess.Popen(
            [str(DENO), "run", *PERMISSIONS, "testdata/worker_process.ts"], cwd=CLIENT,
            env={**env, "DATABASE_URL": url(bouncer.port, name), "RESOURCE": "w"},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def said(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the worker exited ({self.proc.wait()}) without a word"
        said: dict[str, Any] = json.loads(line)
        return said

    def unblock(self) -> None:
        """The handler in hand returns."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> dict[str, Any]:
        said = self.said()
        assert self.proc.wait(timeout=HUNG) == 0
        return said

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def worker_process(db: Database, bouncer: PgBouncer,
                   deno_env: dict[str, str]) -> Iterator[WorkerProcess]:
    db.sql("select pgfence.register('w')")
    for _ in range(2):
        db.sql("select pgfence.enqueue('q')")
    process = WorkerProcess(db, bouncer, deno_env)
    try:
        yield process
    finally:
        process.kill()


def test_a_paused_worker_process_resumes_claims_nothing_and_its_result_is_stale(
        db: Database, worker_process: WorkerProcess) -> None:
    attempt = worker_process.said()["started"]
    worker_process.proc.send_signal(signal.SIGSTOP)        # paused in its handler ...
    lease = db.one("select lease_id from pgfence.leases where owner = 'process'")
    db.expire(lease)                                       # ... past its lease
    successor = db.session("successor")
    new = successor.acquire("w")
    assert new is not None
    db.expire_attempt(attempt)
    successor.run("select pgfence.requeue_expired()")
    # The successor takes the queue: the task the process started, and the other one.
    assert len(successor.run("select * from pgfence.claim(%s, 'q', 10, '30 s')",
                             (new.lease_id,))) == 2
    db.sql("select pgfence.enqueue('q')")                 # a task for whoever may claim
    worker_process.proc.send_signal(signal.SIGCONT)
    worker_process.unblock()
    said = worker_process.finish()
    assert said["verdicts"] == {"accepted": 0, "duplicate": 0, "stale": 1}, said
    assert said["handled"] == 1 and "refused" in said["lost"], said
    # The successor holds the task the process started; the new one nobody claimed.
    assert db.sql("select state, attempt, lease_id = %s from pgfence.tasks order by task_id",
                  (new.lease_id,)) == [("claimed", 2, True), ("claimed", 1, True),
                                       ("queued", 0, None)]
    assert db.sql("select kind, body from pgfence.stale_results") == [
        ("complete", {"by": "process"})]


def test_sigterm_drains_a_worker_process(db: Database, worker_process: WorkerProcess) -> None:
    worker_process.said()                                  # a handler in hand
    worker_process.proc.send_signal(signal.SIGTERM)
    # Taken before the handler returns (a signal and the handler's end in the same turn of the
    # event loop come in either order; the results ride with the next claim at once).
    assert worker_process.said() == {"stopping": "SIGTERM"}
    worker_process.unblock()
    said = worker_process.finish()
    assert said["verdicts"]["accepted"] == 1 and said["handled"] == 1, said
    assert db.sql("select state from pgfence.tasks order by task_id") == [
        ("completed",), ("queued",)]
    assert db.one("select status from pgfence.lease_status") == "released"


def test_the_supabase_worker_template_follows_its_handshake(
        db: Database, cluster: Cluster, deno_env: dict[str, str]) -> None:
    """examples/supabase_worker.ts (what `pgfence init` writes): a fresh invocation id works the
    queue and answers 200; anything else is refused, nothing acquired (0.2.1's template started
    a worker for a request without an id, or with a body that was not JSON)."""
    name = conninfo_to_dict(db.dsn)["dbname"]
    assert isinstance(name, str)
    db.sql("select pgfence.register('emails')")
    db.sql("select pgfence.enqueue('emails', '{\"to\": \"x\"}')")
    server = DenoServer("examples/supabase_worker.ts", CLIENT,
                        {**deno_env, "PGFENCE_DATABASE_URL": url(cluster.port, name)})
    try:
        refuses_what_is_not_a_fresh_invocation(server)
        assert db.one("select count(*) from pgfence.leases") == 0, "nothing was acquired"
        invocation = str(db.one("select pgfence.request_start('emails')"))
        status, said = server.post({"invocation_id": invocation})
        assert status == 200 and said["handled"] == 1, said
        assert db.one("select state from pgfence.tasks") == "completed"
    finally:
        server.kill()
