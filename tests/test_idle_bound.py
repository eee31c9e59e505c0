"""No worker wedges a resource, a lease or a task by idling inside its own transaction.

Every function a worker may call that locks rows other sessions need (the resource row, a
lease row, a task row) limits how long its transaction may then stay idle: 5 s (limit_idle),
or what the lease had left for fence and claim (hold_current). For each: a worker calls it in
a transaction and goes idle; the successor that needs the row is let through once PostgreSQL
ends the idle session, within the bound. The negative controls: limit_idle made a no-op (here),
and each call site removed (the `*-idle-unbounded` mutants in tests/mutation/mutants.toml).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from testkit.harness import Database, Step
from tests.support import acquired

BOUND_S = 5.0
SLACK_S = 7.0  # the server checks the timeout on its own schedule; a loaded machine is slow


@dataclass
class Case:
    setup: Callable[[Database], dict[str, str]]  # committed state; names for the statements
    call: str       # what the worker runs in its own transaction, then idles
    successor: str  # what another session then runs: it needs the row the call locked
    wait_expiry: bool = False  # the successor needs the lease expired first (a takeover)


def resource(db: Database) -> dict[str, str]:
    db.sql("select pgfence.register('r')")
    return {}


def lease(db: Database) -> dict[str, str]:
    resource(db)
    held = acquired(db.session("first").acquire("r", ttl="1 second"))
    return {"lease": str(held.lease_id)}


def attempt(db: Database) -> dict[str, str]:
    resource(db)
    held = acquired(db.session("first").acquire("r", ttl="1 minute"))
    db.sql("select pgfence.enqueue('q', %s)", (json.dumps({"n": 1}),))
    attempt_id = db.one("select attempt_id from pgfence.claim(%s, 'q')", (held.lease_id,))
    return {"lease": str(held.lease_id), "attempt": str(attempt_id)}


def expired_attempt(db: Database) -> dict[str, str]:
    names = attempt(db)
    db.expire_attempt(uuid.UUID(names["attempt"]))
    return names


TAKEOVER = "select (pgfence.acquire('r', 'successor', '30 s')).generation is not null"
# set_enabled waits for the resource row; its own lock_timeout longer than the bound.
OPERATOR = "set lock_timeout = '60s'; select pgfence.set_enabled('r', true) is not null"

CASES = {
    "acquire": Case(resource, "select pgfence.acquire('r', 'w', '1 minute')", OPERATOR),
    "request_start": Case(resource, "select pgfence.request_start('r')", OPERATOR),
    "register": Case(lambda db: {}, "select pgfence.register('r')",
                     "select pgfence.register('r') is not null"),
    "renew": Case(lease, "select pgfence.renew('{lease}', '1 second')", TAKEOVER, wait_expiry=True),
    "drain": Case(lease, "select pgfence.drain('{lease}')", TAKEOVER, wait_expiry=True),
    "release": Case(lease, "select pgfence.release('{lease}')", TAKEOVER, wait_expiry=True),
    "claim": Case(lease, "select pgfence.enqueue('q'); select pgfence.claim('{lease}', 'q')",
                  TAKEOVER, wait_expiry=True),
    "complete": Case(attempt, "select pgfence.complete('{attempt}')",
                     "select pgfence.complete('{attempt}') = 'accepted'"),
    "fail": Case(attempt, "select pgfence.fail('{attempt}')",
                 "select pgfence.complete('{attempt}') = 'accepted'"),
    "extend": Case(attempt, "select pgfence.extend('{attempt}', '1 minute')",
                   "select pgfence.complete('{attempt}') = 'accepted'"),
    "requeue_expired": Case(expired_attempt, "select pgfence.requeue_expired()",
                            "select pgfence.extend('{attempt}', '1 minute') is not null"),
}


def idle_then_successor(db: Database, case: Case) -> tuple[int, float, Step]:
    """The worker's call, idle in its transaction; the successor started behind it."""
    names = case.setup(db)
    w = db.session("w")
    w.begin()
    for statement in case.call.format(**names).split("; "):
        w.run(statement)
    idle_since = time.monotonic()
    if case.wait_expiry:
        db.wait_until("select bool_and(expires_at < clock_timestamp()) from pgfence.leases "
                      "where state = 'active'")
    s = db.session("successor")
    *first, last = case.successor.format(**names).split("; ")
    for statement in first:
        s.run(statement)
    step = s.start(last)
    # (It waits for w, unless the bound was shorter still: claim's is what the lease had left.)
    assert not step.settle() or step.blocked_by == [w.pid]
    return w.pid, idle_since, step


@pytest.mark.parametrize("name", list(CASES))
def test_an_idle_worker_lets_the_successor_through_within_the_bound(db: Database,
                                                                     name: str) -> None:
    w_pid, idle_since, step = idle_then_successor(db, CASES[name])
    assert step.one(timeout=BOUND_S + SLACK_S) is True
    took = time.monotonic() - idle_since
    print(f"{name}: successor through {took:.1f} s after the worker went idle")
    assert took < BOUND_S + SLACK_S
    db.wait_until("select not exists (select from pg_stat_activity where pid = %s)", (w_pid,))


@pytest.mark.parametrize("name", ["request_start", "renew", "complete"])
def test_negative_control_without_the_limit_the_successor_waits(db: Database, name: str) -> None:
    db.replace_in_function("pgfence.limit_idle()",
                           "set_config('idle_in_transaction_session_timeout',",
                           "set_config('pgfence.unused',")
    w_pid, _, step = idle_then_successor(db, CASES[name])
    db.wait_until("select clock_timestamp() > %s + make_interval(secs => %s)",
                  (db.one("select now()"), BOUND_S + 2))
    assert step.settle() is True and step.blocked_by == [w_pid]
    db.sql("select pg_terminate_backend(%s)", (w_pid,))
    step.result()
