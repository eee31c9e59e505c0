"""pgflow 0.14.1 (its published migrations, tests/pgflow14.py) on a cluster with the real
pg_cron and test-only stand-ins for pg_net and Vault: pgflow's own worker registration works
here as it does on Supabase, so that the pgflow layer's integration with it can be tested.

Skipped, saying why, where ../shared/vendor/pgflow-core-0.14.1 or pg_cron is absent. Only what
0.14.1 alone has is here; the layer's protocol, its requeue_stalled_tasks and its worker rows
are tested on 0.8.1 and 0.14.1 alike in tests/test_pgflow*.py (the fixture pgflow_version).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit import install
from testkit.cluster import Cluster
from testkit.harness import Database, sqlstate
from tests.pgflow14 import CRON_DATABASE, install_pgflow14
from tests.support import ROOT, acquired
from tests.test_pgflow import complete, run_status, two_steps
from tests.test_pgflow_runs import shift_message, start

PROJECT = "testproj"
URL = f"https://{PROJECT}.supabase.co/functions/v1/my-fn"


@pytest.fixture
def flow14(cluster14: Cluster, tmp_path: Path) -> Iterator[Database]:
    """A fresh cron database with pgflow 0.14.1, its cron jobs as its migrations scheduled
    them, and the Vault secrets ensure_workers() reads."""
    cluster14.drop_database(CRON_DATABASE)
    cluster14.create_database(CRON_DATABASE)
    install_pgflow14(cluster14, CRON_DATABASE, tmp_path)
    db = Database(cluster14.dsn(CRON_DATABASE))
    db.sql("insert into vault.decrypted_secrets values ('supabase_project_id', %s), "
           "('pgflow_auth_secret', 's3cret')", (PROJECT,))
    try:
        yield db
    finally:
        db.close()
        cluster14.drop_database(CRON_DATABASE)


def pings(db: Database) -> list[tuple[str, str]]:
    return [(url, auth) for url, auth in db.sql(
        "select url, headers->>'Authorization' from net.stand_in_calls order by id")]


def run_job(db: Database, name: str) -> None:
    """What pg_cron's scheduler runs for job ``name``: its command, as it is scheduled."""
    db.sql(str(db.one("select command from cron.job where jobname = %s", (name,))))


def test_pgflow_014_registers_and_pings_its_workers_through_pg_cron(flow14: Database) -> None:
    db = flow14
    assert db.one("select extversion from pg_extension where extname = 'pg_cron'")
    assert {name: command for name, command in db.sql(
        "select jobname, command from cron.job where active")} == {
        "pgflow_cleanup_logs": "select pgflow.cleanup_ensure_workers_logs()",
        "pgflow_ensure_workers": "select pgflow.ensure_workers()",
        "pgflow_requeue_stalled_tasks": "select pgflow.requeue_stalled_tasks()"}
    db.sql("update cron.job set active = false")  # the test runs the jobs, step by step
    # A worker registers its function on startup; the ensure-workers job pings a function
    # with no live worker through pg_net, with the secret from Vault.
    db.sql("select pgflow.track_worker_function('my-fn')")
    run_job(db, "pgflow_ensure_workers")
    assert pings(db) == [(URL, "Bearer s3cret")]
    # Debounce: pinged within the last 6 s, not again.
    run_job(db, "pgflow_ensure_workers")
    assert len(pings(db)) == 1
    db.sql("update pgflow.worker_functions set last_invoked_at = now() - interval '1 minute'")
    assert db.sql("select function_name, invoked from pgflow.ensure_workers()") == [
        ("my-fn", True)]
    # A live worker (a recent heartbeat) keeps its function from being pinged ...
    worker = db.one("insert into pgflow.workers (worker_id, queue_name, function_name) "
                    "values (gen_random_uuid(), 'q', 'my-fn') returning worker_id")
    db.sql("update pgflow.worker_functions set last_invoked_at = now() - interval '1 minute'")
    assert db.sql("select function_name from pgflow.ensure_workers()") == []
    # ... until it says it stopped (pgflow's own call, on the worker's beforeunload).
    db.sql("select pgflow.mark_worker_stopped(%s)", (worker,))
    assert db.sql("select function_name from pgflow.ensure_workers()") == [("my-fn",)]
    # A disabled function is never pinged.
    db.sql("update pgflow.worker_functions set enabled = false, "
           "last_invoked_at = now() - interval '1 minute'")
    assert db.sql("select function_name from pgflow.ensure_workers()") == []
    assert len(pings(db)) == 3
    run_job(db, "pgflow_requeue_stalled_tasks")   # pgflow's own maintenance runs here too
    run_job(db, "pgflow_cleanup_logs")


