"""pgfence.health(): every check passes on a healthy installation and each one fails, alone,
naming what is wrong, when that one thing is broken. The healthy database is each check's
negative control. `pgfence doctor`, which prints these checks, is tests/test_doctor.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from testkit.harness import Database

# pg_cron's table as much as health reads of it (the real one: tests/test_prune.py's cluster).
CRON = """
create schema cron;
create table cron.job (jobid bigserial primary key, command text not null,
                       active boolean default true);
insert into cron.job (command) values ('select pgfence.requeue_expired()');
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
        "PUBLIC may EXECUTE pgfence.fence(uuid)"),
    "roles confined to this database": (login_worker, "may connect to database postgres"),
    "protections guard every write": (
        lambda db: db.sql("drop trigger pgfence_guard on guarded"),
        "guarded: the guard trigger is missing"),
    "requeue job scheduled": (
        lambda db: db.sql("update cron.job set active = false"),
        "no active pg_cron job runs pgfence.requeue_expired()"),
    "no lease or task overdue": (
        lambda db: db.sql("update pgfence.leases set expires_at = now() - interval '2 minutes'"),
        "resource r: its lease (generation"),
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
