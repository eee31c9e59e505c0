"""The pgflow layer's driver for the layer conformance suite (tests/test_layer_conformance.py,
testkit.conformance): work in flight is a pgflow task started under the lease (a run of a
one-step flow), finished by completing it; a newer attempt is a successor's start of the same
task after its message's visibility ran out (the layer's takeover)."""

from __future__ import annotations

import uuid

from testkit.conformance import Call
from testkit.harness import Database, Session

FLOW = "conformance_flow"  # the flow, its queue, and its one step's name


class Pgflow:
    calls = (
        Call("pgfence_pgflow.start_tasks(uuid,text,text,interval,integer)",
             f"select * from pgfence_pgflow.start_tasks('{{lease}}', '{FLOW}', '{FLOW}', "
             "'1 hour', 1)", locks=True),
        Call("pgfence_pgflow.finish(uuid,text,jsonb,text)",
             "select pgfence_pgflow.finish('{attempt}', 'complete', '{{}}', null)", locks=True),
        Call("pgfence_pgflow.complete_task(uuid,jsonb)",
             "select pgfence_pgflow.complete_task('{attempt}', '{{}}')", locks=True),
        Call("pgfence_pgflow.fail_task(uuid,text)",
             "select pgfence_pgflow.fail_task('{attempt}', 'boom')", locks=True),
        Call("pgfence_pgflow.complete_many(uuid[],jsonb[])",
             "select * from pgfence_pgflow.complete_many(array['{attempt}']::uuid[], "
             "array['{{}}']::jsonb[])", locks=True),
        Call("pgfence_pgflow.fail_many(uuid[],text[])",
             "select * from pgfence_pgflow.fail_many(array['{attempt}']::uuid[], array['boom'])",
             locks=True),
        Call("pgfence_pgflow.finish_many(uuid[],text,jsonb[],text[])",
             "select * from pgfence_pgflow.finish_many(array['{attempt}']::uuid[], 'complete', "
             "null, null)", locks=True),
        Call("pgfence_pgflow.set_vt(uuid,interval)",
             "select pgfence_pgflow.set_vt('{attempt}', '1 hour')", locks=True),
        Call("pgfence_pgflow.mark_worker_stopped(uuid)",
             "select pgfence_pgflow.mark_worker_stopped('{lease}')", locks=True, ended=True),
    )
    capabilities = ("select attempt_id::text from pgfence_pgflow.attempts union all "
                    "select pgmq_attempt_id::text from pgfence_pgflow.attempts union all "
                    "select attempt_id::text from pgfence_pgflow.stale_results")
    grant_checks = ("pgflow-allowed-unchecked", "invoker-is-session-user")

    def prepare(self, db: Database, resource: str) -> None:
        db.sql("select pgflow.create_flow(%s, max_attempts => 3)", (FLOW,))
        db.sql("select pgflow.add_step(%s, %s)", (FLOW, FLOW))
        for n in range(10):  # one each for every call the suite tries in one database
            db.sql("select pgflow.start_flow(%s, %s::jsonb)", (FLOW, f'{{"n": {n}}}'))
        db.sql("select pgfence.register(%s)", (resource,))

    def start(self, s: Session, lease_id: uuid.UUID) -> uuid.UUID:
        return uuid.UUID(str(s.one("select attempt_id from pgfence_pgflow.start_tasks(%s, %s, %s, "
                                   "'1 hour', 1)", (lease_id, FLOW, FLOW))))

    def finish(self, s: Session, attempt_id: uuid.UUID) -> str:
        return str(s.one("select pgfence_pgflow.complete_task(%s, '{}')", (attempt_id,)))

    def supersede(self, db: Database, attempt_id: uuid.UUID) -> None:
        # Its task stalled (its step's timeout passed, its message visible again: the takeover
        # rule of 0.3.0), and a successor's start takes the task over: the lowest visible
        # message, as the suite supersedes its latest start.
        msg, resource = db.sql("select a.msg_id, l.resource from pgfence_pgflow.attempts a "
                               "join pgfence.leases l using (lease_id) where a.attempt_id = %s",
                               (attempt_id,))[0]
        db.sql("select pgfence_test.stall_task(%s, %s)", (FLOW, msg))
        successor = db.session(f"successor-{uuid.uuid4().hex[:8]}")
        lease = successor.acquire(resource)
        assert lease is not None
        [(again,)] = successor.run("select msg_id from pgfence_pgflow.start_tasks(%s, %s, %s, "
                                   "'1 hour', 1)", (lease.lease_id, FLOW, FLOW))
        assert again == msg, "the successor started another task"

    def grant(self, db: Database, role: str) -> None:
        # pgflow's schema, its tables and functions (PUBLIC may execute them), the flow's queue.
        db.sql(f"grant usage on schema pgflow, pgmq to {role}")
        db.sql(f"grant select, insert, update on all tables in schema pgflow to {role}")
        db.sql(f"grant execute on all functions in schema pgflow to {role}")
        db.sql(f"grant select, update, delete on pgmq.q_{FLOW} to {role}")
        db.sql(f"grant insert on pgmq.a_{FLOW} to {role}")

    def withhold(self, db: Database, role: str) -> None:
        db.sql("revoke execute on function pgflow.complete_task(uuid, text, int, jsonb) "
               f"from public, {role}")


DRIVER = Pgflow()
