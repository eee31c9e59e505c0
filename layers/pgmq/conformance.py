"""The pgmq layer's driver for the layer conformance suite (tests/test_layer_conformance.py,
testkit.conformance): work in flight is a message read under the lease, finished by archiving
it; a newer attempt is a read of the same message after its visibility ran out."""

from __future__ import annotations

import uuid

from testkit.conformance import Call
from testkit.harness import Database, Session

QUEUE = "conformance_mq"


class Pgmq:
    calls = (
        Call("pgfence_pgmq.read(uuid,text,interval,integer)",
             f"select * from pgfence_pgmq.read('{{lease}}', '{QUEUE}', '1 hour')", locks=True),
        Call("pgfence_pgmq.finish(uuid[],text)",
             "select * from pgfence_pgmq.finish(array['{attempt}']::uuid[], 'archive')",
             locks=True),
        Call("pgfence_pgmq.archive(uuid)", "select pgfence_pgmq.archive('{attempt}')",
             locks=True),
        Call("pgfence_pgmq.archive_many(uuid[])",
             "select * from pgfence_pgmq.archive_many(array['{attempt}']::uuid[])",
             locks=True),
        Call("pgfence_pgmq.delete(uuid)", "select pgfence_pgmq.delete('{attempt}')",
             locks=True),
        Call("pgfence_pgmq.delete_many(uuid[])",
             "select * from pgfence_pgmq.delete_many(array['{attempt}']::uuid[])",
             locks=True),
        Call("pgfence_pgmq.set_vt(uuid,interval)",
             "select pgfence_pgmq.set_vt('{attempt}', '1 hour')", locks=True),
    )
    capabilities = ("select attempt_id::text from pgfence_pgmq.attempts union all "
                    "select attempt_id::text from pgfence_pgmq.stale_results")
    grant_checks = ("pgmq-allowed-unchecked", "pgmq-allowed-any-privilege",
                    "invoker-is-session-user")

    def prepare(self, db: Database, resource: str) -> None:
        db.sql("select pgmq.create(%s)", (QUEUE,))
        for n in range(10):  # one each for every call the suite tries in one database
            db.sql("select pgmq.send(%s, %s::jsonb)", (QUEUE, f'{{"n": {n}}}'))
        db.sql("select pgfence.register(%s)", (resource,))

    def start(self, s: Session, lease_id: uuid.UUID) -> uuid.UUID:
        # The first message visible: after the attempts started before it.
        return uuid.UUID(str(s.one("select attempt_id from pgfence_pgmq.read(%s, %s, '1 hour', 1)",
                                   (lease_id, QUEUE))))

    def finish(self, s: Session, attempt_id: uuid.UUID) -> str:
        return str(s.one("select pgfence_pgmq.archive(%s)", (attempt_id,)))

    def supersede(self, db: Database, attempt_id: uuid.UUID) -> None:
        # Its message visible again, and read by a successor: the lowest visible message, as
        # the suite supersedes its latest start.
        msg, resource = db.sql("select a.msg_id, l.resource from pgfence_pgmq.attempts a "
                               "join pgfence.leases l using (lease_id) where a.attempt_id = %s",
                               (attempt_id,))[0]
        db.sql("select pgfence_test.expire_message(%s, %s)", (QUEUE, msg))
        successor = db.session(f"successor-{uuid.uuid4().hex[:8]}")
        lease = successor.acquire(resource)
        assert lease is not None
        [(again,)] = successor.run("select msg_id from pgfence_pgmq.read(%s, %s, '1 hour', 1)",
                                   (lease.lease_id, QUEUE))
        assert again == msg, "the successor read another message"

    def grant(self, db: Database, role: str) -> None:
        db.sql(f"grant usage on schema pgmq to {role}")
        db.sql(f"grant select, update, delete on pgmq.q_{QUEUE} to {role}")
        db.sql(f"grant insert on pgmq.a_{QUEUE} to {role}")

    def withhold(self, db: Database, role: str) -> None:
        db.sql(f"revoke delete on pgmq.q_{QUEUE} from {role}")   # archive deletes the message


DRIVER = Pgmq()
