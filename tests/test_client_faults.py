"""The client under faults: its connections killed at each step of the cycle, directly and
through a PgBouncer that is restarted; every task's result applied exactly once, and no
handler started after the lease was lost. Both clients (threads and asyncio).

Every fault fires at an exact step, driven by the TCP relay in front of the client
(testkit.relay): the statement of the step is held while its backend is terminated or
PgBouncer restarted (the server never sees it), or it is forwarded and its answer lost (the
server did it, the client never learns). The lease's ttl and the tasks' visibility (LONG, 10
min) never run out by themselves, on however loaded a machine; where a scenario needs time
to pass, a test moves it.

docs/python.md ("Faults") has the table of what each fault at each step does: the rows of
test_fault_at_each_step_applies_every_result_once, checked there from the database's record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

import pgfence.aio
import pgfence.client
from pgfence.client import LeaseLost, Retry
from testkit.cluster import Cluster, PgBouncer
from testkit.harness import HANG, Database
from testkit.relay import Link, Relay
from tests.support import KINDS, LONG, ROOT, AnyContext, Client, client, effects_table

STEPS = ("acquire", "renew", "claim", "extend", "handler", "complete", "complete_many", "fail",
         "requeue", "drain", "release")
PATTERNS = {step: f"pgfence.{step}(" for step in STEPS if step != "handler"}
PATTERNS["requeue"] = "pgfence.requeue_expired("
# terminate: direct, the backend terminated before the statement reached it. drop: direct, the
# answer lost after the statement ran. restart: through PgBouncer, restarted before the
# statement reached it. bouncer-drop: through PgBouncer, the answer lost.
FAULTS = ("terminate", "drop", "restart", "bouncer-drop")
LOST_ANSWER = ("drop", "bouncer-drop")
CASES = [(s, f) for s in STEPS for f in FAULTS if not (s == "handler" and f in LOST_ANSWER)]


@pytest.fixture(scope="module")
def own_bouncer(cluster: Cluster) -> Iterator[PgBouncer]:
    """A PgBouncer of these tests' own: they restart it."""
    b = cluster.pgbouncer()
    try:
        yield b
    finally:
        b.stop()


@dataclass
class Scene:
    """One fault scenario: a database, a relay in front of the route, the client."""

    db: Database
    fault: str
    relay: Relay
    bouncer: PgBouncer
    dsn: str                                  # the client's: through the relay
    client: Client
    runs: Counter[int] = field(default_factory=Counter)
    starts: list[tuple[int, str]] = field(default_factory=list)   # task, its lease's status
    fired: list[str] = field(default_factory=list)

    def kill(self, link: Link | None = None) -> None:
        """The fault: PgBouncer restarted, or the backend behind ``link`` terminated (all of
        the client's, found by application_name, without a link); waits until it is gone."""
        if self.fault in ("restart", "bouncer-drop"):
            self.bouncer.restart()
            return
        where, param = (("client_port = %s", link.upstream_port) if link is not None
                        else ("application_name like %s", "w1%"))
        killed = self.db.sql(f"select pg_terminate_backend(pid, 10000) from pg_stat_activity "
                             f"where {where} and datname = current_database()", (param,))
        assert killed and all(ok for (ok,) in killed), f"nothing to terminate: {killed}"

    def arm(self, step: str) -> None:
        if self.fault in LOST_ANSWER:
            self.relay.arm(PATTERNS[step])
        else:
            self.relay.arm(PATTERNS[step], before=self.kill)

    def record(self, payload: Any, ctx: AnyContext, generation: int | None) -> None:
        status = self.db.one("select status from pgfence.lease_status where generation = %s",
                             (generation,))
        self.starts.append((ctx.task.task_id, status))
        self.runs[ctx.task.task_id] += 1


