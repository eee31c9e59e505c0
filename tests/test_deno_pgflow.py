"""The pgflow worker of the Deno client (clients/deno/pgflow.ts) as real processes on a real
pgflow flow (`two`: first -> second, started with pgflow.start_flow), directly and through
PgBouncer in transaction pooling mode: a worker paused past its lease (SIGSTOP) while a
successor takes its task over, a late result nobody overtook, a hard kill, the startup
handshake of the Edge-Function-shaped example, and the update window. The negative control
runs the same pause against pgflow's own, unfenced protocol and sees the stale completion land.

Time passing is simulated (pgfence_test.expire, stall_task); a process's progress is read
from what it prints, never waited out with a sleep. So nothing runs out by itself while a
test holds a worker paused and starts its successor (a Deno process, slow on a loaded
machine): the flow's steps' timeout, which hides a started task's message, is LONG, and so is
the worker process's handler deadline (testdata/pgflow_worker_process.ts).

Each test runs on pgflow 0.8.1 (npm) and 0.14.1 (../shared/vendor, on a pg_cron cluster of its
own: flow_cluster, flow_bouncer; tests/conftest.py, PGFLOW_VERSIONS, says where it skips).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from testkit.cluster import LOOPBACK, USER, Cluster, PgBouncer
from testkit.harness import Database
from tests.pgflow14 import CRON_DATABASE, install_pgflow14
from tests.pgflow14 import migrations as pgflow14_migrations
from tests.support import (
    DENO,
    HUNG,
    LONG,
    ROOT,
    DenoServer,
    refuses_what_is_not_a_fresh_invocation,
)
from tests.test_docs import example
from tests.test_pgflow import run_status, task, two_steps

CLIENT = ROOT / "clients/deno"
PERMISSIONS = ["--allow-net=" + LOOPBACK, "--allow-env", "--allow-read", "--allow-sys"]


@dataclass
class Target:
    db: Database
    url: str


@pytest.fixture(params=["direct", "pgbouncer"])
def target(request: pytest.FixtureRequest, flow: Database, flow_cluster: Cluster) -> Target:
    name = conninfo_to_dict(flow.dsn)["dbname"]
    assert isinstance(name, str)
    port = flow_cluster.port
    if request.param == "pgbouncer":
        bouncer: PgBouncer = request.getfixturevalue("flow_bouncer")
        port = bouncer.port
    return Target(flow, f"postgres://{USER}@{LOOPBACK}:{port}/{name}")


class FlowProcess:
    """clients/deno/testdata/pgflow_worker_process.ts: one worker, named, on resource fn."""

    def __init__(self, target: Target, env: dict[str, str], name: str,
                 unfenced: bool = False, start: bool = False) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [str(DENO), "run", *PERMISSIONS, "testdata/pgflow_worker_process.ts"], cwd=CLIENT,
            env={**env, "DATABASE_URL": target.url, "RESOURCE": "fn", "NAME": name,
                 "UNFENCED": "1" if unfenced else "0", "START": "1" if start else "0"},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def said(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"worker {self.name} exited ({self.proc.wait()}) without a word"
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
def processes(deno_env: dict[str, str]) -> Iterator[list[FlowProcess]]:
    started: list[FlowProcess] = []
    yield started
    for p in started:
        p.kill()


def spawn(target: Target, env: dict[str, str], processes: list[FlowProcess], name: str,
          unfenced: bool = False, start: bool = False) -> FlowProcess:
    p = FlowProcess(target, env, name, unfenced, start)
    processes.append(p)
    return p


def lease_of(db: Database, owner: str) -> uuid.UUID:
    return uuid.UUID(str(db.one("select lease_id from pgfence.leases where owner = %s", (owner,))))


def past_lease_and_visibility(db: Database, owner: str) -> None:
    """Time passes for a paused worker: its lease, and its task's message visibility."""
    db.expire(lease_of(db, owner))
    db.sql("select pgfence_test.stall_task('two', message_id) from pgflow.step_tasks "
           "where status = 'started'")


