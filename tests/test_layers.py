"""The optional layers held to the core's rules (issue 24), on the real pgmq and pgflow:

- no capability readable: every column of every table and view of every pgfence schema that
  pgfence_monitor or pgfence_operator can read, found by walking the catalog, is read as that
  role, and no live or stale lease id or attempt id appears in it; they see references
  (pgfence.capability_ref) that still correlate rows;
- the third party's grants hold: a worker role that pgmq or pgflow would not let read, archive,
  delete, set the visibility of or start something cannot do it through the layer either;
- update windows count every layer's work: update_status is draining while a pgmq message or
  a pgflow task started under the resource's leases is in flight, counts each kind, and lists
  the unfenced writes seen since the window opened.

Each with a negative control that breaks the mechanism and sees the test fail.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from testkit.harness import Database, Session, sqlstate
from tests.support import acquired

READ = "pgfence_pgmq.read(uuid,text,interval,integer)"


def flow_and_queue(db: Database) -> None:
    """Flow `two` (first -> second) with one run started; queue `jobs` with three messages;
    resource `fn` for the flow's workers, `r1` for the queue's."""
    db.sql("select pgflow.create_flow('two', max_attempts => 3)")
    db.sql("select pgflow.add_step('two', 'first')")
    db.sql("select pgflow.add_step('two', 'second', array['first'])")
    db.sql("select pgflow.start_flow('two', '{\"n\": 1}')")
    db.sql("select pgmq.create('jobs')")
    for n in range(3):
        db.sql("select pgmq.send('jobs', %s::jsonb)", (f'{{"n": {n}}}',))
    for r in ("fn", "r1", "core"):
        db.sql("select pgfence.register(%s)", (r,))


def read(s: Session, lease_id: uuid.UUID, queue: str = "jobs") -> list[tuple[Any, ...]]:
    return s.run("select attempt_id, msg_id from pgfence_pgmq.read(%s, %s, '30 seconds', 1)",
                 (lease_id, queue))


def start(s: Session, lease_id: uuid.UUID) -> list[tuple[Any, ...]]:
    return s.run("select attempt_id, step_slug from pgfence_pgflow.start_tasks(%s, 'two', 'two', "
                 "'30 seconds', 5)", (lease_id,))


# -- no capability readable --------------------------------------------------------------------

def live_state(db: Database) -> set[str]:
    """Leases, tasks, reads and starts of every kind, current and stale: the capabilities."""
    flow_and_queue(db)
    w = db.session("w")
    # The core: a claimed task, and one whose first attempt went stale with a result kept.
    core = acquired(w.acquire("core"))
    db.sql("select pgfence.enqueue('q', '{}')")
    db.sql("select pgfence.enqueue('q', '{}')")
    [first] = w.run("select attempt_id from pgfence.claim(%s, 'q', 1, '1 second')",
                    (core.lease_id,))
    db.expire_attempt(first[0])
    db.sql("select pgfence.requeue_expired()")
    w.run("select attempt_id from pgfence.claim(%s, 'q', 2, '30 seconds')", (core.lease_id,))
    assert w.one("select pgfence.complete(%s, '{}')", (first[0],)) == "stale"
    # pgmq: a read that went stale (recorded), and a live one.
    mq_old = acquired(w.acquire("r1"))
    [(stale_read, msg)] = read(w, mq_old.lease_id)
    db.expire(mq_old)
    db.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    mq = acquired(w.acquire("r1"))
    read(w, mq.lease_id)
    assert w.one("select pgfence_pgmq.delete(%s)", (stale_read,)) == "stale"
    # pgflow: a start, completed, and a stale report of a superseded one.
    fl = acquired(w.acquire("fn"))
    [(attempt, _)] = start(w, fl.lease_id)
    db.sql("update pgflow.step_tasks set attempts_count = attempts_count + 1 where step_slug = "
           "'first'")
    assert w.one("select pgfence_pgflow.complete_task(%s, '{}')", (attempt,)) == "stale"
    capabilities = {str(v) for (v,) in db.sql(
        "select lease_id from pgfence.leases union all "
        "select attempt_id from pgfence.stale_results union all "
        "select attempt_id from pgfence_pgmq.attempts union all "
        "select attempt_id from pgfence_pgflow.attempts union all "
        "select pgmq_attempt_id from pgfence_pgflow.attempts")}
    capabilities |= {str(v) for (v,) in db.sql(
        "select pgfence.attempt_uuid(t.task_id, t.attempt, t.lease_id, k.hmac_key) "
        "from pgfence.tasks t, pgfence.signing_key k where t.state = 'claimed'")}
    assert len(capabilities) >= 8
    return capabilities


def readable(db: Database, role: str) -> list[tuple[str, str]]:
    """(relation, column) of every column of a pgfence schema that role can SELECT."""
    return [(str(r), str(c)) for r, c in db.sql("""
      select c.oid::regclass::text, a.attname
        from pg_class c
        join pg_namespace n on n.oid = c.relnamespace
        join pg_attribute a on a.attrelid = c.oid and a.attnum > 0 and not a.attisdropped
       where (n.nspname = 'pgfence' or n.nspname like 'pgfence\\_%%')
         and n.nspname <> 'pgfence_test'
         and c.relkind in ('r', 'v', 'm', 'p', 'f')
         and has_column_privilege(%s, c.oid, a.attnum, 'select')
       order by 1, 2""", (role,))]


def capabilities_seen(db: Database, capabilities: set[str]) -> list[str]:
    """What monitor and operator can read of the capabilities: "role: relation.column" of each."""
    hits = []
    s = db.session("reader")
    for role in ("pgfence_monitor", "pgfence_operator"):
        columns = readable(db, role)
        assert columns, f"{role} reads nothing: the walk would prove nothing"
        s.run(f"set role {role}")
        for rel, col in columns:
            values = s.run(f'select "{col}"::text from {rel}')
            if any(v is not None and any(c in v for c in capabilities) for (v,) in values):
                hits.append(f"{role}: {rel}.{col}")
        s.run("reset role")
    return hits


def test_monitor_and_operator_read_no_capability_anywhere(flow: Database) -> None:
    capabilities = live_state(flow)
    assert capabilities_seen(flow, capabilities) == []
    # They see references instead, which correlate: the read behind a pgflow start, the
    # lease of both, and the stale attempt of each layer.
    assert flow.one("""select count(*) from pgfence_pgflow.starts s
                        join pgfence_pgmq.reads r
                          on r.attempt_ref = s.read_ref and r.lease_ref = s.lease_ref""") == 1
    assert flow.one("select count(*) from pgfence_pgflow.stale t join pgfence_pgflow.starts s "
                    "using (attempt_ref)") == 1
    assert flow.one("select count(distinct lease_ref) from pgfence_pgmq.reads") == 3  # r1 twice, fn


@pytest.mark.parametrize("grant", ["pgfence_pgmq.attempts", "pgfence_pgflow.attempts",
                                   "pgfence.stale_results", "pgfence_pgmq.stale_results"])
def test_negative_control_a_capability_granted_is_found(flow: Database, grant: str) -> None:
    capabilities = live_state(flow)
    flow.sql(f"grant select on {grant} to pgfence_monitor")
    hits = capabilities_seen(flow, capabilities)
    assert any(hit.startswith(f"pgfence_monitor: {grant}.") for hit in hits)


# -- the third party's grants hold -------------------------------------------------------------

@pytest.fixture
def worker_role(flow: Database) -> Iterator[str]:
    """A role with pgfence_worker and nothing of pgmq's or pgflow's."""
    role = f"w_{uuid.uuid4().hex[:10]}"
    flow.sql(f"create role {role} in role pgfence_worker")
    yield role
    flow.sql(f"drop owned by {role}")
    flow.sql(f"drop role {role}")


def as_role(db: Database, role: str) -> Session:
    s = db.session(role)
    s.run(f"set role {role}")
    return s


def test_a_worker_does_through_the_layer_only_what_pgmq_and_pgflow_let_it(flow: Database,
                                                                          worker_role: str) -> None:
    flow_and_queue(flow)
    w = as_role(flow, worker_role)
    mq, fl = acquired(w.acquire("r1")), acquired(w.acquire("fn"))
    assert sqlstate(lambda: read(w, mq.lease_id)) == "42501", "no pgmq privilege: no read"
    assert sqlstate(lambda: start(w, fl.lease_id)) == "42501", "no pgflow privilege: no start"
    assert flow.one("select sum(read_ct) from pgmq.q_jobs") == 0
    # What pgmq itself needs to read: the read works, and so does set_vt.
    flow.sql(f"grant usage on schema pgmq to {worker_role}")
    flow.sql(f"grant select, update on pgmq.q_jobs to {worker_role}")
    [(attempt, _)] = read(w, mq.lease_id)
    assert w.one("select pgfence_pgmq.set_vt(%s, '1 minute') is not null", (attempt,)) is True
    assert sqlstate(lambda: w.one("select pgfence_pgmq.delete(%s)", (attempt,))) == "42501"
    flow.sql(f"grant delete on pgmq.q_jobs to {worker_role}")
    assert sqlstate(lambda: w.one("select pgfence_pgmq.archive(%s)", (attempt,))) == "42501", \
        "archive needs the archive table too"
    assert sqlstate(lambda: w.run("select * from pgfence_pgmq.archive_many(array[%s]::uuid[])",
                                  (attempt,))) == "42501"
    flow.sql(f"grant insert on pgmq.a_jobs to {worker_role}")
    assert w.one("select pgfence_pgmq.archive(%s)", (attempt,)) == "accepted"
    # pgflow: its schema, its functions (PUBLIC may execute them), its tables, the flow's queue.
    flow.sql(f"grant usage on schema pgflow to {worker_role}")
    flow.sql(f"grant select, insert, update on all tables in schema pgflow to {worker_role}")
    flow.sql(f"grant select, update, delete on pgmq.q_two to {worker_role}")
    flow.sql(f"grant insert on pgmq.a_two to {worker_role}")
    [(task, _)] = start(w, fl.lease_id)
    flow.sql(f"revoke execute on function pgflow.complete_task(uuid, text, int, jsonb) from "
             f"public, {worker_role}")
    complete = "select pgfence_pgflow.complete_task(%s, '{}')"
    assert sqlstate(lambda: w.one(complete, (task,))) == "42501"
    flow.sql(f"grant execute on function pgflow.complete_task(uuid, text, int, jsonb) to "
             f"{worker_role}")
    assert w.one("select pgfence_pgflow.complete_task(%s, '{}')", (task,)) == "accepted"


def test_the_role_checked_is_the_one_set_not_the_session_user(flow: Database,
                                                              worker_role: str) -> None:
    # As PostgREST and Supabase run requests: a privileged session user, SET ROLE to the
    # request's role. The layer acts for the role set.
    flow_and_queue(flow)
    s = flow.session("pooled")
    assert s.one("select pgfence.invoker()") == "postgres"
    s.run(f"set role {worker_role}")
    lease = acquired(s.acquire("r1"))
    assert sqlstate(lambda: read(s, lease.lease_id)) == "42501"


def test_negative_control_without_the_check_the_layer_widens_pgmqs_grants(flow: Database,
                                                                          worker_role: str) -> None:
    flow.install_mutant("pgmq-allowed-unchecked")
    flow_and_queue(flow)
    w = as_role(flow, worker_role)
    lease = acquired(w.acquire("r1"))
    [(attempt, _)] = read(w, lease.lease_id)
    assert w.one("select pgfence_pgmq.delete(%s)", (attempt,)) == "accepted", \
        "a role without any pgmq privilege deleted a message"


# -- update windows count every layer's work ---------------------------------------------------

def window(db: Database, resource: str) -> uuid.UUID:
    return uuid.UUID(str(db.session("op").one("select pgfence.prepare_update(array[%s], %s)",
                                               (resource, uuid.uuid4()))))


def status(db: Database, token: uuid.UUID) -> tuple[str, dict[str, int], list[dict[str, Any]]]:
    [(verdict, in_flight, writes)] = db.sql(
        "select verdict, in_flight, unfenced_writes from pgfence.update_status(%s)", (token,))
    return verdict, in_flight, writes


def test_a_pgmq_message_in_flight_keeps_the_window_draining(any_flow: Database) -> None:
    flow_and_queue(any_flow)
    w = any_flow.session("w")
    lease = acquired(w.acquire("r1"))
    [(attempt, _)] = read(w, lease.lease_id)
    w.release(lease)  # the worker is gone, its message still hidden: its handler may run
    token = window(any_flow, "r1")
    assert status(any_flow, token)[:2] == ("draining", {"tasks": 0, "pgmq": 1})
    assert w.one("select pgfence_pgmq.archive(%s)", (attempt,)) == "accepted"
    assert status(any_flow, token)[:2] == ("drained", {"tasks": 0})


def test_a_pgmq_message_visible_again_is_no_longer_in_flight(flow: Database) -> None:
    flow_and_queue(flow)
    w = flow.session("w")
    lease = acquired(w.acquire("r1"))
    [(_, msg)] = read(w, lease.lease_id)
    w.release(lease)
    token = window(flow, "r1")
    flow.sql("select pgfence_test.expire_message('jobs', %s)", (msg,))
    assert status(flow, token)[:2] == ("drained", {"tasks": 0})


def test_a_pgflow_task_in_flight_keeps_the_window_draining(any_flow: Database) -> None:
    flow_and_queue(any_flow)
    w = any_flow.session("w")
    lease = acquired(w.acquire("fn"))
    [(attempt, _)] = start(w, lease.lease_id)
    w.release(lease)
    token = window(any_flow, "fn")
    assert status(any_flow, token)[:2] == ("draining", {"tasks": 0, "pgmq": 1, "pgflow": 1})
    assert w.one("select pgfence_pgflow.complete_task(%s, '{}')", (attempt,)) == "accepted"
    assert status(any_flow, token)[:2] == ("drained", {"tasks": 0})


@pytest.mark.parametrize("layer", ["pgfence_pgmq", "pgfence_pgflow"])
def test_negative_control_a_layer_not_registered_is_not_counted(flow: Database, layer: str) -> None:
    flow.sql("delete from pgfence.layers where schema_name = %s", (layer,))
    flow_and_queue(flow)
    w = flow.session("w")
    resource = "r1" if layer == "pgfence_pgmq" else "fn"
    lease = acquired(w.acquire(resource))
    if layer == "pgfence_pgmq":
        read(w, lease.lease_id)
    else:
        start(w, lease.lease_id)
        flow.sql("delete from pgfence.layers where schema_name = 'pgfence_pgmq'")
    w.release(lease)
    assert status(flow, window(flow, resource))[0] == "drained", "the work in flight is not seen"


def test_unfenced_writes_since_the_window_opened_are_listed(any_flow: Database) -> None:
    flow_and_queue(any_flow)
    any_flow.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'observe', consumers_only "
                 "=> true)")
    old = any_flow.session("old-binary")
    old.run("select * from pgmq.read('jobs', 30, 1)")  # before the window: not this window's
    token = window(any_flow, "r1")
    assert status(any_flow, token)[2] == []
    old.run("select * from pgmq.read('jobs', 30, 1)")
    [verdict, _, [write]] = status(any_flow, token)
    assert (write["table"], write["operation"], write["writes"]) == ("pgmq.q_jobs", "UPDATE", 1)
    assert verdict == "drained", "an unconverted writer is named; the window waits for no write"


def test_the_layers_register_themselves(flow: Database) -> None:
    assert flow.sql("select schema_name::text, in_flight::text from pgfence.layers order by 1") == [
        ("pgfence_pgflow", "pgfence_pgflow.in_flight(text[])"),
        ("pgfence_pgmq", "pgfence_pgmq.in_flight(text[])")]


def test_a_hostile_or_unknown_queue_name_is_refused(flow: Database) -> None:
    flow_and_queue(flow)
    w = flow.session("w")
    lease = acquired(w.acquire("r1"))
    for name in ("jobs; drop table pgmq.q_jobs", "jobs'--", "x$y", "nosuch", "q" * 48):
        with pytest.raises(psycopg.Error) as e:
            read(w, lease.lease_id, name)
        assert e.value.sqlstate == "22023", name
    flow.sql("select pgmq.create('Queue-Hyphened_2')")
    flow.sql("select pgmq.send('Queue-Hyphened_2', '{}')")
    [(attempt, _)] = read(w, lease.lease_id, "Queue-Hyphened_2")
    assert w.one("select pgfence_pgmq.delete(%s)", (attempt,)) == "accepted"


# -- each layer's prune and health, registered for pgfence.prune / pgfence.health -----------------

def prune_setup(db: Database) -> tuple[Session, uuid.UUID]:
    """Two reads, one archived long ago; returns the session and the open read's attempt."""
    flow_and_queue(db)
    w = db.session("w")
    lease = acquired(w.acquire("r1"))
    [(done, _)] = read(w, lease.lease_id)
    [(open_read, _)] = read(w, lease.lease_id)
    assert w.one("select pgfence_pgmq.archive(%s)", (done,)) == "accepted"
    db.sql("update pgfence_pgmq.attempts set read_at = read_at - interval '2 days', "
           "finished_at = finished_at - interval '2 days'")
    return w, open_read