# -- the pgflow layer on pgflow 0.14.1 --------------------------------------------------------

@pytest.fixture
def fenced14(flow14: Database, cluster14: Cluster) -> Database:
    """flow14 with pgfence, its pgmq and pgflow layers and the test helpers installed after
    pgflow 0.14.1, the cron jobs pointed at the layer (pgfence_pgflow.setup_cron), and paused:
    the tests run the jobs' commands themselves."""
    install.install(cluster14, CRON_DATABASE, ["pgflow"], with_prerequisites=False,
                    with_helpers=True)
    assert [o for _, o, _ in flow14.sql("select * from pgfence_pgflow.setup_cron()")] == \
        ["pointed", "pointed"]
    flow14.sql("update cron.job set active = false")
    return flow14


def test_the_layer_fences_pgflow_014s_protocol(fenced14: Database) -> None:
    db = fenced14
    run_id = two_steps(db)
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("fn"))
    [(attempt, step)] = start(a, la)
    assert step == "first"
    # Hidden for the step's timeout + 2 s, counted from the read in the same statement (from a
    # later one, however slow the machine was in between came off it).
    assert db.one("select vt - last_read_at > interval '61 seconds' from pgmq.q_two") is True
    db.expire(la)
    lb = acquired(b.acquire("fn"))
    assert sqlstate(lambda: start(a, la)) == "PF001"
    shift_message(db, "two", 63)
    [(fresh, _)] = start(b, lb)
    assert complete(a, attempt, '{"by": "a"}') == "stale"
    assert complete(b, fresh, '{"by": "b"}') == "accepted"
    [(second, _)] = start(b, lb)
    assert complete(b, second, '{"by": "b"}') == "accepted"
    assert run_status(db, run_id)[0] == "completed"


def function_with_worker(db: Database) -> None:
    db.sql("select pgfence.register('my-fn')")
    db.sql("select pgflow.track_worker_function('my-fn')")


def enabled(db: Database) -> tuple[bool, bool]:
    """(pgfence's resource, pgflow's worker function)."""
    row = db.sql("select r.enabled, wf.enabled from pgfence.resources r "
                 "join pgflow.worker_functions wf on wf.function_name = r.resource "
                 "where r.resource = 'my-fn'")
    return bool(row[0][0]), bool(row[0][1])


def test_worker_functions_follow_resources_through_an_update_window(fenced14: Database) -> None:
    db = fenced14
    function_with_worker(db)
    assert enabled(db) == (True, True)
    token = db.one("select pgfence.prepare_update(array['my-fn'], gen_random_uuid())")
    assert enabled(db) == (False, False), "the window disables the function too"
    db.sql("select pgflow.track_worker_function('my-fn')")            # a worker starts
    db.sql("update pgflow.worker_functions set enabled = true")       # or someone by hand
    assert enabled(db) == (False, False), "nothing enables it past pgfence (I6)"
    db.sql("update pgflow.worker_functions set last_invoked_at = null")
    assert db.sql("select * from pgfence_pgflow.ensure_workers()") == []
    assert db.sql("select * from pgfence.finish_update(%s)", (token,)) == [
        ("my-fn", True, "restored")]
    assert enabled(db) == (True, True), "restored exactly"
    db.sql("select pgfence.set_enabled('my-fn', false)")
    assert enabled(db) == (False, False), "the operator's set_enabled reaches pgflow"
    token = db.one("select pgfence.prepare_update(array['my-fn'], gen_random_uuid())")
    db.sql("select pgfence.finish_update(%s)", (token,))
    assert enabled(db) == (False, False), "a function disabled before the window stays so"
    # A function pgflow knows first, registered as a disabled resource: paused there too.
    db.sql("select pgflow.track_worker_function('later')")
    db.sql("select pgfence.register('later', false)")
    assert db.one("select enabled from pgflow.worker_functions where function_name = 'later'") \
        is False, "register's new resource reaches pgflow"


