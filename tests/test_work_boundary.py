"""The work boundary under interleavings: fenced claim and completion (I2, I5), the startup
handshake, drain and deprecation, and the seed's acceptance scenarios.

Every scenario runs twice, directly and through PgBouncer in transaction pooling mode
(`any_db`), which proves that nothing relies on session state. Each invariant has a negative
control against a deliberately broken copy of the real function.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.request import Request, urlopen

import psycopg

from pgfence.connection import connect
from testkit.cluster import PgBouncer
from testkit.harness import Database, Lease, Session, sqlstate
from tests.support import acquired


def claim(s: Session, lease: Lease, queue: str = "q", qty: int = 1) -> list[tuple[int, uuid.UUID]]:
    rows = s.run("select task_id, attempt_id from pgfence.claim(%s, %s, %s)",
                 (lease.lease_id, queue, qty))
    return [(r[0], r[1]) for r in rows]


def complete(s: Session, attempt_id: uuid.UUID, result: dict[str, Any] | None = None) -> str:
    return str(s.one("select pgfence.complete(%s, %s)",
                     (attempt_id, json.dumps(result or {"by": s.name}))))


def enqueue(db: Database, n: int, queue: str = "q") -> list[int]:
    return [db.one("select pgfence.enqueue(%s, %s)", (queue, json.dumps({"n": i})))
            for i in range(n)]


# --------------------------------------------------------------------------------------------
# Paused owner A, lease expired, B admitted, A resumed


@dataclass
class Resumed:
    claim: str | None
    stale_complete: str
    stale_recorded: bool
    task_kept_by_b: bool
    late_complete: str
    renew: str | None
    drain: str | None
    release: bool
    protected_write: str | None
    b_complete: str
    b_current: bool


def resumed_owner_at_work(db: Database) -> Resumed:
    db.sql("select pgfence.register('r')")
    db.sql("create table audit (note text)")
    db.sql("grant all on audit to public")
    db.sql("select pgfence.protect('audit', 'r')")
    t1, t2, _ = enqueue(db, 3)
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("r"))
    held = dict(claim(a, la, qty=2))
    assert set(held) == {t1, t2}
    # A pauses: its lease and its hold on t2 run out; t2 goes back and B claims it.
    db.expire(la)
    db.expire_attempt(held[t2])
    assert db.one("select pgfence.requeue_expired()") == 1
    lb = acquired(b.acquire("r"))
    b_claims = dict(claim(b, lb, qty=5))
    assert t2 in b_claims
    # A resumes, unaware.
    out = Resumed(
        claim=sqlstate(lambda: a.run("select pgfence.claim(%s, 'q')", (la.lease_id,))),
        stale_complete=complete(a, held[t2]),
        stale_recorded=db.one("select count(*) from pgfence.stale_results where attempt_id = %s",
                              (held[t2],)) == 1,
        task_kept_by_b=db.one("select pgfence.attempt_uuid(task_id, attempt, lease_id) = %s "
                              "and state = 'claimed' from pgfence.tasks where task_id = %s",
                              (b_claims[t2], t2)),
        late_complete=complete(a, held[t1]),     # nobody re-claimed t1: a valid late result
        renew=sqlstate(lambda: a.run("select pgfence.renew(%s, '30 s')", (la.lease_id,))),
        drain=sqlstate(lambda: a.run("select pgfence.drain(%s)", (la.lease_id,))),
        release=a.release(la),
        protected_write=None,
        b_complete="",
        b_current=False,
    )
    a.begin()
    out.protected_write = sqlstate(lambda: a.run("select pgfence.fence(%s)", (la.lease_id,)))
    a.rollback()
    out.b_complete = complete(b, b_claims[t2])
    out.b_current = db.one("select status from pgfence.lease_status where generation = %s",
                           (lb.generation,)) == "current"
    return out


EXPECTED_RESUMED = Resumed(claim="PF001", stale_complete="stale", stale_recorded=True,
                           task_kept_by_b=True, late_complete="accepted", renew="PF001",
                           drain="PF001", release=False, protected_write="PF001",
                           b_complete="accepted", b_current=True)


def test_resumed_owner_cannot_claim_or_overwrite(any_db: Database) -> None:
    assert resumed_owner_at_work(any_db) == EXPECTED_RESUMED


def test_negative_control_claim_without_lease_check(db: Database) -> None:
    db.install_mutant("hold-current-ignores-state")
    assert resumed_owner_at_work(db).claim is None


def test_negative_control_completion_without_attempt_check(db: Database) -> None:
    db.install_mutant("report-accepts-older-attempt")
    r = resumed_owner_at_work(db)
    assert r.stale_complete == "accepted" and not r.task_kept_by_b


# --------------------------------------------------------------------------------------------
# Concurrent admission: request_start and acquire, one winner each


def racing_requests(db: Database, n: int = 6) -> list[uuid.UUID]:
    db.sql("select pgfence.register('r')")
    first, *others = [db.session(f"s{i}") for i in range(n)]
    first.begin()
    won = first.one("select pgfence.request_start('r')")
    steps = [s.start("select pgfence.request_start('r')") for s in others]
    for step in steps:
        step.settle()
    first.commit()
    return [x for x in [won, *(step.one() for step in steps)] if x is not None]


def test_racing_request_start_one_invocation(any_db: Database) -> None:
    assert len(racing_requests(any_db)) == 1
    assert any_db.one("select pending_invocations from pgfence.resource_status") == 1


def test_negative_control_request_start_without_lock(db: Database) -> None:
    db.install_mutant("request-start-no-lock")
    assert len(racing_requests(db)) > 1


def test_racing_acquire_one_winner(any_db: Database) -> None:
    any_db.sql("select pgfence.register('r')")
    first, *others = [any_db.session(f"s{i}") for i in range(6)]
    first.begin()
    lease = acquired(first.acquire("r"))
    steps = [s.start("select (pgfence.acquire('r', %s, '30 s')).lease_id", (s.name,))
             for s in others]
    # The others do not queue behind the first's open transaction: NULL at once (test_wedge.py).
    for step in steps:
        assert step.settle() is False
    first.commit()
    assert [step.one() for step in steps] == [None] * len(others)
    assert any_db.one("select owner from pgfence.resource_status") == first.name
    assert lease.generation > 0


# --------------------------------------------------------------------------------------------
# Lost renewal response: the commit happened, the client never heard; a retry is safe


def renew_with_lost_response(db: Database) -> tuple[str | None, int]:
    db.sql("select pgfence.register('r')")
    owner = db.session("owner")
    # The lease lasts the test (testkit's default): the lost renewal and the retry must find
    # it current however slow the machine (5 s had to cover a new connection and a wait).
    lease = acquired(owner.acquire("r"))
    # Send the renewal and hang up without reading the answer: the server runs and commits
    # it, and its reply goes nowhere. (Straight to the server: a pooler would drop a query
    # whose client is gone, and the point is a commit the client never heard of.)
    lost = connect(db.server_dsn, "lost")
    lost.pgconn.send_query(f"select pgfence.renew('{lease.lease_id}', '30 seconds')".encode())
    lost.pgconn.flush()
    lost.close()
    db.wait_until("select renewed_at is not null from pgfence.leases where generation = %s",
                  (lease.generation,))
    retry = sqlstate(lambda: owner.run("select pgfence.renew(%s, '30 seconds')", (lease.lease_id,)))
    current = db.one("select count(*) from pgfence.lease_status "
                     "where status = 'current' and generation = %s", (lease.generation,))
    return retry, current


def test_lost_renewal_response_then_retry(any_db: Database) -> None:
    assert renew_with_lost_response(any_db) == (None, 1)


def test_negative_control_renewal_that_rotates_the_lease(db: Database) -> None:
    # A plausible but broken design: each renewal issues a new lease_id.
    db.install_mutant("renew-rotates-lease-id")
    retry, _ = renew_with_lost_response(db)
    assert retry == "PF001"


# --------------------------------------------------------------------------------------------
# Hard death: no partial claim, the task comes back after its visibility, nothing starves


def hard_death(db: Database) -> dict[str, Any]:
    db.sql("select pgfence.register('r')")
    (task,) = enqueue(db, 1)
    a = db.session("a")
    la = acquired(a.acquire("r"))
    # A dies in the middle of a claiming transaction.
    a.begin()
    claim(a, la)
    pid = a.pid
    db.sql("select pg_terminate_backend(%s)", (pid,))
    # It returns before the backend is gone; its row locks go with it.
    db.wait_until("select not exists (select from pg_stat_activity where pid = %s)", (pid,))
    after_kill = db.one("select state from pgfence.tasks where task_id = %s", (task,))
    # A reconnects, claims for real, then dies for good holding the task.
    a2 = db.session("a2")
    ((_, attempt),) = claim(a2, la)
    a2.close()
    db.expire(la)
    db.expire_attempt(attempt)
    requeued = db.one("select pgfence.requeue_expired()")
    b = db.session("b")
    lb = acquired(b.acquire("r"))
    b_claims = claim(b, lb)
    return {"after_kill": after_kill, "requeued": requeued,
            "b_claimed": [t for t, _ in b_claims],
            "b_complete": complete(b, b_claims[0][1]) if b_claims else None}


def test_hard_death_loses_nothing(any_db: Database) -> None:
    out = hard_death(any_db)
    task = any_db.one("select task_id from pgfence.tasks")
    assert out == {"after_kill": "queued", "requeued": 1, "b_claimed": [task],
                   "b_complete": "accepted"}


def test_negative_control_requeue_that_never_fires(db: Database) -> None:
    db.install_mutant("requeue-late")
    out = hard_death(db)
    assert out["requeued"] == 0 and out["b_claimed"] == []


# --------------------------------------------------------------------------------------------
# Graceful drain, operator deprecation, disabled registration


def graceful_drain(db: Database) -> dict[str, Any]:
    db.sql("select pgfence.register('r')")
    t1, t2 = enqueue(db, 2)
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("r"))
    ((_, a1),) = claim(a, la)
    drained = a.drain(la)
    out: dict[str, Any] = {
        "drained": drained,
        "a_claim": sqlstate(lambda: a.run("select pgfence.claim(%s, 'q')", (la.lease_id,))),
        "a_renew_state": a.renew(la)[1],
    }
    lb = b.acquire("r")                          # at once: no waiting for A's expiry
    out["b_acquired"] = lb is not None
    out["b_claims"] = [t for t, _ in claim(b, lb)] if lb else []
    out["a_complete"] = complete(a, a1)          # A finishes what it held
    out["a_release"] = a.release(la)
    out["statuses"] = db.sql("select owner, status from pgfence.lease_status order by generation")
    out["tasks"] = (t1, t2)
    return out


def test_graceful_drain(any_db: Database) -> None:
    out = graceful_drain(any_db)
    _, t2 = out.pop("tasks")
    assert out == {"drained": "draining", "a_claim": "PF001", "a_renew_state": "draining",
                   "b_acquired": True, "b_claims": [t2], "a_complete": "accepted",
                   "a_release": True, "statuses": [("a", "released"), ("b", "current")]}


def test_negative_control_claim_while_draining(db: Database) -> None:
    db.install_mutant("hold-current-live")
    assert graceful_drain(db)["a_claim"] is None


def test_operator_deprecation(any_db: Database) -> None:
    any_db.sql("select pgfence.register('r')")
    enqueue(any_db, 2)
    a, b = any_db.session("a"), any_db.session("b")
    la = acquired(a.acquire("r"))
    ((_, a1),) = claim(a, la)
    assert any_db.one("select pgfence.deprecate('r')") == la.lease_id
    # A learns it at its next heartbeat and stops claiming; it still finishes its task.
    assert a.renew(la)[1] == "draining"
    assert sqlstate(lambda: a.run("select pgfence.claim(%s, 'q')", (la.lease_id,))) == "PF001"
    assert complete(a, a1) == "accepted"
    lb = acquired(b.acquire("r"))
    assert len(claim(b, lb)) == 1
    assert any_db.one("select draining_leases from pgfence.resource_status") == 1


def test_disabled_registration_starts_nothing_until_enabled(any_db: Database) -> None:
    any_db.sql("select pgfence.register('r', false)")
    w = any_db.session("w")
    assert any_db.one("select pgfence.request_start('r')") is None
    assert sqlstate(lambda: w.run("select pgfence.acquire('r', 'w', '30 s')")) == "PF003"
    any_db.sql("select pgfence.register('r')")            # registering again enables nothing
    assert sqlstate(lambda: w.run("select pgfence.acquire('r', 'w', '30 s')")) == "PF003"
    assert any_db.one("select pgfence.set_enabled('r', true)") is False
    invocation = any_db.one("select pgfence.request_start('r')")
    assert invocation is not None
    assert w.acquire("r", invocation_id=invocation) is not None
    assert any_db.one("select pending_invocations from pgfence.resource_status") == 0


# --------------------------------------------------------------------------------------------
# Two resources serving one queue: intentional replicas claim in parallel


def parallel_replicas(db: Database) -> tuple[bool, set[int], set[int]]:
    for r in ("worker", "worker-b"):
        db.sql("select pgfence.register(%s)", (r,))
    enqueue(db, 10)
    a, b = db.session("a"), db.session("b")
    la, lb = acquired(a.acquire("worker")), acquired(b.acquire("worker-b"))
    a.begin()
    got_a = {t for t, _ in claim(a, la, qty=5)}
    step = b.start("select task_id from pgfence.claim(%s, 'q', 5)", (lb.lease_id,))
    blocked = step.settle()
    a.commit()
    got_b = {r[0] for r in step.result()}
    return blocked, got_a, got_b


def test_two_resources_one_queue_claim_in_parallel(any_db: Database) -> None:
    blocked, got_a, got_b = parallel_replicas(any_db)
    assert not blocked
    assert len(got_a) == 5 and len(got_b) == 5 and not got_a & got_b


def test_negative_control_claim_without_skip_locked(db: Database) -> None:
    db.install_mutant("claim-no-skip-locked")
    blocked, _, _ = parallel_replicas(db)
    assert blocked


# --------------------------------------------------------------------------------------------
# queue_status' tallies: finished tasks counted by the statements that finish them, folded by
# requeue_expired. A fold never waits for another, and no task is counted twice or lost.

def folds_meet(db: Database) -> tuple[bool, int]:
    """A folds in a transaction left open while B completes a task and folds: whether B's fold
    waited, and the count of completed tasks queue_status shows once both committed."""
    db.sql("select pgfence.register('w')")
    enqueue(db, 4)
    a, b = db.session("a"), db.session("b")
    lease = acquired(a.acquire("w"))
    held = claim(a, lease, qty=4)
    for _, attempt_id in held[:3]:
        assert complete(a, attempt_id) == "accepted"     # three tally rows
    a.hold_open()
    a.begin()
    assert a.one("select pgfence.requeue_expired()") == 0   # folds the three, holds them
    assert complete(b, held[3][1]) == "accepted"          # a fourth row, committed
    step = b.start("select pgfence.requeue_expired()")
    waited = step.settle()
    a.commit()
    assert step.one() == 0
    return waited, db.one("select completed from pgfence.queue_status where queue = 'q'")


def test_folds_never_wait_for_each_other_and_count_each_task_once(any_db: Database) -> None:
    waited, completed = folds_meet(any_db)
    assert not waited
    assert completed == 4
    any_db.sql("select pgfence.fold_tallies()")
    assert any_db.sql("select completed from pgfence.queue_tallies where queue = 'q'") == [(4,)]


def test_negative_control_a_fold_that_waits_for_the_rows_another_holds(db: Database) -> None:
    db.install_mutant("fold-tallies-waits")
    waited, completed = folds_meet(db)
    assert waited and completed == 4


# --------------------------------------------------------------------------------------------
# Both kinds of worker, and a mixed-version rollout


class WorkerEndpoint(BaseHTTPRequestHandler):
    """A worker runtime started over HTTP, as a supervisor starts an edge function."""

    dsn = ""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with connect(self.dsn, "worker-endpoint") as conn:
            try:
                row = conn.execute("select (pgfence.acquire(%s, %s, '30 s', %s)).generation",
                                   (body["resource"], body["owner"], body["invocation_id"])
                                   ).fetchone()
                answer = {"generation": row[0] if row else None}
            except psycopg.Error as e:
                answer = {"error": e.sqlstate}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_supervised_worker_over_http_and_process_worker(any_db: Database) -> None:
    any_db.sql("select pgfence.register('edge-fn')")
    any_db.sql("select pgfence.register('proc-worker')")
    handler = type("Endpoint", (WorkerEndpoint,), {"dsn": any_db.dsn})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        supervisor = any_db.session("supervisor")

        def start_worker(owner: str) -> dict[str, Any]:
            invocation = supervisor.one("select pgfence.request_start('edge-fn')")
            if invocation is None:
                return {"started": False}
            req = Request(f"http://127.0.0.1:{server.server_address[1]}/start",
                          data=json.dumps({"resource": "edge-fn", "owner": owner,
                                           "invocation_id": str(invocation)}).encode())
            with urlopen(req, timeout=30) as resp:
                return {"started": True, **json.loads(resp.read())}

        first = start_worker("isolate-1")
        assert first["started"] and first["generation"] is not None
        # The supervisor's cron fires again: the worker is up, nothing new is started.
        assert start_worker("isolate-2") == {"started": False}
        assert any_db.one("select pending_invocations from pgfence.resource_status "
                          "where resource = 'edge-fn'") == 0
    finally:
        server.shutdown()
        server.server_close()
    # A process worker started by a process manager: no invocation at all.
    proc = any_db.session("proc")
    assert proc.acquire("proc-worker") is not None
    assert any_db.one("select count(*) from pgfence.lease_status where status = 'current'") == 2


def test_mixed_version_rollout_observe_then_enforce(any_db: Database) -> None:
    any_db.sql("select pgfence.register('r')")
    any_db.sql("create table ledger (note text)")
    any_db.sql("grant all on ledger to public")
    any_db.sql("select pgfence.protect('ledger', 'r', 'observe')")
    legacy, modern = any_db.session("legacy-writer"), any_db.session("modern-writer")
    lease = acquired(modern.acquire("r"))

    def fenced_write(note: str) -> None:
        modern.begin()
        modern.fence(lease)
        modern.run("insert into ledger values (%s)", (note,))
        modern.commit()

    # Observe: the old binary keeps working and shows up where operators look.
    legacy.run("insert into ledger values ('legacy 1')")
    fenced_write("modern 1")
    assert any_db.sql("select resource, operation, application_name "
                      "from pgfence.unfenced_writes") == [("r", "INSERT", "legacy-writer")]
    # Enforce, once the old binaries are gone: the legacy writer is refused.
    any_db.sql("select pgfence.protect('ledger', 'r', 'enforce')")
    assert sqlstate(lambda: legacy.run("insert into ledger values ('legacy 2')")) == "PF007"
    fenced_write("modern 2")
    assert [r[0] for r in any_db.sql("select note from ledger order by note")] == [
        "legacy 1", "modern 1", "modern 2"]


# --------------------------------------------------------------------------------------------
# The pooler is real: clients share server backends, so session state is no ownership


def test_pooled_clients_share_a_backend_so_session_locks_are_not_ownership(
        bouncer: PgBouncer) -> None:
    dsn = bouncer.dsn("single")
    with connect(dsn, "a") as a, connect(dsn, "b") as b:
        got_a = a.execute("select pg_try_advisory_lock(42)").fetchone()
        got_b = b.execute("select pg_try_advisory_lock(42)").fetchone()
        # Both "own" the lock: it lives on the one shared server session.
        assert got_a == (True,) and got_b == (True,)
        a.execute("select pg_advisory_unlock_all()")
