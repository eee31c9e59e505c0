"""No worker wedges a resource, a lease or a task by idling inside its own transaction.

Every function a worker may call that locks rows other sessions need (the resource row, a
lease row, a task row) limits how long its transaction may then stay idle: 5 s (limit_idle),
or what the lease had left for fence and claim (hold_current). For each: a worker calls it in
a transaction and goes idle; the successor that needs the row is let through once PostgreSQL
ends the idle session, within the bound. The negative controls: limit_idle made a no-op (here),
and each call site removed (the `*-idle-unbounded` mutants in tests/mutation/mutants.toml).

The bound is waited for once, not once per case: the cases selected in a run each get their own
database, their workers all go idle together and their successors all start behind them (one
batch, a module fixture); each test then judges its own case from the batch (named on failure:
what went wrong in its setup is raised by its test), with the time its successor got through
taken when that happened (Step.finished_at), not when the test looked. The module is one xdist
group (tests/conftest.py GROUPS), so a run builds one batch.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.cluster import Cluster
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


@dataclass
class Idle:
    """One case of a batch: its database, the idle worker's pid and when it went idle, the
    successor's step behind it, and when the batch was built (the server's clock)."""
    db: Database
    w_pid: int
    idle_since: float
    step: Step
    started: object


def idle_worker(db: Database, case: Case) -> tuple[dict[str, str], int, float]:
    """The worker's call, then idle in its transaction."""
    names = case.setup(db)
    w = db.session("w")
    w.begin()
    for statement in case.call.format(**names).split("; "):
        w.run(statement)
    return names, w.pid, time.monotonic()


def start_successor(db: Database, case: Case, names: dict[str, str], w_pid: int) -> Step:
    """The successor started behind the idle worker."""
    if case.wait_expiry:
        db.wait_until("select bool_and(expires_at < clock_timestamp()) from pgfence.leases "
                      "where state = 'active'")
    s = db.session("successor")
    *first, last = case.successor.format(**names).split("; ")
    for statement in first:
        s.run(statement)
    step = s.start(last)
    # (It waits for w, unless the bound was shorter still: claim's is what the lease had left.)
    assert not step.settle() or step.blocked_by == [w_pid]
    return step


def selected(request: pytest.FixtureRequest, test: str) -> list[str]:
    """The cases of `test` this run selected (a mutant's check runs one)."""
    here = Path(__file__)
    return [str(item.callspec.params["name"]) for item in request.session.items
            if isinstance(item, pytest.Function) and item.path == here
            and item.originalname == test]


def batch(request: pytest.FixtureRequest, cluster: Cluster, template: str, test: str,
          prepare: Callable[[Database], None]) -> Iterator[dict[str, Idle | BaseException]]:
    """Every selected case of `test`, each in its own database, all idle at once."""
    with ExitStack() as stack:
        dbs: dict[str, Database] = {}
        for name in selected(request, test):
            dbname = f"t_{uuid.uuid4().hex[:12]}"
            cluster.create_database(dbname, template)
            stack.callback(cluster.drop_database, dbname)
            dbs[name] = Database(cluster.dsn(dbname))
            stack.callback(dbs[name].close)
        out: dict[str, Idle | BaseException] = {}
        idle: dict[str, tuple[dict[str, str], int, float]] = {}
        for name, db in dbs.items():
            try:
                prepare(db)
                idle[name] = idle_worker(db, CASES[name])
            except Exception as e:  # raised by the case's own test
                out[name] = e
        for name, (names, w_pid, idle_since) in idle.items():
            db = dbs[name]
            try:
                step = start_successor(db, CASES[name], names, w_pid)
                out[name] = Idle(db, w_pid, idle_since, step, db.one("select now()"))
            except Exception as e:
                out[name] = e
        yield out


def case_of(got: dict[str, Idle | BaseException], name: str) -> Idle:
    one = got[name]
    if isinstance(one, BaseException):
        raise one
    return one


POSITIVE = "test_an_idle_worker_lets_the_successor_through_within_the_bound"
NEGATIVE = "test_negative_control_without_the_limit_the_successor_waits"


@pytest.fixture(scope="module")
def bounded(request: pytest.FixtureRequest, cluster: Cluster,
            template: str) -> Iterator[dict[str, Idle | BaseException]]:
    yield from batch(request, cluster, template, POSITIVE, lambda db: None)


def without_the_limit(db: Database) -> None:
    db.replace_in_function("pgfence.limit_idle()",
                           "set_config('idle_in_transaction_session_timeout',",
                           "set_config('pgfence.unused',")


@pytest.fixture(scope="module")
def unbounded(request: pytest.FixtureRequest, cluster: Cluster,
              template: str) -> Iterator[dict[str, Idle | BaseException]]:
    yield from batch(request, cluster, template, NEGATIVE, without_the_limit)


@pytest.mark.parametrize("name", list(CASES))
def test_an_idle_worker_lets_the_successor_through_within_the_bound(
        bounded: dict[str, Idle | BaseException], name: str) -> None:
    c = case_of(bounded, name)
    assert c.step.one(timeout=BOUND_S + SLACK_S) is True
    assert c.step.finished_at is not None
    took = c.step.finished_at - c.idle_since
    print(f"{name}: successor through {took:.1f} s after the worker went idle")
    assert took < BOUND_S + SLACK_S
    c.db.wait_until("select not exists (select from pg_stat_activity where pid = %s)", (c.w_pid,))


@pytest.mark.parametrize("name", ["request_start", "renew", "complete"])
def test_negative_control_without_the_limit_the_successor_waits(
        unbounded: dict[str, Idle | BaseException], name: str) -> None:
    c = case_of(unbounded, name)
    c.db.wait_until("select clock_timestamp() > %s + make_interval(secs => %s)",
                    (c.started, BOUND_S + 2))
    assert c.step.settle() is True and c.step.blocked_by == [c.w_pid]
    c.db.sql("select pg_terminate_backend(%s)", (c.w_pid,))
    c.step.result()