@pytest.fixture
def scene(request: pytest.FixtureRequest, db: Database, cluster: Cluster,
          own_bouncer: PgBouncer) -> Iterator[Scene]:
    kind, fault = request.param
    via_bouncer = fault in ("restart", "bouncer-drop")
    relay = Relay(own_bouncer.port if via_bouncer else cluster.port, fault)
    name = db.one("select current_database()")
    db.sql("select pgfence.register('r')")
    effects_table(db, "r")
    for n in (1, 2, 3):             # task 2 fails, for good: it has one attempt
        db.sql("select pgfence.enqueue('q', %s, %s)",
               (f'{{"n": {n}, "fail": {str(n == 2).lower()}}}', 1 if n == 2 else 3))
    try:
        with client(kind, db) as c:
            yield Scene(db, fault, relay, own_bouncer, cluster.tcp_dsn(name, relay.port), c)
    finally:
        relay.close()


def scenes(cases: list[tuple[str, str]]) -> pytest.MarkDecorator:
    return pytest.mark.parametrize(
        "scene, step", [((k, f), s) for k in KINDS for s, f in cases],
        ids=[f"{k}-{s}-{f}" for k in KINDS for s, f in cases], indirect=["scene"])


def fast_retry() -> Retry:
    # Quick retries, which give up only for a hung test: the outage they wait out is a
    # PgBouncer restarted (a process start, slow on a loaded machine) or a backend killed.
    return Retry(base=0.005, cap=0.05, give_up=LONG)


@scenes(CASES)
def test_fault_at_each_step_applies_every_result_once(scene: Scene, step: str) -> None:
    c, db = scene.client, scene.db
    lost_answer = scene.fault in LOST_ANSWER
    # Renewals run in the background only where the renewal is the step killed; elsewhere the
    # only renewals are the ones that trust the lease again after a lost connection.
    owner = c.owner(scene.dsn, "r", owner="w1", ttl=LONG,
                    renew_every=0.02 if step == "renew" else 3600, retry=fast_retry())
    if step == "acquire":
        scene.arm(step)
    acquired = c.call(owner.acquire())
    if step == "acquire" and lost_answer:
        assert not acquired                  # the retry's answer: a lease is current
        assert db.sql("select generation, renewed_at from pgfence.leases") == [(1, None)]
        db.sql("select pgfence_test.expire(lease_id) from pgfence.leases")
        acquired = c.call(owner.acquire())
    assert acquired
    generation = owner.generation
    # One at a time, a result rides with the next claim: a complete's lost answer loses that
    # claim's too.
    lost_claim = lost_answer and step in ("claim", "complete")

    def pre(payload: Any, ctx: AnyContext) -> Any:
        scene.record(payload, ctx, generation)
        first = not scene.fired
        if first:
            scene.fired.append(step)
        if step == "handler" and first:
            scene.kill()                     # every connection of the client, mid-handler
            scene.relay.fired.set()
        if lost_claim and scene.relay.dropped.is_set() and not scene.fired[1:]:
            # The lost claim's task (a complete's is lost with the claim it rode with): its
            # visibility runs out when the queue is next found empty (time passes, as the test
            # says).
            scene.fired.append("requeue")
            def time_passes(_: Link, held: int = ctx.task.task_id) -> None:
                db.sql("update pgfence.tasks set visible_until = clock_timestamp() - "
                       "interval '1 ms' where state = 'claimed' and task_id <> %s", (held,))
            scene.relay.arm(PATTERNS["requeue"], before=time_passes)
        if step == "extend" and first:
            # The claim holds its task for its handler: the extend is the handler's own.
            if c.aio:
                async def checked() -> None:
                    assert await cast(pgfence.aio.Context, ctx).extend(LONG) is not None
                return checked()
            assert ctx.extend(LONG) is not None
        if payload["fail"]:
            raise ValueError("task 2 fails")
        return None

    if step not in ("acquire", "handler"):
        scene.arm(step)
    if step == "renew":             # the renewer's next renewal is the one killed
        assert c.wait(scene.relay.fired, 30), "no renewal passed the relay"
    # A batch of three for complete_many (task 2's fail is sent on its own, the two results
    # together); one at a time elsewhere, each result its own complete.
    worker = c.worker(owner, "q", pre, qty=3 if step == "complete_many" else 1,
                      visibility=LONG)
    c.call(worker.run(until_idle=True))

    # (A kill's action may still be returning in the relay's thread when the client has
    # already noticed the dead connection and gone on.)
    assert scene.relay.fired.wait(HANG) and scene.relay.errors == [], "the fault never fired"
    # Exactly once: one handler call per task, every result applied once, nothing stale. The
    # claim lost with task 1's result took task 2, whose one attempt ran out unhandled.
    spent = lost_claim and step == "complete"
    assert scene.runs == (Counter({1: 1, 3: 1}) if spent else Counter({1: 1, 2: 1, 3: 1}))
    assert db.sql("select task_id, state from pgfence.tasks order by 1") == [
        (1, "completed"), (2, "failed"), (3, "completed")]
    assert db.sql("select task_id, generation from effects order by 1") == [
        (1, generation), (3, generation)]
    assert db.one("select count(*) from pgfence.stale_results") == 0
    # No handler started but under a current lease.
    assert {status for _, status in scene.starts} == {"current"}
    assert db.one("select status from pgfence.lease_status where generation = %s",
                  (generation,)) == "released"
    assert owner.lost == "released"
    renewer = owner._renewer
    assert renewer is not None and (renewer.done() if c.aio else not renewer.is_alive())
    # The row of the fault table.
    duplicates = {"complete": 1, "fail": 1, "complete_many": 2}.get(step, 0) if lost_answer else 0
    assert worker.verdicts == Counter({"accepted": 3 - duplicates - spent,
                                       "duplicate": duplicates}
                                      if duplicates else {"accepted": 3})
    assert generation == (2 if step == "acquire" and lost_answer else 1)
    attempts = dict(db.sql("select task_id, attempt from pgfence.tasks"))
    reclaimed = step == "claim" and lost_answer
    assert attempts == {1: 2 if reclaimed else 1, 2: 1, 3: 1}