def test_a_paused_worker_resumes_starts_nothing_and_only_the_successor_lands(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess]) -> None:
    db = target.db
    run_id = two_steps(db, timeout=LONG)
    a = spawn(target, deno_env, processes, "a")
    assert "acquired" in a.said()
    stale = a.said()["started"]
    a.proc.send_signal(signal.SIGSTOP)                 # paused in its handler ...
    past_lease_and_visibility(db, "a")                 # ... past its lease and visibility
    b = spawn(target, deno_env, processes, "b")
    assert "acquired" in b.said()
    assert b.said()["step"] == "first", "B took the task over"
    assert task(db, "first") == ("started", 2, None)
    a.proc.send_signal(signal.SIGCONT)
    a.unblock()
    said_a = a.finish()
    assert said_a["verdicts"] == {"accepted": 0, "duplicate": 0, "stale": 1}, said_a
    assert "refused" in said_a["lost"], said_a
    b.unblock()
    assert b.said()["step"] == "second"
    b.unblock()
    said_b = b.finish()
    assert said_b["verdicts"] == {"accepted": 2, "duplicate": 0, "stale": 0}, said_b
    assert task(db, "first") == ("completed", 2, {"by": "b"})
    assert run_status(db, run_id) == ("completed", {"second": {"by": "b"}})
    assert db.one("select count(*) from realtime.stand_in_calls where event = 'run:completed'") \
        == 1, "the run completed exactly once"
    assert db.sql("select kind, body from pgfence_pgflow.stale_results where attempt_id = %s",
                  (stale,)) == [("complete", {"by": "a"})]
    assert db.one("select count(*) from pgfence_pgflow.attempts where lease_id = %s",
                  (lease_of(db, "a"),)) == 1, "A started nothing after it resumed"
    assert db.sql("select owner, status from pgfence.lease_status order by generation") == [
        ("a", "superseded"), ("b", "released")]


def test_negative_control_pgflows_own_protocol_lets_the_paused_worker_land(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess]) -> None:
    db = target.db
    two_steps(db, timeout=LONG)
    a = spawn(target, deno_env, processes, "a", unfenced=True)
    assert "acquired" in a.said()
    a.said()
    a.proc.send_signal(signal.SIGSTOP)
    past_lease_and_visibility(db, "a")
    b = spawn(target, deno_env, processes, "b")
    assert "acquired" in b.said() and b.said()["step"] == "first"
    a.proc.send_signal(signal.SIGCONT)
    a.unblock()
    # (A may go on to start `second` too: nothing stops a stale worker there either.)
    db.wait_until("select status = 'completed' from pgflow.step_tasks where step_slug = 'first'")
    assert task(db, "first") == ("completed", 2, {"by": "a"}), "the stale completion landed"
    b.unblock()
    db.wait_until("select count(*) = 1 from pgfence_pgflow.stale_results")
    assert db.sql("select kind, body from pgfence_pgflow.stale_results") == [
        ("complete", {"by": "b"})], "and the successor's valid result is refused"


def test_a_late_result_nobody_overtook_is_kept(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess]) -> None:
    db = target.db
    run_id = two_steps(db, timeout=LONG)
    a = spawn(target, deno_env, processes, "a")
    assert "acquired" in a.said()
    a.said()
    a.proc.send_signal(signal.SIGSTOP)
    db.expire(lease_of(db, "a"))                       # the lease runs out; the message's not
    b = spawn(target, deno_env, processes, "b")
    assert "acquired" in b.said()
    assert b.finish()["handled"] == 0, "the task was still A's"
    a.proc.send_signal(signal.SIGCONT)
    a.unblock()
    said_a = a.finish()
    assert said_a["verdicts"]["accepted"] == 1 and said_a["handled"] == 1, said_a
    assert task(db, "first") == ("completed", 1, {"by": "a"})
    c = spawn(target, deno_env, processes, "c")
    assert "acquired" in c.said() and c.said()["step"] == "second"
    c.unblock()
    assert c.finish()["verdicts"]["accepted"] == 1
    assert run_status(db, run_id) == ("completed", {"second": {"by": "c"}})