def test_negative_control_without_following_the_window_leaves_the_function_pinged(
        fenced14: Database) -> None:
    db = fenced14
    db.sql("update pgfence.layers set enabled_changed = null where schema_name = 'pgfence_pgflow'")
    function_with_worker(db)
    db.one("select pgfence.prepare_update(array['my-fn'], gen_random_uuid())")
    assert enabled(db) == (False, True)
    db.sql("select * from pgflow.ensure_workers()")
    assert len(pings(db)) == 1, "pgflow pings the function in the middle of the window"


def invocations_sent(db: Database) -> list[str]:
    return [str(i) for (i,) in db.sql("select body->>'invocation_id' from net.stand_in_calls "
                                      "order by id")]


def due(db: Database) -> None:
    """The function's debounce has passed."""
    db.sql("update pgflow.worker_functions set last_invoked_at = now() - interval '1 minute'")


def test_ensure_workers_starts_a_function_only_through_the_handshake(fenced14: Database) -> None:
    db = fenced14
    function_with_worker(db)
    run_job(db, "pgflow_ensure_workers")                              # the cron job, repointed
    [sent] = invocations_sent(db)
    assert pings(db) == [(URL, "Bearer s3cret")]
    assert db.one("select count(*) from pgfence.invocations where invocation_id = %s "
                  "and acknowledged_at is null", (sent,)) == 1, "a pending invocation"
    due(db)
    run_job(db, "pgflow_ensure_workers")
    assert len(pings(db)) == 1, "not again while the invocation is pending"
    # The function acquires with the id it was sent (the handshake) and works ...
    w = db.session("edge")
    lease = acquired(w.acquire("my-fn", invocation_id=uuid.UUID(sent)))
    due(db)
    run_job(db, "pgflow_ensure_workers")
    assert len(pings(db)) == 1, "not while its lease is current"
    # ... until it releases: then a fresh request, with a new id.
    w.release(lease)
    due(db)
    run_job(db, "pgflow_ensure_workers")
    assert len(invocations_sent(db)) == 2 and invocations_sent(db)[1] != sent


def test_negative_control_pgflows_own_ensure_workers_pings_without_an_invocation(
        fenced14: Database) -> None:
    db = fenced14
    function_with_worker(db)
    w = db.session("edge")
    acquired(w.acquire("my-fn"))                                      # a worker is current
    db.sql("select * from pgflow.ensure_workers()")
    assert invocations_sent(db) == ["None"], "pinged, with no invocation, while one is current"


def test_workers_of_ended_leases_are_deprecated_or_stopped(fenced14: Database) -> None:
    db = fenced14
    two_steps(db)
    db.sql("select pgflow.start_flow('two', '{}')")
    db.sql("select pgflow.track_worker_function('fn')")
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("fn", owner="a"))
    start(a, la, qty=1)
    db.expire(la)
    lb = acquired(b.acquire("fn", owner="b"))                         # a superseded
    start(b, lb, qty=1)
    b.release(lb)
    db.sql("select pgfence_pgflow.sync_workers()")
    assert db.sql("select deprecated_at is not null, stopped_at is not null from pgflow.workers "
                  "order by started_at") == [(True, False), (False, True)]
    # pgflow sees no live worker: the next ensure asks for a start.
    due(db)
    assert [f for f, _, _ in db.sql("select * from pgfence_pgflow.ensure_workers()")] == ["fn"]


# -- update windows over worker functions, converted or not (issue 41) -------------------------

FUNCTIONS = {"plain-on": True, "plain-off": False, "fenced": True, "fenced-off": False}


def mixture(db: Database) -> None:
    """Four worker functions: two whose workers are pgflow's own (not pgfence resources), one
    enabled, one disabled; two pgfence resources, likewise."""
    for fn, on in FUNCTIONS.items():
        if fn.startswith("fenced"):
            db.sql("select pgfence.register(%s, %s)", (fn, on))
        db.sql("select pgflow.track_worker_function(%s)", (fn,))
        db.sql("update pgflow.worker_functions set enabled = %s where function_name = %s", (on, fn))
    # A worker is live while its heartbeat is this recent (pgflow's own test): long enough for
    # any machine to run a test in, so that only the test makes one silent.
    db.sql("update pgflow.worker_functions set debounce = interval '10 minutes'")