def lease_lost_in_outage(scene: Scene, step: str, owner_cls: type[Any] | None = None,
                         ) -> tuple[list[tuple[int, str]], BaseException | None]:
    """A batch of three in hand; at ``step`` of the first task the connection is killed and,
    during the outage, the lease expires and a successor takes the resource. Returns who
    started (task, its lease's status then) and what ``run`` raised."""
    c, db = scene.client, scene.db
    kwargs: dict[str, Any] = {"owner": "w1", "ttl": LONG, "renew_every": 3600,
                              "retry": fast_retry()}
    owner = owner_cls(scene.dsn, "r", **kwargs) if owner_cls else c.owner(scene.dsn, "r", **kwargs)
    assert c.call(owner.acquire())
    generation = owner.generation

    def takeover() -> None:
        db.expire(owner.lease_id)
        assert db.sql("select generation from pgfence.acquire('r', 'successor', '30 s')") == [
            (2,)]

    def kill_and_take_over(link: Link | None = None) -> None:
        takeover()              # first: the client goes on as soon as it sees the kill
        scene.kill(link)

    def pre(payload: Any, ctx: AnyContext) -> None:
        scene.record(payload, ctx, generation)
        if step == "handler" and len(scene.starts) == 1:
            kill_and_take_over()
            scene.relay.fired.set()

    if step == "complete":
        scene.relay.arm(PATTERNS["complete"], before=kill_and_take_over)
    # No fenced effect: the handler in hand during the takeover is to finish and report. Each
    # result is sent before the next handler starts (report_within=0), so that the lost
    # connection of a complete comes between two handlers.
    worker = c.worker(owner, "q", pre, qty=3, visibility=LONG, effect=False, report_within=0)
    error: BaseException | None = None
    try:
        c.call(worker.run(until_idle=True))
    except LeaseLost as e:
        error = e
    assert scene.relay.fired.wait(HANG) and scene.relay.errors == []
    # The result in hand was reported after the outage and accepted: nobody had claimed the
    # task since (I5).
    assert db.one("select state from pgfence.tasks where task_id = 1") == "completed"
    return scene.starts, error