def test_prune_drops_old_finished_reads_never_an_open_one(flow: Database) -> None:
    w, open_read = prune_setup(flow)
    assert flow.sql("select * from pgfence_pgmq.prune('1 day')") == [
        ("pgfence_pgmq.stale_results", 0), ("pgfence_pgmq.attempts", 1)]
    assert w.one("select pgfence_pgmq.archive(%s)", (open_read,)) == "accepted"
    assert flow.sql("select schema_name::text, prune::text, health::text from pgfence.layers "
                    "order by 1") == [
        ("pgfence_pgflow", "pgfence_pgflow.prune(interval)", "pgfence_pgflow.health()"),
        ("pgfence_pgmq", "pgfence_pgmq.prune(interval)", "pgfence_pgmq.health()")]


def test_negative_control_a_prune_blind_to_outcomes_loses_an_open_read(flow: Database) -> None:
    flow.install_mutant("pgmq-prune-open-reads")
    w, open_read = prune_setup(flow)
    flow.sql("select * from pgfence_pgmq.prune('1 day')")
    assert sqlstate(lambda: w.one("select pgfence_pgmq.archive(%s)", (open_read,))) == "22023"


@pytest.mark.parametrize("layer", ["pgfence_pgmq", "pgfence_pgflow"])
def test_health_sees_a_privilege_handed_out(flow: Database, layer: str) -> None:
    assert flow.one(f"select bool_and(ok) from {layer}.health()") is True
    flow.sql(f"grant execute on all functions in schema {layer} to public")
    health = f"select ok, detail from {layer}.health() where \"check\" like '%%locked down'"
    assert flow.sql(health) == [(False, "privileges held by public")]