def test_a_hard_killed_workers_task_comes_back(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess]) -> None:
    db = target.db
    run_id = two_steps(db, timeout=LONG)
    a = spawn(target, deno_env, processes, "a")
    assert "acquired" in a.said()
    a.said()
    a.kill()                                           # SIGKILL: no drain, no release
    past_lease_and_visibility(db, "a")
    b = spawn(target, deno_env, processes, "b")
    assert "acquired" in b.said() and b.said()["step"] == "first"
    b.unblock()
    assert b.said()["step"] == "second"
    b.unblock()
    assert b.finish()["verdicts"]["accepted"] == 2
    assert task(db, "first") == ("completed", 2, {"by": "b"})
    assert run_status(db, run_id)[0] == "completed"


def test_the_update_window_drains_the_worker_and_restores_exactly(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess]) -> None:
    db = target.db
    run_id = two_steps(db, timeout=LONG)
    db.sql("select pgfence.protect(t, array['fn'], 'enforce') "
           "from unnest(array['pgflow.step_tasks', 'pgmq.q_two']::regclass[]) t")
    a = spawn(target, deno_env, processes, "a")
    assert "acquired" in a.said()
    a.said()                                           # a handler in hand
    token = db.one("select pgfence.prepare_update(array['fn'], %s)", (uuid.uuid4(),))
    assert db.one("select verdict from pgfence.update_status(%s)", (token,)) == "draining"
    a.unblock()
    said_a = a.finish()
    assert said_a["verdicts"]["accepted"] == 1 and said_a["handled"] == 1, said_a
    assert task(db, "first")[0] == "completed", "the task in hand was finished"
    assert db.one("select status from pgflow.step_tasks where step_slug = 'second'") == "queued"
    assert db.one("select verdict from pgfence.update_status(%s)", (token,)) == "drained"
    assert db.sql("select resource, enabled, outcome from pgfence.finish_update(%s)",
                  (token,)) == [("fn", True, "restored")]
    b = spawn(target, deno_env, processes, "b")
    assert "acquired" in b.said() and b.said()["step"] == "second"
    b.unblock()
    b.finish()
    assert run_status(db, run_id)[0] == "completed"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_the_one_line_start_and_releases(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess],
        signum: signal.Signals) -> None:
    """`FlowWorker.start` in a process: the process platform's signals stop it as `stop` does
    (0.2.1's one-line start listened to none: the signal ended the process, lease current)."""
    db = target.db
    run_id = two_steps(db, timeout=LONG)
    a = spawn(target, deno_env, processes, "a", start=True)
    assert a.said()["step"] == "first"                 # a handler in hand
    a.proc.send_signal(signum)
    assert a.said() == {"stopped": signum.name}        # heard, then the handler returns
    a.unblock()
    said = a.finish()                                  # exit status 0: it ended by itself
    assert said == {"verdicts": {"accepted": 1, "duplicate": 0, "stale": 0}, "handled": 1,
                    "stoppedBy": signum.name}, said
    assert task(db, "first")[0] == "completed", "the task in hand was finished"
    assert db.one("select status from pgflow.step_tasks where step_slug = 'second'") == "queued"
    assert db.sql("select owner, status from pgfence.lease_status") == [("a", "released")]
    assert run_status(db, run_id)[0] == "started"


# -- the Edge-Function-shaped example and the startup handshake --------------------------------

KEY = "service-role-key-of-the-test"
AUTHORIZED = {"authorization": f"Bearer {KEY}"}