LOST_CASES = [(s, f) for s in ("handler", "complete") for f in ("terminate", "restart")]


@scenes(LOST_CASES)
def test_no_handler_starts_after_the_lease_was_lost_in_an_outage(scene: Scene,
                                                                 step: str) -> None:
    starts, error = lease_lost_in_outage(scene, step)
    assert error is None
    assert starts == [(1, "current")]        # the rest of the batch never started
    assert scene.db.sql("select task_id, state from pgfence.tasks where task_id > 1 "
                        "order by 1") == [(2, "claimed"), (3, "claimed")]


class TrustingOwner(pgfence.client.Owner):
    """Broken on purpose: a lost connection raises no doubt; the lease is trusted on its
    local deadline alone after a reconnect."""

    def doubt(self) -> None:
        pass


class TrustingAsyncOwner(pgfence.aio.Owner):
    def doubt(self) -> None:
        pass


@scenes(LOST_CASES)
def test_negative_control_trusting_the_lease_after_a_reconnect_starts_a_handler(
        scene: Scene, step: str) -> None:
    owner_cls = TrustingAsyncOwner if scene.client.aio else TrustingOwner
    starts, error = lease_lost_in_outage(scene, step, owner_cls)
    # The next handlers of the batch started under a lease that was superseded.
    assert starts == [(1, "current"), (2, "superseded"), (3, "superseded")]
    assert error is None


@pytest.mark.parametrize("scene", [("sync", "terminate")], indirect=True, ids=["sync"])
def test_negative_control_without_retries_a_lost_result_runs_its_handler_twice(
        scene: Scene) -> None:
    """The client as it was before retries (``Retry(give_up=0)``): one terminated connection
    at complete ends the run and loses the result; the task, back after its visibility, is
    handled a second time, and its effect written twice."""
    c, db = scene.client, scene.db
    outcomes = []
    for term in (1, 2):
        owner = c.owner(scene.dsn, "r", owner="w1", ttl=LONG, renew_every=3600,
                        retry=Retry(give_up=0))
        assert owner.acquire()
        if term == 1:
            scene.arm("complete")

        def pre(payload: Any, ctx: AnyContext, generation: int | None = owner.generation) -> None:
            scene.record(payload, ctx, generation)
        worker = c.worker(owner, "q", pre, qty=1)
        try:
            worker.run(max_tasks=1) if term == 1 else worker.run(until_idle=True)
            outcomes.append("completed")
        except Exception as e:
            outcomes.append(type(e).__name__)
            # Time passes: the lost result's task comes back.
            db.sql("update pgfence.tasks set visible_until = clock_timestamp() - "
                   "interval '1 ms' where state = 'claimed'")
            assert db.one("select pgfence.requeue_expired()") == 1
    assert outcomes == ["AdminShutdown", "completed"]
    assert scene.runs[1] == 2
    assert db.sql("select attempt from effects where task_id = 1 order by 1") == [(1,), (2,)]


def test_the_fault_table_is_documented() -> None:
    """docs/python.md's fault table has a row for every step these tests kill."""
    doc = (ROOT / "docs/python.md").read_text()
    table = doc[doc.index("<!-- fault table"):]
    table = table[:table.index("\n\n")]
    rows = [line.split("|")[1].strip().strip("`") for line in table.splitlines()[3:]]
    names = {"handler": "handler running", "requeue": "requeue_expired"}
    assert rows == [names.get(s, s) for s in STEPS]

