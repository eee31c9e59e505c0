"""Backups with live state: a database holding the core and both layers (pgmq, pgflow) with live
leases, claimed tasks, a started pgflow step, a read pgmq message, an open update window, a
protected table and a superseded attempt survives pg_dump / pg_restore into a new database with
every guarantee intact: health() healthy, the grants and every layer's lockdown as they were,
the guards firing, the live lease renewing and fencing, results keeping their verdicts (a late
result of the current attempt accepted, a superseded attempt's stale). The copy is also a fork
of ownership: the same lease is current in both databases until the copy's leases are retired
(docs/operations.md, "Backups, restores and major upgrades"), which the last test does.

tests/test_major_upgrade.py carries the same state through pg_upgrade (PostgreSQL 15 to 16, 17,
18) with these checks.
"""

from __future__ import annotations

import re
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgfence.connection import connect
from testkit import install
from testkit.cluster import Cluster
from testkit.conformance import finish_live_work, live_work
from testkit.harness import Database
from tests.support import HUNG, ROOT
from tests.test_upgrade import Databases, Live, check_live_state, make_live_state, one

# pg_cron's table as much as health reads of it: PostgreSQL 16-18 here have no pg_cron.
CRON = """
create schema cron;
create table cron.job (jobid bigserial primary key, jobname text, command text not null,
                       database text not null default current_database(),
                       username text not null default current_user, active boolean default true);
insert into cron.job (command) values ('select pgfence.requeue_expired()');
"""

# Every privilege on every object of pgfence's schemas, as aclexplode reads it (a default ACL
# as its explicit form: pg_dump leaves out an ACL equal to the default, so a sequence whose
# PUBLIC grant lockdown revoked is restored with none), what lockdown and the grants of a
# release leave, to be found the same after a copy. The owner's own are left out: it may do
# anything, and each server version names that differently (MAINTAIN from 17 on).
ACLS = """
with objects(kind, name, acl, owner) as (
  select 'schema', n.nspname, n.nspacl, n.nspowner from pg_namespace n
   where n.nspname like 'pgfence%'
  union all
  select 'function', p.oid::regprocedure::text, p.proacl, p.proowner from pg_proc p
   where p.pronamespace::regnamespace::text like 'pgfence%'
  union all
  select case c.relkind when 'S' then 'sequence' else 'relation' end, c.oid::regclass::text,
         c.relacl, c.relowner from pg_class c
   where c.relnamespace::regnamespace::text like 'pgfence%'
  union all
  select 'column', format('%s.%s', c.oid::regclass, a.attname), a.attacl, c.relowner
    from pg_attribute a join pg_class c on c.oid = a.attrelid
   where c.relnamespace::regnamespace::text like 'pgfence%' and a.attnum > 0
     and a.attacl is not null
  union all
  select 'type', t.oid::regtype::text, t.typacl, t.typowner from pg_type t
   where t.typnamespace::regnamespace::text like 'pgfence%')
select o.kind, o.name, case when a.grantee = 0 then 'PUBLIC' else a.grantee::regrole::text end,
       a.privilege_type
  from objects o cross join lateral aclexplode(coalesce(o.acl, acldefault(
         case o.kind when 'schema' then 'n' when 'function' then 'f' when 'type' then 'T'
                     when 'column' then 'c' when 'sequence' then 's' else 'r' end::"char",
         o.owner))) a
 where a.grantee <> o.owner
 order by 1, 2, 3, 4
"""

# Checks that read the cluster, not the database: "roles confined" reads every login role of
# the cluster, which other tests running on a shared one create (tests/test_health.py).
CLUSTER_WIDE = {"roles confined to this database"}


def doc_block(marker: str) -> str:
    """The SQL block of docs/operations.md after ``<!-- MARKER: ... -->``, as printed."""
    text = (ROOT / "docs/operations.md").read_text()
    match = re.search(rf"<!-- {re.escape(marker)}:[^>]*-->\s*```sql\n(.*?)```", text, flags=re.S)
    assert match, f"docs/operations.md has no block marked {marker!r}"
    return textwrap.dedent(match.group(1))


