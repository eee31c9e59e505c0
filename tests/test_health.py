"""pgfence.health(): every check passes on a healthy installation and each one fails, alone,
naming what is wrong, when that one thing is broken. The healthy database is each check's
negative control. `pgfence doctor`, which prints these checks, is tests/test_doctor.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import psycopg
import pytest

from pgfence.connection import connect
from testkit.harness import Database, sqlstate

# pg_cron's table as much as health reads of it (the real one: tests/test_prune.py's cluster).
CRON = """
create schema cron;
create table cron.job (jobid bigserial primary key, jobname text, command text not null,
                       database text not null default current_database(),
                       username text not null default current_user, active boolean default true);
insert into cron.job (jobname, command)
values ('pgfence-requeue', 'select pgfence.requeue_expired()');
"""


def healthy(db: Database) -> None:
    # Roles are the cluster's: another test's login worker would fail "roles confined".
    for (role,) in db.sql("select rolname from pg_roles where rolname like 'pgfence_health_w_%'"):
        db.sql(f"drop role {role}")
    db.sql(CRON)
    db.sql("select pgfence.register('r')")
    db.sql("create table guarded (id int)")
    db.sql("select pgfence.protect('guarded', 'r')")
    db.sql("select pgfence.acquire('r', 'w', '1 hour')")


def checks(db: Database) -> dict[str, tuple[bool, str]]:
    return {c: (ok, detail) for c, ok, detail in db.sql('select * from pgfence.health()')}


def failing(db: Database) -> dict[str, str]:
    return {c: detail for c, (ok, detail) in checks(db).items() if not ok}


def login_worker(db: Database) -> None:
    name = f"pgfence_health_w_{uuid.uuid4().hex[:8]}"
    db.sql(f"create role {name} login")
    db.sql(f"grant pgfence_worker to {name}")


BREAKS: dict[str, tuple[Callable[[Database], object], str]] = {
    "schema matches its release": (
        lambda db: db.sql("create or replace function pgfence.version() returns text "
                          "language sql as $$ select '0.2.0' $$"),
        "function pgfence.version() changed"),
    "roles and grants": (
        lambda db: db.sql("grant execute on function pgfence.fence(uuid) to public"),
        "PUBLIC may EXECUTE function pgfence.fence(uuid)"),
    "roles confined to this database": (login_worker, "may connect to database postgres"),
    "protections guard every write": (
        lambda db: db.sql("drop trigger pgfence_guard on guarded"),
        "guarded: the guard trigger is missing"),
    "requeue job scheduled": (
        lambda db: db.sql("update cron.job set active = false"),
        "paused (active is false)"),
    "no lease or task overdue": (
        lambda db: db.sql("update pgfence.leases set expires_at = now() - interval '2 minutes'"),
        "resource r: its lease (generation"),
    "no start pending too long": (
        lambda db: (db.sql("select pgfence.register('r2')"),
                    db.sql("select pgfence.request_start('r2', '1 hour')"),
                    db.sql("update pgfence.invocations "
                           "set requested_at = now() - interval '2 minutes'")),
        "resource r2: a start requested at"),
    "no update window left open": (
        lambda db: (db.sql("select pgfence.prepare_update(array['r'], gen_random_uuid())"),
                    db.sql("update pgfence.updates set prepared_at = now() - interval '2 hours'")),
        "window over r open since"),
    "history within retention": (
        lambda db: (db.sql("select pgfence.release(lease_id) from pgfence.leases"),
                    db.sql("update pgfence.leases set ended_at = now() - interval '15 days'")),
        "1 ended leases older than 14 days"),
}


def test_a_healthy_installation_passes_every_check(db: Database) -> None:
    healthy(db)
    assert failing(db) == {}
    assert set(checks(db)) == set(BREAKS)


@pytest.mark.parametrize("check", list(BREAKS))
def test_each_check_fails_alone_when_its_thing_breaks(db: Database, check: str) -> None:
    healthy(db)
    breaks, named = BREAKS[check]
    breaks(db)
    bad = failing(db)
    assert list(bad) == [check], bad
    assert named in bad[check], bad[check]


def test_the_monitor_may_run_it_and_reads_no_capability(db: Database) -> None:
    healthy(db)
    lease_id = str(db.one("select lease_id from pgfence.leases"))
    db.sql("update pgfence.leases set expires_at = now() - interval '2 minutes'")
    db.sql("set role pgfence_monitor")
    rows = db.sql("select * from pgfence.health()")
    db.sql("reset role")
    assert rows and all(lease_id not in str(r) for r in rows)


# The requeue job, for real (issue 41): each way a job can look scheduled and never requeue,
# alone; the healthy job is the negative control of each.
JOB_BREAKS = {
    "paused": ("update cron.job set active = false", "paused (active is false)"),
    "another database": ("update cron.job set database = 'elsewhere'",
                         "it runs in database elsewhere, not"),
    "a role without EXECUTE": ("update cron.job set username = 'pgfence_monitor'",
                               "it runs as pgfence_monitor, which may not execute"),
    "a role that is gone": ("update cron.job set username = 'nobody_at_all'",
                            "it runs as nobody_at_all, which does not exist"),
    "a command that mentions it": (
        "update cron.job set command = 'select 1 -- pgfence.requeue_expired()'",
        "is not a call of pgfence.requeue_expired"),
    "another function around it": (
        "update cron.job set command = 'select pg_sleep(0) from pgfence.requeue_expired()'",
        "is not a call of pgfence.requeue_expired"),
    "none": ("delete from cron.job", "no pg_cron job calls pgfence.requeue_expired"),
}


@pytest.mark.parametrize("how", list(JOB_BREAKS))
def test_a_requeue_job_that_cannot_requeue_is_named(db: Database, how: str) -> None:
    healthy(db)
    breaks, named = JOB_BREAKS[how]
    db.sql(breaks)
    bad = failing(db)
    assert list(bad) == ["requeue job scheduled"], bad
    assert named in bad["requeue job scheduled"], bad


def test_a_requeue_job_with_its_argument_and_a_semicolon_is_real(db: Database) -> None:
    healthy(db)
    db.sql("update cron.job set command = ' SELECT pgfence.requeue_expired( 500 ) ; '")
    assert failing(db) == {}


def test_only_an_operator_keeps_a_resource_from_being_started_for_long(db: Database) -> None:
    """A worker's request_start lasts at most 5 minutes (issue 40: one that asked for a day kept
    ensure_workers from starting the function for a day); an operator may ask for longer, and
    health names a start pending past the time a start takes."""
    healthy(db)
    db.sql("select pgfence.register('r2')")
    w = db.session("w")
    w.run("set role pgfence_worker")
    assert sqlstate(lambda: w.one("select pgfence.request_start('r2', '1 day')")) == "22023"
    assert w.one("select pgfence.request_start('r2', '5 minutes')") is not None
    db.sql("select pgfence.cancel_invocations('r2')")
    op = db.session("op")
    op.run("set role pgfence_operator")
    assert op.one("select pgfence.request_start('r2', '1 day')") is not None
    assert failing(db) == {}, "pending for less than a minute yet"
    db.sql("update pgfence.invocations set requested_at = now() - interval '2 minutes' "
           "where acknowledged_at is null and expires_at > clock_timestamp()")
    assert list(failing(db)) == ["no start pending too long"]


# Drift that a hand can make, and the check that must name it (issue 39 item 7, issue 43
# item 1): the record holds view definitions, triggers, policies, owners and every ACL. Each
# case's negative control is the healthy installation (test above) and the same change undone.
DRIFTS: dict[str, tuple[str, str, str]] = {
    "a view replaced": (
        # every protection called healthy: the view's own text with one expression replaced
        "do $$ declare v text := pg_get_viewdef('pgfence.protected_tables'); begin "
        "  if v !~ '\\(problem\\.text IS NULL\\) AS healthy' then "
        "    raise 'view text not as expected: %', v; end if; "
        "  execute 'create or replace view pgfence.protected_tables as ' || "
        "    regexp_replace(v, '\\(problem\\.text IS NULL\\) AS healthy', 'true AS healthy'); "
        "end $$",
        "schema matches its release", "view pgfence.protected_tables changed"),
    "a trigger added": (
        "create function public.noop() returns trigger language plpgsql "
        "as $$ begin return new; end $$; "
        "create trigger sneaky before update on pgfence.leases for each row "
        "execute function public.noop()",
        "schema matches its release", "trigger pgfence.leases.sneaky added"),
    "a policy added": (
        "alter table pgfence.leases enable row level security; "
        "create policy everyone on pgfence.leases using (true)",
        "schema matches its release", "policy pgfence.leases.everyone added"),
    "an owner changed": (
        "do $$ begin if not exists (select from pg_roles "
        "where rolname = 'pgfence_health_owner') then "
        "create role pgfence_health_owner; end if; end $$; "
        "alter function pgfence.fence(uuid) owner to pgfence_health_owner",
        "schema matches its release", "function pgfence.fence(lease_id uuid) changed"),
    "a column granted to PUBLIC": (
        "grant select (resource, lease_id, state) on pgfence.leases to public",
        "roles and grants", "PUBLIC may SELECT column pgfence.leases.lease_id"),
    "a pgfence role granted more": (
        "grant select on pgfence.leases to pgfence_monitor",
        "roles and grants", "grants on relation pgfence.leases differ from the release's"),
    "a schema granted to PUBLIC": (
        "grant create on schema pgfence to public",
        "roles and grants", "PUBLIC may CREATE schema pgfence"),
    "a relation granted to PUBLIC": (
        "grant select on pgfence.tasks to public",
        "roles and grants", "PUBLIC may SELECT relation pgfence.tasks"),
    # A composite type of its own, which lockdown revokes too (until issue 43, only domains,
    # enums and ranges: PUBLIC kept the default USAGE of pgfence.lease).
    "a type granted to PUBLIC": (
        "grant usage on type pgfence.lease to public",
        "roles and grants", "PUBLIC may USAGE type pgfence.lease"),
}


@pytest.mark.parametrize("drift", list(DRIFTS))
def test_drift_is_named_by_its_check(db: Database, drift: str) -> None:
    healthy(db)
    change, check, named = DRIFTS[drift]
    db.sql(change)
    bad = failing(db)
    # (A new owner is named by the object's digest: the ACL as recorded leaves the owner's own
    # privileges and the grantors out, so it is unchanged.)
    assert list(bad) == [check], bad
    assert named in bad[check], bad[check]


def test_negative_control_the_same_drift_undone_is_healthy(db: Database) -> None:
    healthy(db)
    db.sql("grant select on pgfence.leases to pgfence_monitor")
    assert "roles and grants" in failing(db)
    db.sql("revoke select on pgfence.leases from pgfence_monitor")
    assert failing(db) == {}


def test_a_layers_schema_and_grants_are_checked_as_the_cores(mq: Database) -> None:
    """Each layer's schema has its own record: a monitor view made to show attempt ids is named,
    and so are PUBLIC's usage of the layer's schema and a column grant on its attempts."""
    healthy(mq)
    assert failing(mq) == {}
    mq.sql("create or replace view pgfence_pgmq.reads as select r.*, a.attempt_id "
           "from pgfence_pgmq.reads r, pgfence_pgmq.attempts a where false")
    mq.sql("grant usage on schema pgfence_pgmq to public")
    mq.sql("grant select (attempt_id, lease_id) on pgfence_pgmq.attempts to public")
    bad = failing(mq)
    assert set(bad) >= {"pgfence_pgmq: schema matches its release", "roles and grants"}, bad
    assert "view pgfence_pgmq.reads changed" in bad["pgfence_pgmq: schema matches its release"]
    for named in ("PUBLIC may USAGE schema pgfence_pgmq",
                  "PUBLIC may SELECT column pgfence_pgmq.attempts.attempt_id"):
        assert named in bad["roles and grants"], bad["roles and grants"]


# The scenario (issue 43 item 1): grants a hand added let a role with no pgfence role read
# a live lease id, with which any worker ends another's lease. health names each grant, and
# lockdown, which revokes what health names (pgfence.foreign_grants: one rule), undoes them.
EXPOSE = ["grant usage on schema pgfence to public",
          "grant select (resource, lease_id, state) on pgfence.leases to public"]
COLUMN_GRANT = "select has_column_privilege('public', 'pgfence.leases', 'lease_id', 'select')"


def stranger_reads_a_live_lease(db: Database) -> tuple[str, str, str | None]:
    """A role with no pgfence role reads the active lease's id and a second worker releases the
    first's lease with it; then lockdown runs. What health named of the grants, what the
    stranger read, and what it reads after the lockdown (None: refused)."""
    healthy(db)
    suffix = uuid.uuid4().hex[:8]
    stranger, worker = f"pgfence_health_s_{suffix}", f"pgfence_health_x_{suffix}"
    db.sql(f"create role {stranger}")
    db.sql(f"create role {worker} in role pgfence_worker")
    read = "select lease_id::text from pgfence.leases where resource = 'r' and state = 'active'"
    try:
        for grant in EXPOSE:
            db.sql(grant)
        named = failing(db).get("roles and grants", "")
        db.sql(f"set role {stranger}")
        lease_id = str(db.one(read))
        db.sql(f"set role {worker}")
        assert db.one("select pgfence.release(%s)", (lease_id,)) is True
        db.sql("reset role")
        db.sql("select pgfence.lockdown('pgfence')")
        db.sql(f"set role {stranger}")
        try:
            after: str | None = str(db.one(read))
        except psycopg.Error as e:
            assert e.sqlstate == "42501", e
            after = None
        return named, lease_id, after
    finally:
        db.sql("reset role")
        db.sql(f"drop owned by {stranger}, {worker}")
        db.sql(f"drop role {stranger}")
        db.sql(f"drop role {worker}")


def test_grants_that_expose_a_lease_are_named_and_lockdown_revokes_them(db: Database) -> None:
    named, lease_id, after = stranger_reads_a_live_lease(db)
    for grant in ("PUBLIC may USAGE schema pgfence",
                  "PUBLIC may SELECT column pgfence.leases.lease_id"):
        assert grant in named, named
    assert len(lease_id) == 36
    assert after is None and db.one(COLUMN_GRANT) is False, "lockdown revoked what health named"
    assert failing(db) == {}


def test_negative_control_a_lockdown_blind_to_columns_leaves_the_lease_readable(
        db: Database) -> None:
    db.install_mutant("foreign-grants-no-columns")
    stranger_reads_a_live_lease(db)
    assert db.one(COLUMN_GRANT) is True, "the column grant survived the lockdown"


def test_history_past_retention_is_counted_up_to_a_bound(db: Database) -> None:
    """A history no prune ever cut costs health() no more than 10,001 rows a kind to report:
    counted exactly up to 10,000, "over 10000" past that; and what it reads of the tasks is
    those rows, not the recent history beside them (the bound is a range of prune's index, not
    a filter over all of it). Read from the table's and its indexes' counts in health()'s own
    transaction."""
    healthy(db)

    def finished(n: int, age: str) -> None:
        db.sql("insert into pgfence.tasks (queue, payload, state, max_attempts, ready_at, "
               "finished_at) select 'old', '{}', 'completed', 3, now(), "
               f"now() - interval '{age}' from generate_series(1, %s)", (n,))
        db.sql("analyze pgfence.tasks")       # the statistics autovacuum keeps

    def index_reads() -> tuple[dict[str, str], int]:
        with connect(db.dsn, "health") as conn, conn.transaction():
            bad = {c: d for c, ok, d in conn.execute("select * from pgfence.health()") if not ok}
            # Rows read from pgfence.tasks by sequential scans, and entries of its indexes.
            row = conn.execute(
                "select sum(pg_stat_get_xact_tuples_returned(r)) from (select "
                "'pgfence.tasks'::regclass::oid as r union all select i.indexrelid "
                "from pg_index i where i.indrelid = 'pgfence.tasks'::regclass) x").fetchone()
        assert row is not None
        return bad, int(row[0])

    finished(5000, "1 day")                   # recent: within retention
    finished(10000, "15 days")
    bad, reads = index_reads()
    assert bad == {"history within retention": "10000 finished tasks older than 14 days: "
                   "schedule pgfence.prune() (docs/operations.md)"}
    assert reads <= 10001, reads
    finished(10000, "16 days")
    bad, reads = index_reads()
    assert bad == {"history within retention": "over 10000 finished tasks older than 14 days: "
                   "schedule pgfence.prune() (docs/operations.md)"}
    assert reads <= 10001, reads
