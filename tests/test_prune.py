"""pgfence.prune beside live workers, and on a schedule of real pg_cron.

- Every interleaving (testkit.permutations) of a worker completing its attempt, a takeover that
  requeues and claims it again, and prune: the invariants hold in every history, prune never
  waits for a worker nor fails, it removes exactly the old history, and every live row stays
  (the leases, the in-flight task, though it was enqueued before the bound). The negative
  control is the mutant `prune-live-tasks` (tasks chosen by their age alone).
- The pg_cron recipe of docs/operations.md, on a cluster that preloads Debian's pg_cron
  (postgresql-15-cron, scripts/setup): the job runs and the old history is gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit import install
from testkit.cluster import Cluster
from testkit.harness import Database
from testkit.permutations import Scenario, Step, count, run
from tests.support import ROOT

AGE = """
update pgfence.leases set ended_at = ended_at - interval '2 hours' where owner = 'old';
update pgfence.tasks set enqueued_at = enqueued_at - interval '2 hours',
                         finished_at = finished_at - interval '2 hours';
update pgfence.invocations set expires_at = expires_at - interval '2 hours';
update pgfence.stale_results set received_at = received_at - interval '2 hours';
"""


def old_history(db: Database) -> None:
    """An ended lease of another resource, a task finished under it with a stale result, an
    expired invocation, all two hours old."""
    db.sql("select pgfence.register('h')")
    old = db.one("select lease_id from pgfence.acquire('h', 'old', '30 s')")
    db.sql("select pgfence.enqueue('done', '{}')")
    attempt = db.one("select attempt_id from pgfence.claim(%s, 'done')", (old,))
    db.sql("select pgfence.complete(%s)", (attempt,))
    db.sql("insert into pgfence.stale_results (attempt_id, task_id, attempt, kind, report) "
           "select gen_random_uuid(), task_id, 0, 'complete', 1 from pgfence.tasks")
    db.sql("select pgfence.release(%s)", (old,))
    db.sql("select pgfence.request_start('h', '1 second')")


def setup(db: Database) -> dict[str, Any]:
    old_history(db)
    db.sql("select pgfence.register('r')")
    la = db.one("select lease_id from pgfence.acquire('r', 'a', '30 s')")
    db.sql("select pgfence.enqueue('q', '{}', 3)")
    a1 = db.one("select attempt_id from pgfence.claim(%s, 'q')", (la,))
    db.sql(AGE)  # the live task too was enqueued two hours ago
    return {"la": la, "a1": a1}


def check(db: Database, ctx: dict[str, Any]) -> list[str]:
    out = []
    if ctx["pruned"] is None:
        out.append("prune failed")
    left = db.sql("select owner from pgfence.leases where owner = 'old' union all "
                  "select queue from pgfence.tasks where queue = 'done' union all "
                  "select 'invocation' from pgfence.invocations")
    if ctx["pruned"] is not None and left:
        out.append(f"old history left: {left}")
    if db.one("select count(*) from pgfence.tasks where queue = 'q'") != 1:
        out.append("the in-flight task was pruned")
    gone = [k for k in ("la", "lb") if ctx.get(k) and not db.one(
        "select exists (select from pgfence.leases where lease_id = %s)", (ctx[k],))]
    out += [f"live lease {k} was pruned" for k in gone]
    return out


def scenario() -> Scenario:
    return Scenario(
        "prune beside a completion and a takeover",
        sessions={"a": (Step("a_begin", "begin"),
                        # Its answer committed with it, as the I5 check reads it.
                        Step("a_complete", "insert into pgfence_perm.answers select %(a1)s, "
                             "'complete', pgfence.complete(%(a1)s, "
                             "jsonb_build_object('by', %(a1)s::text))"),
                        Step("a_commit", "commit")),
                  "b": (Step("b_takeover", "select pgfence_perm.takeover(%(la)s, %(a1)s, 'b')",
                             "lb"),
                        Step("b_requeue", "select pgfence.requeue_expired()"),
                        Step("b_claim", "insert into pgfence_perm.claimed select %(lb)s, "
                             "c.task_id, c.attempt, c.attempt_id, statement_timestamp() "
                             "from pgfence.claim(%(lb)s, 'q') c returning attempt_id", "a2")),
                  "p": (Step("p_prune", "select sum(rows) from pgfence.prune('1 hour')",
                             "pruned"),)},
        setup=setup, presents={"a": "la", "b": "lb"}, check=check)


def test_prune_every_interleaving(db: Database) -> None:
    s = scenario()
    report = run(db, s)
    print(report)
    assert report.permutations + report.invalid + report.skipped == count(
        {k: len(v) for k, v in s.sessions.items()})
    assert report.permutations >= (100 if report.cover == "all" else 1)
    assert not report.violations, report.violations[:3]


def test_negative_control_prune_by_age_alone_removes_a_live_task(db: Database) -> None:
    db.install_mutant("prune-live-tasks")
    report = run(db, scenario())
    assert any("the in-flight task was pruned" in v for _, found in report.violations
               for v in found)


# ---- the pg_cron recipe ------------------------------------------------------------------

RECIPE = (ROOT / "docs/operations.md").read_text().split(
    "<!-- pg_cron recipe: tests/test_prune.py runs this block as written -->\n```sql\n",
    1)[1].split("```", 1)[0]


@pytest.fixture(scope="module")
def cron_cluster(cluster: Cluster) -> Iterator[tuple[Cluster, str]]:
    """A cluster of its own that preloads pg_cron, its jobs run in database `cron`."""
    pkglibdir = Path(cluster.psql("postgres", "-Atc", "select setting from pg_config "
                                  "where name = 'PKGLIBDIR'").strip())
    if not (pkglibdir / "pg_cron.so").exists():
        pytest.skip(f"pg_cron is not installed for this PostgreSQL ({pkglibdir}); "
                    "Debian's postgresql-15-cron has it for 15")
    c = Cluster.start(["fsync=off", "shared_preload_libraries=pg_cron",
                       "cron.database_name=cron", "cron.use_background_workers=on",
                       "max_worker_processes=20"])
    try:
        c.create_database("cron")
        install.core(c, "cron")
        yield c, "cron"
    finally:
        c.remove()


@pytest.fixture(scope="module")
def cron_ran(cron_cluster: tuple[Cluster, str]) -> Iterator[tuple[Database, dict[str, Any]]]:
    """The recipe's job on a database with week-old history, and a job that fails, both run
    by pg_cron and waited for together: pg_cron 1.4 (Debian's) runs jobs on the minute only,
    so each wait costs up to a minute (the module is one xdist group: one wait per run)."""
    c, name = cron_cluster
    db = Database(c.dsn(name))
    try:
        old_history(db)
        db.sql(AGE.replace("where owner = 'old'", ""))
        db.sql("update pgfence.tasks set finished_at = finished_at - interval '7 days', "
               "enqueued_at = enqueued_at - interval '7 days'")
        db.sql("update pgfence.leases set ended_at = ended_at - interval '7 days'")
        db.sql("update pgfence.invocations set expires_at = expires_at - interval '7 days'")
        db.sql("update pgfence.stale_results set received_at = received_at - interval '7 days'")
        db.sql(RECIPE)
        job = db.one("select jobid from cron.job where jobname = 'pgfence-prune'")
        # The recipe's schedule is hourly; the test runs the same job every minute.
        db.sql("select cron.alter_job(%s, schedule => '* * * * *')", (job,))
        broken = db.one("select cron.schedule('broken', '* * * * *', "
                        "'select pgfence.prune(''1 minute'')')")
        jobs = {"recipe": job, "broken": broken}
        # Ends at the next minute's runs; bounded for a hung pg_cron only (the wait_until
        # default), not 150 s, which a late tick on a loaded machine could outlast.
        db.wait_until("select count(distinct jobid) = 2 from cron.job_run_details "
                      "where jobid in (%s, %s) and status in ('succeeded', 'failed')",
                      (job, broken))
        db.sql("select cron.unschedule(%s)", (broken,))
        firsts = {what: db.sql("select status, return_message from cron.job_run_details "
                               "where jobid = %s order by runid limit 1", (jobid,))[0]
                  for what, jobid in jobs.items()}
        yield db, firsts
    finally:
        db.close()


def test_the_pg_cron_recipe_prunes_on_schedule(cron_ran: tuple[Database, dict[str, Any]]) -> None:
    db, firsts = cron_ran
    status, message = firsts["recipe"]
    assert status == "succeeded", message
    assert db.sql("select count(*) from pgfence.tasks union all "
                  "select count(*) from pgfence.leases union all "
                  "select count(*) from pgfence.invocations") == [(0,), (0,), (0,)]


def test_negative_control_the_recipes_job_is_real(
        cron_ran: tuple[Database, dict[str, Any]]) -> None:
    """A job whose command fails is seen failed: the recipe's "succeeded" could be otherwise."""
    db, firsts = cron_ran
    assert db.one("select count(*) from cron.job where command like '%%pgfence.prune%%'") >= 1
    assert firsts["broken"][0] == "failed"