def enabled_of(db: Database) -> dict[str, bool]:
    return {str(f): bool(e) for f, e in db.sql("select function_name, enabled "
                                               "from pgflow.worker_functions")}


def own_worker(db: Database, fn: str, heartbeat: str = "0 seconds",
               deprecated: str | None = None) -> uuid.UUID:
    """A row of pgflow's own worker (pgflow.workers) for function fn."""
    return uuid.UUID(str(db.one(
        "insert into pgflow.workers (worker_id, queue_name, function_name, last_heartbeat_at, "
        "deprecated_at) values (gen_random_uuid(), 'q', %s, now() - %s::interval, "
        "now() - %s::interval) returning worker_id", (fn, heartbeat, deprecated))))


def prepare(db: Database, names: list[str], request: uuid.UUID | None = None) -> uuid.UUID:
    return uuid.UUID(str(db.one("select pgfence.prepare_update(%s, %s)",
                                (names, request or uuid.uuid4()))))


def statuses(db: Database, token: uuid.UUID) -> dict[str, tuple[Any, ...]]:
    return {str(r[0]): tuple(r[1:]) for r in db.sql(
        "select resource, saved_enabled, enabled, verdict, workers from pgfence.update_status(%s)",
        (token,))}


def test_a_window_over_converted_and_unconverted_functions_restores_exactly(
        fenced14: Database) -> None:
    db = fenced14
    mixture(db)
    before = enabled_of(db)
    live = own_worker(db, "plain-on")
    old = own_worker(db, "plain-on", heartbeat="2 hours", deprecated="1 hour")
    old_mark = db.one("select deprecated_at from pgflow.workers where worker_id = %s", (old,))
    request = uuid.uuid4()
    token = prepare(db, list(FUNCTIONS), request)
    assert enabled_of(db) == {fn: False for fn in FUNCTIONS}, "every function paused"
    # A lost response: the retry finds the window, the saved values untouched.
    assert prepare(db, list(FUNCTIONS), request) == token
    # pgflow's cooperative drain: the live worker deprecated; the older mark kept.
    marks = dict(db.sql("select worker_id, deprecated_at from pgflow.workers"))
    assert marks[live] is not None and marks[old] == old_mark
    # Nothing enables itself: a worker registering, or the row made again.
    db.sql("select pgflow.track_worker_function('plain-on')")
    db.sql("delete from pgflow.worker_functions where function_name = 'plain-off'")
    db.sql("select pgflow.track_worker_function('plain-off')")
    assert enabled_of(db) == {fn: False for fn in FUNCTIONS}
    # An overlapping window is refused, naming the open one.
    assert sqlstate(lambda: prepare(db, ["plain-on"])) == "PF004"
    status = statuses(db, token)
    assert {fn: s[:2] for fn, s in status.items()} == {
        fn: (on, False) for fn, on in FUNCTIONS.items()}
    assert status["plain-on"][2] == "draining", "its worker's heartbeat is live"
    assert [w["worker_id"] for w in status["plain-on"][3]] == [str(live)], \
        "the live worker listed (the old one has been silent since before the window)"
    assert status["plain-off"][2] == "drained"
    got = db.sql("select resource, enabled, outcome from pgfence.finish_update(%s) order by 1",
                 (token,))
    assert got == [("fenced", True, "restored"), ("fenced-off", False, "kept_disabled"),
                   ("plain-off", False, "kept_disabled"), ("plain-on", True, "restored")]
    assert enabled_of(db) == before, "restored exactly"
    # A stale finish changes nothing.
    assert {o for _, _, o in db.sql("select * from pgfence.finish_update(%s)", (token,))} == \
        {"already_finished"}
    assert enabled_of(db) == before


def test_negative_control_a_window_that_saves_the_paused_value_never_restores(
        fenced14: Database) -> None:
    db = fenced14
    db.install_mutant("pgflow-window-saves-paused")
    mixture(db)
    token = prepare(db, list(FUNCTIONS))
    db.sql("select pgfence.finish_update(%s)", (token,))
    assert enabled_of(db)["plain-on"] is False, "the function stays paused for ever"