def entry(target: Target, env: dict[str, str]) -> DenoServer:
    """examples/pgflow_edge_function.ts (`FlowWorker.serve`), as the Edge Runtime runs a
    function: reached at /pgflow-two, its key in SUPABASE_SERVICE_ROLE_KEY."""
    return DenoServer("examples/pgflow_edge_function.ts", CLIENT, {
        **env, "EDGE_WORKER_DB_URL": target.url, "SUPABASE_SERVICE_ROLE_KEY": KEY,
        "SB_EXECUTION_ID": str(uuid.uuid4())})


@pytest.fixture
def servers() -> Iterator[list[DenoServer]]:
    started: list[DenoServer] = []
    yield started
    for server in started:
        server.kill()


def test_the_entry_refuses_what_is_not_a_fresh_invocation_and_acquires_nothing(
        target: Target, deno_env: dict[str, str], servers: list[DenoServer]) -> None:
    db = target.db
    two_steps(db, resources=("pgflow-two",))
    server = entry(target, deno_env)
    servers.append(server)
    unauthorized = {"error": "Unauthorized", "message": "Unauthorized"}
    assert server.post({}, "/pgflow-two") == (401, unauthorized)
    assert server.post({}, "/pgflow-two", {"authorization": "Bearer another key"}) == (
        401, unauthorized)
    refuses_what_is_not_a_fresh_invocation(server, "/pgflow-two", AUTHORIZED)
    assert db.one("select count(*) from pgfence.leases") == 0, "nothing was acquired"
    assert db.one("select count(*) from pgflow.step_tasks where status = 'started'") == 0
    assert server.stop() == 0


def test_the_entry_starts_once_per_invocation_and_marks_its_worker_stopped(
        target: Target, deno_env: dict[str, str], servers: list[DenoServer],
        pgflow_version: str) -> None:
    db = target.db
    run_id = two_steps(db, resources=("pgflow-two",))
    server = entry(target, deno_env)
    servers.append(server)
    invocation = db.one("select pgfence.request_start('pgflow-two')")
    assert invocation is not None
    # The worker is held inside its first complete_task (a session holds the run's row,
    # which pgflow's complete_task locks), so that it is surely current meanwhile.
    holder = db.session("holder")
    holder.begin()
    holder.run("select from pgflow.runs where run_id = %s for update", (run_id,))
    status, said = server.post({"invocation_id": str(invocation)}, "/pgflow-two", AUTHORIZED)
    assert status == 202 and said["started"] is True and said["functionName"] == "pgflow-two", \
        said
    db.wait_until("select count(*) = 1 from pg_stat_activity "
                  "where %s = any(pg_blocking_pids(pid))", (holder.pid,))
    assert db.one("select pgfence.request_start('pgflow-two')") is None, \
        "no start is requested while a worker is current"
    status, said = server.post({"invocation_id": str(invocation)}, "/pgflow-two", AUTHORIZED)
    assert status == 409 and said["started"] is False, "a replayed invocation starts nothing"
    holder.commit()
    db.wait_until("select status = 'completed' from pgflow.runs where run_id = %s", (run_id,))
    assert run_status(db, run_id) == ("completed", {"second": {"from_first": {
        "seen": {"n": 1}}}})
    assert db.one("select count(*) from realtime.stand_in_calls "
                  "where event = 'run:completed'") == 1
    if pgflow_version == "0.14.1":
        # Registered as pgflow 0.14's worker registers its function.
        assert db.one("select count(*) from pgflow.worker_functions "
                      "where function_name = 'pgflow-two'") == 1
    assert server.stop() == 0                          # SIGTERM: drained, released, ended
    assert db.sql("select status from pgfence.lease_status") == [("released",)]
    mark = "stopped_at" if pgflow_version == "0.14.1" else "deprecated_at"
    assert db.sql(f"select function_name, {mark} is not null from pgflow.workers") == [
        ("pgflow-two", True)], "its worker row was marked as it ended"
    assert db.one("select pgfence.request_start('pgflow-two')") is not None, \
        "once the worker is gone, the supervisor may start another"


# -- clients/deno/pgflow_test.ts: the drop-in worker and its backoff ---------------------------