def test_the_cores_prune_and_health_include_every_registered_layer(flow: Database) -> None:
    """pgfence.prune() and pgfence.health() loop over pgfence.layers: the core names no
    layer, yet runs each one's own prune and checks."""
    prune_setup(flow)
    pruned = dict(flow.sql("select * from pgfence.prune('1 hour')"))
    assert pruned["pgfence_pgmq.attempts"] == 1 and "pgfence_pgmq.stale_results" in pruned
    checks = [c for (c,) in flow.sql('select "check" from pgfence.health()')]
    assert any(c.startswith("pgmq layer:") for c in checks), checks
    assert any("pgflow" in c for c in checks), checks


def late_read_after_prune(db: Database) -> tuple[Session, uuid.UUID]:
    """A read under a lease that was superseded long ago, its message still hidden as read
    (a long handler, its visibility extended), the queue protected; then pgfence.prune."""
    flow_and_queue(db)
    db.sql("select pgfence.protect('pgmq.q_jobs', array['r1'], 'enforce', consumers_only => true)")
    w = db.session("w")
    old = acquired(w.acquire("r1"))
    [(late, _)] = w.run("select attempt_id, msg_id from pgfence_pgmq.read(%s, 'jobs', "
                        "'1 hour', 1)", (old.lease_id,))
    db.expire(old)
    acquired(db.session("successor").acquire("r1"))
    db.sql("update pgfence.leases set ended_at = ended_at - interval '2 days' "
           "where lease_id = %s", (old.lease_id,))
    pruned = dict(db.sql("select * from pgfence.prune('1 day')"))
    assert "leases" in pruned
    return w, late