def test_an_operators_decision_inside_the_window_is_left_by_finish(fenced14: Database) -> None:
    db = fenced14
    mixture(db)
    token = prepare(db, list(FUNCTIONS))
    # Inside the window an operator enables one and explicitly keeps another disabled.
    db.sql("update pgflow.worker_functions set enabled = true where function_name = 'plain-off'")
    db.sql("update pgflow.worker_functions set enabled = false where function_name = 'plain-on'")
    got = dict((r, (e, o)) for r, e, o in db.sql(
        "select resource, enabled, outcome from pgfence.finish_update(%s)", (token,)))
    assert got["plain-off"] == (True, "conflict") and got["plain-on"] == (False, "conflict")


def test_negative_control_a_finish_blind_to_the_operator_undoes_the_decision(
        fenced14: Database) -> None:
    db = fenced14
    db.install_mutant("pgflow-window-blind-to-operator")
    mixture(db)
    token = prepare(db, list(FUNCTIONS))
    db.sql("update pgflow.worker_functions set enabled = false where function_name = 'plain-on'")
    db.sql("select pgfence.finish_update(%s)", (token,))
    assert enabled_of(db)["plain-on"] is True, "the operator's newer decision was undone"


def unconverted_start(db: Database) -> uuid.UUID:
    """pgflow's own worker of `plain-on` starts flow `two`'s first task: its worker id."""
    two_steps(db)
    worker = own_worker(db, "plain-on")
    [(msg,)] = db.sql("select msg_id from pgmq.read_with_poll('two', 30, 1, 1, 100)")
    db.sql("select * from pgflow.start_tasks('two', array[%s::bigint], %s)", (msg, worker))
    return worker


def test_a_silent_unconverted_worker_holding_a_task_is_unknown_then_drained(
        fenced14: Database) -> None:
    db = fenced14
    mixture(db)
    worker = unconverted_start(db)
    token = prepare(db, ["plain-on"])
    [(verdict, started)] = db.sql("select verdict, in_flight->'pgflow' from "
                                  "pgfence.update_status(%s)", (token,))
    assert (verdict, started) == ("draining", 1)
    db.sql("update pgflow.workers set last_heartbeat_at = now() - interval '1 hour' "
           "where worker_id = %s", (worker,))
    assert db.one("select verdict from pgfence.update_status(%s)", (token,)) == "unknown", \
        "no proof its handler stopped"
    db.sql("select pgflow.complete_task(run_id, step_slug, task_index, '{}') "
           "from pgflow.step_tasks where step_slug = 'first'")
    assert db.one("select verdict from pgfence.update_status(%s)", (token,)) == "drained"


def test_negative_control_a_status_blind_to_silence_says_draining(fenced14: Database) -> None:
    db = fenced14
    db.install_mutant("pgflow-window-silence-blind")
    mixture(db)
    worker = unconverted_start(db)
    token = prepare(db, ["plain-on"])
    db.sql("update pgflow.workers set last_heartbeat_at = now() - interval '1 hour' "
           "where worker_id = %s", (worker,))
    assert db.one("select verdict from pgfence.update_status(%s)", (token,)) == "draining"


def test_a_fenced_functions_workers_are_listed_too(fenced14: Database) -> None:
    db = fenced14
    two_steps(db, resources=("fenced",))
    db.sql("select pgflow.track_worker_function('fenced')")
    db.sql("update pgflow.worker_functions set debounce = interval '10 minutes'")
    w = db.session("w")
    lease = acquired(w.acquire("fenced"))
    start(w, lease, flow="two")
    token = prepare(db, ["fenced"])
    [(verdict, workers)] = db.sql("select verdict, workers from pgfence.update_status(%s)",
                                  (token,))
    assert verdict == "draining"
    assert [(x["started_tasks"], x["live"]) for x in workers] == [(1, True)], workers


# -- pgflow's cron jobs: an exact-state contract (issue 41) -------------------------------------

YEARLY = "0 0 1 1 *"   # the jobs keep their place but never run behind a test's back