def test_pgflow_worker_tests_pass_directly_and_through_pgbouncer(
        flow: Database, flow_cluster: Cluster, flow_bouncer: PgBouncer,
        deno_env: dict[str, str]) -> None:
    """`deno test pgflow_test.ts` on a pgflow database: a @pgflow/dsl flow compiled by pgflow's
    compiler and run end to end by FlowWorker.start; the refusal backoff and its negative
    control; each handler's visibility (the step's timeout from the database, a later task of
    a batch extended or skipped, a long handler's message kept first); beforeunload and faults
    of the one-line start."""
    name = conninfo_to_dict(flow.dsn)["dbname"]
    assert isinstance(name, str)
    env = {**deno_env,
           "PGFENCE_DENO_DIRECT_URL": f"postgres://{USER}@{LOOPBACK}:{flow_cluster.port}/{name}",
           "PGFENCE_DENO_BOUNCER_URL": f"postgres://{USER}@{LOOPBACK}:{flow_bouncer.port}/{name}"}
    out = subprocess.run([str(DENO), "test", *PERMISSIONS, "pgflow_test.ts"], cwd=CLIENT,
                         env=env, capture_output=True, text=True, timeout=HUNG)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    summary = re.search(r"^ok \| (\d+) passed \| 0 failed(?: \| (\d+) ignored)?", said, re.M)
    assert summary and int(summary.group(1)) == 36 and summary.group(2) in (None, "0"), said


# -- docs/pgflow.md, "Moving from pgflow's EdgeWorker (0.14)": a pgflow 0.14 project converted --

# A pgflow 0.14 project as `npx pgflow install` lays one out: its migrations, a flow in
# supabase/flows/ whose handlers take pgflow 0.14's inputs (a root step the run's input, a
# dependent one its dependencies' outputs), and a worker function started by EdgeWorker.start,
# with its deno.json. @pgflow/dsl 0.14.1 is not on the npm registry this machine reaches: the
# project's import map names 0.8.1, whose Flow builds the same definition at run time (its
# types differ, so the function runs without type-checking, as `deno run` does by default).
ORIGINAL = {
    "supabase/flows/order-total.ts": """import { Flow } from "@pgflow/dsl";

export const OrderTotal = new Flow<{ items: number[] }>({ slug: "orderTotal" })
  .step({ slug: "subtotal" }, (order) => order.items.reduce((a, b) => a + b, 0))
  .step({ slug: "total", dependsOn: ["subtotal"] }, (deps) => deps.subtotal * 2);
""",
    "supabase/functions/order-worker/index.ts": """import { EdgeWorker } from "@pgflow/edge-worker";
import { OrderTotal } from "../../flows/order-total.ts";

EdgeWorker.start(OrderTotal);
""",
    "supabase/functions/order-worker/deno.json": json.dumps({"imports": {
        "@pgflow/edge-worker": "jsr:@pgflow/edge-worker@0.14.1",
        "@pgflow/dsl": "npm:@pgflow/dsl@0.8.1"}}, indent=2),
}


# Time passes for pgflow's debounce of a function's pings.
DEBOUNCED = "update pgflow.worker_functions set last_invoked_at = now() - interval '1 minute'"


def migration_block(marker: str, lang: str) -> str:
    return textwrap.dedent(example("docs/pgflow.md", f"pgflow migration: {marker}", lang))