@dataclass
class State:
    live: Live                  # the core's (tests/test_upgrade.py)
    layers: dict[str, uuid.UUID]  # work in flight in every layer (a read pgmq message, a
    #                               started pgflow task): its attempt, by layer
    late: uuid.UUID             # an attempt whose task was requeued and claimed again: stale
    later: uuid.UUID            # the attempt that holds it now: its result is accepted
    acls: list[tuple[object, ...]]


def make_state(dbs: Databases, name: str) -> State:
    """The core and both layers installed in ``name``, with live state in all three."""
    install.install(dbs.cluster, name, ["all"])
    with connect(dbs.dsn(name), "state") as conn:
        conn.execute(CRON)
    live = make_live_state(dbs, name)
    db = Database(dbs.dsn(name))
    try:
        layers = live_work(db, live.current)
    finally:
        db.close()
    with connect(dbs.dsn(name), "state") as conn:
        conn.execute("select pgfence.enqueue('late', '{}')")
        late = one(conn, "select attempt_id from pgfence.claim(%s, 'late', 1, '1 hour')",
                   live.current)
        # Its visibility runs out (moved, as pgfence_test.expire_attempt does); requeued and
        # claimed again, by a later attempt.
        conn.execute("update pgfence.tasks set visible_until = clock_timestamp() "
                     "- interval '1 ms' where queue = 'late'")
        assert one(conn, "select pgfence.requeue_expired()") == 1
        later = one(conn, "select attempt_id from pgfence.claim(%s, 'late', 1, '1 hour')",
                    live.current)
        acls = conn.execute(ACLS).fetchall()
    return State(live, layers, late, later, acls)  # type: ignore[arg-type]


def health(dbs: Databases, name: str) -> dict[str, tuple[bool, str]]:
    with connect(dbs.dsn(name), "health") as conn:
        return {c: (ok, detail) for c, ok, detail in
                conn.execute("select * from pgfence.health()").fetchall()}


# The checks a copy may fail only because time passed while it was made.
TIMED = ("no lease or task overdue", "no start pending too long")


def failing(checks: dict[str, tuple[bool, str]], *but: str) -> dict[str, str]:
    return {c: d for c, (ok, d) in checks.items() if not ok and c not in but}


def check_copy(dbs: Databases, name: str, state: State, but: set[str]) -> None:
    """Every guarantee in the copy ``name`` (``but`` the health checks it cannot judge)."""
    # As restored, before anything is done in it: the schema is its release's, the grants and
    # every layer's lockdown are as they were, the guards and jobs are in place. (The live
    # state's expired lease may be overdue by now, and its pending start pending too long, if
    # restoring took over a minute: TIMED, judged by the clock, not by the copy.)
    assert failing(health(dbs, name), *but, *TIMED) == {}
    with connect(dbs.dsn(name), "acls") as conn:
        assert conn.execute(ACLS).fetchall() == state.acls
        # Late results keep their verdicts: the superseded attempt's is stale, the current one's
        # accepted, once.
        assert one(conn, "select pgfence.complete(%s, '{}')", state.late) == "stale"
        assert one(conn, "select pgfence.complete(%s, '{}')", state.later) == "accepted"
        assert one(conn, "select pgfence.complete(%s, '{}')", state.later) == "duplicate"
    # The layers' work started before the copy finishes after it, under the same lease; the
    # live lease renews and fences, the guard refuses an unfenced write, generations go on.
    db = Database(dbs.dsn(name))
    try:
        finish_live_work(db, state.live.current, state.layers)
    finally:
        db.close()
    check_live_state(dbs, name, state.live)
    assert failing(health(dbs, name), *but) == {}


@pytest.fixture
def dbs(cluster: Cluster) -> Iterator[Databases]:
    made = Databases(cluster)
    yield made
    for name in made.made:
        cluster.drop_database(name)