def jobs(db: Database) -> dict[str, tuple[str, str, bool]]:
    """Each pg_cron job: (command, schedule, active)."""
    return {str(n): (str(c), str(s), bool(a)) for n, c, s, a in db.sql(
        "select jobname, command, schedule, active from cron.job order by jobname")}


def sqitch14(cluster: Cluster, *args: str, layer: str = "") -> subprocess.CompletedProcess[str]:
    """Sqitch on the pg_cron cluster's database (the repository's plan, or a layer's)."""
    return install.sqitch(*args, f"db:pg:{CRON_DATABASE}", layer=layer, env=cluster.env())


def deployed_by_sqitch(db: Database, cluster: Cluster, pgflow_layer_to: str = "") -> None:
    """pgfence and both layers deployed by Sqitch onto pgflow 0.14.1 (the pgflow layer to
    @pgflow_layer_to when given)."""
    sqitch14(cluster, "deploy")
    sqitch14(cluster, "deploy", layer="pgmq")
    sqitch14(cluster, "deploy", *(["--to", pgflow_layer_to] if pgflow_layer_to else []),
             layer="pgflow")


def plain_and_fenced(db: Database) -> None:
    db.sql("select pgfence.register('fenced')")
    for fn in ("fenced", "plain"):
        db.sql("select pgflow.track_worker_function(%s)", (fn,))


def test_setup_cron_its_undo_and_the_layers_revert_restore_pgflows_jobs_exactly(
        flow14: Database, cluster14: Cluster) -> None:
    db = flow14
    db.sql("update cron.job set schedule = %s", (YEARLY,))
    db.sql("update cron.job set active = false where jobname = 'pgflow_requeue_stalled_tasks'")
    before = jobs(db)
    deployed_by_sqitch(db, cluster14)
    plain_and_fenced(db)
    assert db.sql("select * from pgfence_pgflow.setup_cron()") == [
        ("pgflow_ensure_workers", "pointed", "select pgfence_pgflow.ensure_workers()"),
        ("pgflow_requeue_stalled_tasks", "pointed",
         "select pgfence_pgflow.requeue_stalled_tasks()")]
    after = jobs(db)
    assert {n: j[1:] for n, j in after.items()} == {n: j[1:] for n, j in before.items()}, \
        "schedules and active (one paused) as they were: only the commands changed"
    assert after["pgflow_cleanup_logs"] == before["pgflow_cleanup_logs"]
    assert [o for _, o, _ in db.sql("select * from pgfence_pgflow.setup_cron()")] == \
        ["already", "already"]
    # The layer's job serves both kinds of function: pgflow's own ping for the plain one, the
    # handshake for the pgfence resource.
    run_job(db, "pgflow_ensure_workers")
    assert sorted((url.rsplit("/", 1)[1], body.get("invocation_id") is not None) for url, body in
                  db.sql("select url, body from net.stand_in_calls")) == [("fenced", True),
                                                                         ("plain", False)]
    assert db.sql("select jobname, outcome from pgfence_pgflow.undo_cron()") == [
        ("pgflow_ensure_workers", "restored"), ("pgflow_requeue_stalled_tasks", "restored")]
    assert jobs(db) == before, "exactly as they were"
    # The layer's revert puts them back too, then drops the functions they called.
    db.sql("select * from pgfence_pgflow.setup_cron()")
    sqitch14(cluster14, "revert", "-y", layer="pgflow")
    assert jobs(db) == before
    assert db.one("select to_regnamespace('pgfence_pgflow') is null") is True


def test_negative_control_021s_setup_cron_leaves_jobs_calling_dropped_functions(
        flow14: Database, cluster14: Cluster) -> None:
    db = flow14
    db.sql("update cron.job set schedule = %s", (YEARLY,))
    deployed_by_sqitch(db, cluster14, "@v0.2.1")
    assert db.one("select pgfence_pgflow.setup_cron()") == \
        "2 pgflow cron jobs now call pgfence_pgflow"
    sqitch14(cluster14, "revert", "-y", layer="pgflow")
    assert jobs(db)["pgflow_ensure_workers"][0] == "select pgfence_pgflow.ensure_workers()"
    assert db.one("select to_regprocedure('pgfence_pgflow.ensure_workers()')") is None, \
        "the job calls a function that is gone: no worker is started any more"