def test_a_pgflow_014_project_converted_by_the_docs_runs_fenced_under_ensure_workers(
        cluster14: Cluster, deno_env: dict[str, str], tmp_path: Path) -> None:
    project = tmp_path / "app"
    for name, text in ORIGINAL.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    (project / "supabase/migrations").mkdir()
    for m in pgflow14_migrations():
        shutil.copy(m, project / "supabase/migrations")
    # The steps, as written: 1. pgfence init.
    command = shlex.split(migration_block("init", "console").strip().removeprefix("$ "))
    assert command[:2] == ["pgfence", "init"], command
    out = subprocess.run([str(Path(sys.executable).parent / "pgfence"), *command[1:]],
                         cwd=project, capture_output=True, text=True, timeout=HUNG)
    assert out.returncode == 0, out.stdout + out.stderr
    # 2. the worker's import map names the client; 3. its index.ts serves the flow.
    deno_json = project / "supabase/functions/order-worker/deno.json"
    config = json.loads(deno_json.read_text())
    config["imports"].update(json.loads(migration_block("deno.json", "json"))["imports"])
    deno_json.write_text(json.dumps(config, indent=2))
    (project / "supabase/functions/order-worker/index.ts").write_text(
        migration_block("index.ts", "ts"))
    # 4. the database: pgflow's migrations (with the stand-ins for pg_net and Vault), then the
    # ones init wrote, in name order, then the step's migration.
    cluster14.drop_database(CRON_DATABASE)
    cluster14.create_database(CRON_DATABASE)
    cluster14.psql(CRON_DATABASE, "-c", "do $$ begin if not exists (select from pg_roles "
                   "where rolname = 'service_role') then create role service_role; end if; "
                   "end $$")
    install_pgflow14(cluster14, CRON_DATABASE, tmp_path)
    vendored = {m.name for m in pgflow14_migrations()}
    for m in sorted((project / "supabase/migrations").glob("*.sql")):
        if m.name not in vendored:
            cluster14.psql(CRON_DATABASE, "--single-transaction", "-f", m)
    db = Database(cluster14.dsn(CRON_DATABASE))
    try:
        db.sql(migration_block("sql", "sql"))
        db.sql("update cron.job set active = false")   # the test runs the job, as pg_cron would
        db.sql("insert into vault.decrypted_secrets values ('supabase_project_id', 'testproj'), "
               "('supabase_service_role_key', %s)", (KEY,))
        # The function, as the Edge Runtime runs it with its own deno.json (offline here: the
        # project's node_modules).
        (project / "node_modules").symlink_to(ROOT / ".tools/node_modules")
        (project / "package.json").write_text("{}")
        server = DenoServer(
            "supabase/functions/order-worker/index.ts", project,
            {**deno_env, "EDGE_WORKER_DB_URL": f"postgres://{USER}@{LOOPBACK}:{cluster14.port}/"
                                               f"{CRON_DATABASE}",
             "SUPABASE_URL": "https://testproj.supabase.co", "SUPABASE_SERVICE_ROLE_KEY": KEY,
             "SB_EXECUTION_ID": str(uuid.uuid4())},
            flags=("--config", "supabase/functions/order-worker/deno.json",
                   "--node-modules-dir=manual"))
        try:
            # pgflow's cron job, pointed at the layer: one ping, with an invocation id.
            ensure_workers = str(db.one("select command from cron.job "
                                        "where jobname = 'pgflow_ensure_workers'"))
            db.sql(ensure_workers)
            [(url, headers, body)] = db.sql("select url, headers, body from net.stand_in_calls")
            assert url == "https://testproj.supabase.co/functions/v1/order-worker"
            # What pg_net sends, through Supabase's gateway (which strips /functions/v1).
            status, said = server.post(body, "/order-worker",
                                       {"authorization": headers["Authorization"]})
            assert status == 202 and said["started"] is True, said
            assert db.one("select count(*) from pgflow.worker_functions "
                          "where function_name = 'order-worker'") == 1, "tracked"
            # The flow was compiled by the worker's start (pgflow 0.14's ensure_flow_compiled).
            run_id = db.one("select run_id from pgflow.start_flow('orderTotal', "
                            "'{\"items\": [2, 3]}')")
            db.wait_until("select status = 'completed' from pgflow.runs where run_id = %s",
                          (run_id,))
            assert db.one("select output from pgflow.runs where run_id = %s", (run_id,)) == {
                "total": 10}, "pgflow 0.14's inputs: the run's input, then the dependency's"
            assert db.sql("select count(*) from pgfence_pgflow.attempts") == [(2,)], "fenced"
            db.sql(DEBOUNCED)
            db.sql(ensure_workers)
            assert db.one("select count(*) from net.stand_in_calls") == 1, \
                "no ping while its worker is current"
            assert server.stop() == 0
        finally:
            server.kill()
        assert db.sql("select status from pgfence.lease_status") == [("released",)]
        assert db.sql("select function_name, stopped_at is not null from pgflow.workers") == [
            ("order-worker", True)]
        db.sql(DEBOUNCED)
        db.sql(ensure_workers)
        assert db.one("select count(*) from net.stand_in_calls") == 2, \
            "its worker gone, the next ping starts another"
    finally:
        db.close()
        cluster14.drop_database(CRON_DATABASE)