def test_prune_keeps_the_lease_an_open_layer_read_names(flow: Database) -> None:
    """The core's prune keeps each lease a layer's unfinished work names (pgfence.layers
    .leases): the late, still valid result is accepted, its write into the protected queue
    shown its lease's resource."""
    w, late = late_read_after_prune(flow)
    assert flow.one("select count(*) from pgfence.leases where state = 'superseded'") == 1
    assert w.one("select pgfence_pgmq.archive(%s)", (late,)) == "accepted"
    assert flow.sql("select schema_name::text, leases::text from pgfence.layers order by 1") == [
        ("pgfence_pgflow", "pgfence_pgflow.leases()"), ("pgfence_pgmq", "pgfence_pgmq.leases()")]


def test_negative_control_a_prune_blind_to_the_layers_leases_refuses_a_valid_late_result(
        flow: Database) -> None:
    flow.install_mutant("prune-ignores-layer-leases")
    w, late = late_read_after_prune(flow)
    assert flow.one("select count(*) from pgfence.leases where state = 'superseded'") == 0
    # The guard sees no lease behind the write: refused as unfenced.
    assert sqlstate(lambda: w.one("select pgfence_pgmq.archive(%s)", (late,))) == "PF007"


def test_negative_control_a_layer_missing_from_the_registry_is_not_pruned(flow: Database) -> None:
    prune_setup(flow)
    flow.sql("delete from pgfence.layers where schema_name = 'pgfence_pgmq'")
    pruned = dict(flow.sql("select * from pgfence.prune('1 hour')"))
    assert "pgfence_pgmq.attempts" not in pruned
    assert flow.one("select count(*) from pgfence_pgmq.attempts where outcome is not null") == 1