def dump_and_restore(dbs: Databases, source: str, tmp_path: Path, *flags: str) -> str:
    """pg_dump (custom format) of ``source``, pg_restore (with ``flags``) into a new empty
    database."""
    copy, dump = dbs.fresh("copy"), tmp_path / "source.dump"
    env = dbs.cluster.env()
    subprocess.run([dbs.cluster.tool("pg_dump"), "-Fc", "-f", str(dump), "-d", source],
                   check=True, env=env, timeout=HUNG)
    subprocess.run([dbs.cluster.tool("pg_restore"), "--exit-on-error", "--single-transaction",
                    *flags, "-d", copy, str(dump)], check=True, env=env, timeout=HUNG)
    return copy


def test_a_restored_copy_keeps_every_guarantee(dbs: Databases, tmp_path: Path) -> None:
    source = dbs.fresh("source")
    state = make_state(dbs, source)
    before = health(dbs, source)
    assert failing(before, *CLUSTER_WIDE) == {}
    copy = dump_and_restore(dbs, source, tmp_path)
    # A copy under another name: its requeue job still runs in the source database (pg_cron's
    # cron.job.database came with the data), and health says so; pointed at the copy, it
    # passes (docs/operations.md).
    bad = failing(health(dbs, copy), *CLUSTER_WIDE, *TIMED)
    assert list(bad) == ["requeue job scheduled"], bad
    assert f"it runs in database {source}, not {copy}" in bad["requeue job scheduled"]
    dbs.psql(copy, "-c", "update cron.job set database = current_database()")
    check_copy(dbs, copy, state, CLUSTER_WIDE)


def test_negative_control_a_restore_without_its_grants_is_caught(dbs: Databases,
                                                                  tmp_path: Path) -> None:
    """pg_restore --no-acl: every function executable by PUBLIC again (a NULL ACL is the
    default one), the roles' grants gone: lockdown undone."""
    source = dbs.fresh("source")
    state = make_state(dbs, source)
    copy = dump_and_restore(dbs, source, tmp_path, "--no-acl")
    with connect(dbs.dsn(copy), "acls") as conn:
        acls = conn.execute(ACLS).fetchall()
    assert ("function", "pgfence.fence(uuid)", "PUBLIC", "EXECUTE") in acls
    assert ("function", "pgfence.fence(uuid)", "pgfence_worker", "EXECUTE") not in acls
    with pytest.raises(AssertionError):
        check_copy(dbs, copy, state, CLUSTER_WIDE)


def test_a_restored_copy_is_a_fork_until_its_leases_are_retired(dbs: Databases,
                                                                tmp_path: Path) -> None:
    source = dbs.fresh("source")
    state = make_state(dbs, source)
    copy = dump_and_restore(dbs, source, tmp_path)
    lease = state.live.current

    def fences(name: str) -> bool:
        with connect(dbs.dsn(name), "fork") as conn:
            try:
                one(conn, "select pgfence.fence(%s)", lease)
            except psycopg.Error as e:
                assert e.sqlstate == "PF001", e
                return False
            return True

    # The fork: one lease, current in two databases; its holder could write to either.
    assert fences(source) and fences(copy)
    # Retired in the copy (docs/operations.md): every active lease drained by the operator.
    with connect(dbs.dsn(copy), "retire") as conn:
        conn.execute("set role pgfence_operator")
        conn.execute(doc_block("retire a restored copy's leases"))
        conn.execute("reset role")
        # Nothing of the source's leases authorizes anything there any more; a new owner gets
        # a generation that neither database has granted.
        assert one(conn, "select count(*) from pgfence.lease_status where status = 'current'") == 0
        max_generation = one(conn, "select max(generation) from pgfence.leases")
        taken = one(conn, "select generation from pgfence.acquire('cur', 'new', '1 hour')")
        assert taken > max_generation  # type: ignore[operator]
    assert fences(source) and not fences(copy)