# -- a supervised process worker across an update window (issue 41) ----------------------------

class SupervisedProcess(FlowProcess):
    """clients/deno/testdata/pgflow_supervised_process.ts: a FlowWorker kept across leases by
    supervise() on resource fn, its code version `code` (what each of its lines says)."""

    def __init__(self, target: Target, env: dict[str, str], name: str, code: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [str(DENO), "run", *PERMISSIONS, "testdata/pgflow_supervised_process.ts"], cwd=CLIENT,
            env={**env, "DATABASE_URL": target.url, "RESOURCE": "fn", "NAME": name, "CODE": code},
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def old_worker_in_a_window(target: Target, env: dict[str, str],
                           processes: list[FlowProcess]) -> tuple[SupervisedProcess, uuid.UUID]:
    """Process `old` (code 1), supervised, holds flow two's first task when a window opens over
    its function; update_status shows it alive; it finishes the task and waits, refused."""
    db = target.db
    two_steps(db, timeout=LONG)
    old = SupervisedProcess(target, env, "old", "1")
    processes.append(old)
    assert old.said()["code"] == "1"                            # acquired
    assert old.said() == {"started": "first", "code": "1"}
    token = uuid.UUID(str(db.one("select pgfence.prepare_update(array['fn'], %s)",
                                 (uuid.uuid4(),))))
    [(verdict, draining, heartbeat, in_flight)] = db.sql(
        "select verdict, draining_leases, last_heartbeat, in_flight from "
        "pgfence.update_status(%s)", (token,))
    assert (verdict, draining, in_flight["pgflow"]) == ("draining", 1, 1), \
        "the old worker is still alive, its task in hand"
    assert heartbeat is not None
    old.unblock()
    db.wait_until("select verdict = 'drained' from pgfence.update_status(%s)", (token,))
    assert old.proc.poll() is None, "drained, and still running: refused, it waits"
    return old, token


def test_a_process_worker_replaced_inside_the_window_runs_only_the_new_code(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess]) -> None:
    db = target.db
    old, token = old_worker_in_a_window(target, deno_env, processes)
    old.proc.send_signal(signal.SIGTERM)                         # the binary replaced ...
    assert old.finish() == {"stopped": True, "code": "1"}
    new = SupervisedProcess(target, deno_env, "new", "2")       # ... inside the window
    processes.append(new)
    assert db.one("select count(*) from pgfence.leases where state = 'active'") == 0
    db.sql("select pgfence.finish_update(%s)", (token,))
    assert new.said()["code"] == "2"
    assert new.said() == {"started": "second", "code": "2"}, "only the new code runs"
    new.unblock()


def test_negative_control_a_process_worker_left_running_resumes_the_old_code(
        target: Target, deno_env: dict[str, str], processes: list[FlowProcess]) -> None:
    db = target.db
    old, token = old_worker_in_a_window(target, deno_env, processes)
    db.sql("select pgfence.finish_update(%s)", (token,))
    assert old.said()["code"] == "1", "the old binary acquired again"
    assert old.said() == {"started": "second", "code": "1"}, "and runs the old code"
    old.unblock()