# -- the layer's revert refuses first, while a window holds one of its functions --------------

LAYER_DEPLOYED = "select to_regprocedure('pgfence_pgflow.undo_cron()') is not null"
# The release the layer's plan seals last: what a deployed layer reports.
LAYER_HEAD = re.findall(r"(?m)^release_(\S+) ",
                        (ROOT / "layers/pgflow/sqitch.plan").read_text())[-1]


def window_over_a_plain_function(db: Database, cluster: Cluster) -> uuid.UUID:
    """The layers deployed by Sqitch, and a window over a function whose workers are pgflow's
    own (the layer's pgfence_pgflow.windows holds its saved enabled)."""
    deployed_by_sqitch(db, cluster)
    db.sql("select pgflow.track_worker_function('plain')")
    token = prepare(db, ["plain"])
    assert db.one("select count(*) from pgfence_pgflow.windows where outcome is null") == 1
    return token


def test_the_layers_revert_refuses_first_while_a_window_holds_a_function(
        flow14: Database, cluster14: Cluster) -> None:
    db = flow14
    token = window_over_a_plain_function(db, cluster14)
    with pytest.raises(subprocess.CalledProcessError) as refused:
        sqitch14(cluster14, "revert", "-y", layer="pgflow")
    said = refused.value.stdout + refused.value.stderr
    assert "would strand an open update window; nothing was reverted" in said, said
    assert "plain" in said, said
    # Nothing reverted: the release's seal and every change after pgflow_windows are there.
    assert db.one("select pgfence.installed_release('pgfence_pgflow')") == LAYER_HEAD
    assert db.one(LAYER_DEPLOYED) is True
    db.sql("select * from pgfence.finish_update(%s)", (token,))
    sqitch14(cluster14, "revert", "-y", layer="pgflow")
    assert db.one("select to_regnamespace('pgfence_pgflow') is null") is True


def test_negative_control_without_the_first_steps_check_the_revert_is_half_done(
        flow14: Database, cluster14: Cluster, tmp_path: Path) -> None:
    """The layer's project copied, its release's revert without the check: refused at
    pgflow_windows, after the changes above it were reverted (the cron record gone)."""
    db = flow14
    window_over_a_plain_function(db, cluster14)
    project = tmp_path / "pgflow"
    shutil.copytree(ROOT / "layers/pgflow", project)
    for first in (project / "revert").glob("release_*.sql"):  # each release's first step
        text = first.read_text()
        if "do $$\ndeclare" in text:
            first.write_text(text[:text.index("do $$\ndeclare")]
                             + text[text.index("do $$ begin perform"):])
    out = subprocess.run(["sqitch", "revert", "-y", f"db:pg:{CRON_DATABASE}"], cwd=project,
                         capture_output=True, text=True,
                         env={**cluster14.env(), **install.SQITCH_ENV})
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "in an open update window" in said, said
    assert db.one(LAYER_DEPLOYED) is False, "half done: the changes above pgflow_windows gone"


def test_a_missing_job_is_reported_not_made_and_stays_absent(fenced14: Database) -> None:
    db = fenced14
    assert [o for _, o, _ in db.sql("select * from pgfence_pgflow.undo_cron()")] == \
        ["restored", "restored"]
    db.sql("select cron.unschedule('pgflow_ensure_workers')")
    before = jobs(db)
    assert db.sql("select jobname, outcome from pgfence_pgflow.setup_cron()") == [
        ("pgflow_ensure_workers", "missing"), ("pgflow_requeue_stalled_tasks", "pointed")]
    assert "pgflow_ensure_workers" not in jobs(db), "nothing made"
    assert db.sql("select jobname, outcome from pgfence_pgflow.undo_cron()") == [
        ("pgflow_requeue_stalled_tasks", "restored")]
    assert jobs(db) == before


def test_undo_leaves_a_job_someone_changed_since(fenced14: Database) -> None:
    db = fenced14
    job = db.one("select jobid from cron.job where jobname = 'pgflow_requeue_stalled_tasks'")
    db.sql("select cron.alter_job(%s, command => 'select 42')", (job,))
    got = dict(db.sql("select jobname, outcome from pgfence_pgflow.undo_cron()"))
    assert got == {"pgflow_ensure_workers": "restored", "pgflow_requeue_stalled_tasks": "changed"}
    assert jobs(db)["pgflow_requeue_stalled_tasks"][0] == "select 42"


# -- health checks the layer's jobs for real (issue 41) -----------------------------------------

JOB_CHECK = "pgflow layer: ensure_workers job"


def layer_checks(db: Database) -> dict[str, tuple[bool, str]]:
    return {str(c): (bool(ok), str(d)) for c, ok, d in db.sql(
        "select * from pgfence.health() where \"check\" like 'pgflow layer:%%'")}


def cronless_role(db: Database) -> str:
    role = f"cronless_{uuid.uuid4().hex[:8]}"
    db.sql(f"create role {role}")
    return role


LAYER_JOB_BREAKS: dict[str, tuple[Any, str]] = {
    "paused": (lambda db: db.sql("update cron.job set active = false "
                                 "where jobname = 'pgflow_ensure_workers'"),
               "paused (active is false)"),
    "another database": (lambda db: db.sql("update cron.job set database = 'postgres' "
                                           "where jobname = 'pgflow_ensure_workers'"),
                         "it runs in database postgres"),
    "a role that may not": (lambda db: db.sql("update cron.job set username = %s where "
                                              "jobname = 'pgflow_ensure_workers'",
                                              (cronless_role(db),)),
                            "which may not execute pgfence_pgflow.ensure_workers"),
    "a command that mentions it": (
        lambda db: db.sql("update cron.job set command = 'select 1 -- "
                          "pgfence_pgflow.ensure_workers()' "
                          "where jobname = 'pgflow_ensure_workers'"),
        "is not a call of pgfence_pgflow.ensure_workers"),
    "missing": (lambda db: db.sql("select cron.unschedule('pgflow_ensure_workers')"),
                "no pg_cron job calls pgfence_pgflow.ensure_workers"),
    "pgflow's own still active": (
        lambda db: db.sql("select cron.schedule('own', %s, 'select pgflow.ensure_workers()')",
                          (YEARLY,)),
        "still calls pgflow.ensure_workers: run pgfence_pgflow.setup_cron()"),
}


def healthy_jobs(db: Database) -> None:
    db.sql("update cron.job set active = true, schedule = %s", (YEARLY,))


def test_the_layers_jobs_pass_their_checks(fenced14: Database) -> None:
    healthy_jobs(fenced14)
    assert {c: ok for c, (ok, _) in layer_checks(fenced14).items()} == {
        "pgflow layer: pgflow installed": True,
        "pgflow layer: ensure_workers job": True, "pgflow layer: requeue job": True}


@pytest.mark.parametrize("how", list(LAYER_JOB_BREAKS))
def test_each_way_a_layer_job_cannot_run_is_named_alone(fenced14: Database, how: str) -> None:
    healthy_jobs(fenced14)
    breaks, named = LAYER_JOB_BREAKS[how]
    breaks(fenced14)
    bad = {c: d for c, (ok, d) in layer_checks(fenced14).items() if not ok}
    assert list(bad) == [JOB_CHECK], bad
    assert named in bad[JOB_CHECK], bad


# -- a name that would steer the ping elsewhere is never pinged (issue 40) ----------------------

STEERING = "evil/../../admin"   # a valid resource name; not one segment of a URL path


def names_pinged(db: Database) -> list[str]:
    for fn in (STEERING, "good"):
        db.sql("select pgfence.register(%s)", (fn,))
        db.sql("select pgflow.track_worker_function(%s)", (fn,))
    db.sql("select pgflow.track_worker_function('plain/..')")     # pgflow's own, by pgflow's rule
    db.sql("select * from pgfence_pgflow.ensure_workers()")
    return [url.removeprefix(f"https://{PROJECT}.supabase.co/functions/v1/")
            for url, _ in pings(db)]


def test_a_name_that_is_no_url_segment_is_never_pinged(fenced14: Database) -> None:
    assert names_pinged(fenced14) == ["good"]


def test_negative_control_an_unescaped_name_steers_the_ping(fenced14: Database) -> None:
    fenced14.install_mutant("pgflow-ping-unescaped")
    assert STEERING in names_pinged(fenced14), "the ping, with its secret, went elsewhere"
