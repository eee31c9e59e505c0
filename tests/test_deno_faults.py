"""The Deno client's retry story under faults (issue 27): a worker as a process of its own
(clients/deno/testdata/fault_worker.ts) works two tasks, one whose handler returns and one
whose handler throws, while the test breaks its connection at one step of the cycle: acquire,
renew, claim, the handler running, complete, fail, drain, release; and, for complete_many, a
batch of three (two return: their results go in one complete_many; one throws: its fail goes
at once). The worker stops before each statement (and in each handler) until the test answers,
so every fault lands at a chosen point, never at a time:

- ``terminate``: the step's statement is sent and waits for a lock the test holds; the test
  finds its backend by application name (``pg_blocking_pids``), terminates it
  (``pg_terminate_backend``) and lets go: the statement rolled back, the client saw the
  connection break. Directly, and through PgBouncer (the server backend behind it).
- ``lose-answer``: a relay (testkit.relay) in front of the server, or of PgBouncer, lets
  the step's statement commit, drops its answer and cuts the connection.
- ``restart``: PgBouncer is killed and started again at the step (between statements).

In the handler (no statement in flight) ``terminate`` terminates the worker's backends,
``lose-answer`` cuts the relay's connections, ``restart`` restarts PgBouncer.

Every cell checks that each handler ran once and each task's result was applied exactly once
(the returned result completed the task, the thrown error failed it, nothing stale, every
report answered ``accepted`` or ``duplicate``), that the worker released its lease, and that
after the fault no claim was sent before a renewal passed. Each cell's path (what was sent
again, what a lost answer left behind) is compared with FAULT_TABLE, which docs/deno.md shows.
Negative controls: a worker that does not resend a report (a complete, or a batch's
complete_many) leaves the results unrecorded; one whose lease is not put in doubt claims again
without a renewal.
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from psycopg.conninfo import conninfo_to_dict

from testkit.cluster import LOOPBACK, USER, Cluster, PgBouncer
from testkit.harness import Database
from testkit.relay import Relay
from tests.support import DENO, HUNG, ROOT

CLIENT = ROOT / "clients/deno"
PERMISSIONS = ["--allow-net=" + LOOPBACK, "--allow-env", "--allow-read", "--allow-sys"]

STEPS = ("acquire", "renew", "claim", "handler", "complete", "complete_many", "fail", "drain",
         "release")
FAULTS = (("direct", "terminate"), ("direct", "lose-answer"), ("pgbouncer", "terminate"),
          ("pgbouncer", "lose-answer"), ("pgbouncer", "restart"))

# What the test locks so that the step's statement waits, for ``terminate``.
LOCKS = {
    "acquire": "lock table pgfence.leases in share mode",   # its insert of the new lease
    "renew": "select from pgfence.leases where resource = %(resource)s for update",
    "claim": "select from pgfence.leases where resource = %(resource)s for update",
    "drain": "select from pgfence.leases where resource = %(resource)s for update",
    "release": "select from pgfence.leases where resource = %(resource)s for update",
    "complete": "select from pgfence.tasks where queue = %(queue)s for update",
    "complete_many": "select from pgfence.tasks where queue = %(queue)s for update",
    "fail": "select from pgfence.tasks where queue = %(queue)s for update",
}
# What the relay watches for, for ``lose-answer``.
STATEMENTS = {step: f"pgfence.{step}(" for step in LOCKS}

# The cycle without faults: how often the worker stopped at each step. One task a claim: two
# tasks, two claims and an empty one. A batch (complete_many's runs): three tasks in one claim,
# the two results in one complete_many, the failure's fail at once; then an empty claim.
BASELINE = {"acquire": 1, "renew": 1, "claim": 3, "handler": 2, "complete": 1, "fail": 1,
            "requeue": 1, "drain": 1, "release": 1}
BATCH_BASELINE = {"acquire": 1, "renew": 1, "claim": 2, "handler": 3, "complete_many": 1,
                  "fail": 1, "requeue": 1, "drain": 1, "release": 1}


@dataclass(frozen=True)
class Path:
    """A cell's path, beside what every cell checks. ``again``: the worker stopped at the
    broken step more often than without the fault (the statement sent again, or a new claim,
    or a new renewal); ``renewed``: more renewals than without it (the lease was in doubt);
    ``duplicate``: results answered duplicate; ``leases``: leases granted (2: the first one's
    answer was lost); ``attempts``: the tasks' last attempt numbers, None where each is 1."""
    again: bool
    renewed: bool
    duplicate: int = 0
    leases: int = 1
    attempts: tuple[int, ...] | None = None


# Broken in flight: sent again. A statement's copy that committed (lose-answer) shows in what
# the retry is told: duplicate (complete, fail), or another lease is current (acquire: the
# worker stands by until the lease it was granted unseen expires, moved by the test). A claim is
# never sent again: after a renewal, a new claim, and a claim whose answer was lost had taken
# task 1, which comes back from requeue_expired after its visibility (moved by the test); so
# does task 2, taken by the claim that task 1's result rode with, when that answer is lost.
# Between statements (the handler's step, and PgBouncer's restart): the next statement
# reconnects silently, the lease in doubt until a renewal passes; a server backend behind
# PgBouncer that dies between transactions is not seen at all.
IN_FLIGHT = Path(again=True, renewed=True)
BEFORE_LEASE = Path(again=True, renewed=False)     # no lease yet, or its renewer stopped
SILENT = Path(again=False, renewed=True)
FAULT_TABLE: dict[str, dict[str, Path]] = {
    "acquire": {"terminate": BEFORE_LEASE, "lose-answer": Path(True, False, leases=2),
                "restart": Path(again=False, renewed=False)},
    "renew": {"terminate": IN_FLIGHT, "lose-answer": IN_FLIGHT, "restart": IN_FLIGHT},
    "claim": {"terminate": IN_FLIGHT, "lose-answer": Path(True, True, attempts=(2, 1)),
              "restart": SILENT},
    "handler": {"terminate": SILENT, "terminate behind PgBouncer": Path(False, False),
                "lose-answer": SILENT, "restart": SILENT},
    "complete": {"terminate": IN_FLIGHT,
                 "lose-answer": Path(True, True, duplicate=1, attempts=(1, 2)),
                 "restart": SILENT},
    "complete_many": {"terminate": IN_FLIGHT, "lose-answer": Path(True, True, duplicate=2),
                      "restart": SILENT},
    "fail": {"terminate": IN_FLIGHT, "lose-answer": Path(True, True, duplicate=1),
             "restart": SILENT},
    "drain": {"terminate": IN_FLIGHT, "lose-answer": IN_FLIGHT, "restart": SILENT},
    "release": {"terminate": BEFORE_LEASE, "lose-answer": BEFORE_LEASE,
                "restart": Path(again=False, renewed=False)},
}


def expected_path(target: str, fault: str, step: str) -> Path:
    if step == "handler" and fault == "terminate" and target == "pgbouncer":
        return FAULT_TABLE[step]["terminate behind PgBouncer"]
    return FAULT_TABLE[step][fault]


def url(port: int, database: str) -> str:
    return f"postgres://{USER}@{LOOPBACK}:{port}/{database}?sslmode=disable"


@dataclass
class Outcome:
    """What a run saw: the worker's own report, its events in order, and the database."""
    done: dict[str, Any]
    timeline: list[str]
    tasks: list[tuple[Any, ...]]
    stale: int
    leases: list[str]
    fired: bool
    problems: list[str] = field(default_factory=list)

    def path(self, step: str, baseline: dict[str, int]) -> Path:
        steps = self.done["steps"]
        attempts = tuple(int(task[2]) for task in self.tasks)
        return Path(again=steps.get(step, 0) > baseline[step],
                    renewed=steps.get("renew", 0) > baseline["renew"],
                    duplicate=self.done["verdicts"]["duplicate"], leases=len(self.leases),
                    attempts=None if set(attempts) == {1} else attempts)


class FaultRun:
    """One run of the worker process with one fault at one step (or none)."""

    def __init__(self, db: Database, cluster: Cluster, bouncer: PgBouncer,
                 env: dict[str, str], target: str, fault: str | None, step: str | None,
                 broken: str = "", batch: bool | None = None) -> None:
        self.db, self.cluster, self.bouncer = db, cluster, bouncer
        self.target, self.fault, self.step = target, fault, step
        # A batch of three for complete_many, one task a claim elsewhere.
        self.batch = step == "complete_many" if batch is None else batch
        self.baseline = BATCH_BASELINE if self.batch else BASELINE
        self.payloads: list[dict[str, Any]] = [{"n": 1}, {"n": 2, "fail": True}]
        if self.batch:
            self.payloads.append({"n": 3})
        suffix = uuid.uuid4().hex[:8]
        self.resource, self.queue, self.app = f"r-{suffix}", f"q-{suffix}", f"fault-{suffix}"
        self.proxy: Relay | None = None
        port = cluster.port if target == "direct" else bouncer.port
        if fault == "lose-answer":
            self.proxy = Relay(port, self.app)
            port = self.proxy.port
        name = conninfo_to_dict(db.dsn)["dbname"]
        assert isinstance(name, str)
        self.env = {**env, "DATABASE_URL": url(port, name), "RESOURCE": self.resource,
                    "QUEUE": self.queue, "APP": self.app, "BROKEN": broken,
                    "QTY": str(len(self.payloads) if self.batch else 1)}
        db.sql("select pgfence.register(%s)", (self.resource,))
        self.seed()
        self.fired = False
        self.timeline: list[str] = []

    # What the test locks for ``terminate``, and what the relay watches for, by step.
    locks: ClassVar[Mapping[str, str]] = LOCKS
    statements: ClassVar[Mapping[str, str]] = STATEMENTS

    def seed(self) -> None:
        """The work: a task of the queue per payload."""
        for payload in self.payloads:
            self.db.sql("select pgfence.enqueue(%s, %s)", (self.queue, json.dumps(payload)))

    def results(self) -> tuple[list[tuple[Any, ...]], int]:
        """Each task's (n, state, attempt, result, error), and the stale results."""
        tasks = self.db.sql("select (payload->>'n')::int, state, attempt, result, error "
                            "from pgfence.tasks where queue = %s order by task_id",
                            (self.queue,))
        stale = self.db.one("select count(*) from pgfence.stale_results s "
                            "join pgfence.tasks using (task_id) where queue = %s", (self.queue,))
        return tasks, int(stale)

    def run(self) -> Outcome:
        proc = subprocess.Popen([str(DENO), "run", *PERMISSIONS, "testdata/fault_worker.ts"],
                                cwd=CLIENT, env=self.env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        timeline = self.timeline = []
        # A hung worker is a failure, not a hung suite: killed, its stdout ends.
        watchdog = threading.Timer(120, proc.kill)
        watchdog.start()
        try:
            while True:
                line = proc.stdout.readline()
                assert line, f"the worker exited ({proc.wait()}) before it was done"
                said = json.loads(line)
                if "done" in said:
                    done: dict[str, Any] = said["done"]
                    break
                at = said["at"]
                timeline.append(at)
                if at in ("renewed", "closed"):
                    continue
                if at == "standby":          # the lease it was granted, unknown to it, expires
                    self.db.sql("select pgfence_test.expire(lease_id) from pgfence.leases "
                                "where resource = %s and state = 'active'", (self.resource,))
                if at == "requeue":          # a claim's lost tasks' visibility runs out
                    self.db.sql("update pgfence.tasks set visible_until = clock_timestamp() "
                                "- interval '1 ms' where queue = %s and state = 'claimed'",
                                (self.queue,))
                if at == self.step and said["n"] == 1 and not self.fired:
                    self._break(proc)
                    timeline.append("FAULT")
                    self.fired = True
                    continue
                self._go(proc)
            assert proc.wait(timeout=HUNG) == 0
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if self.proxy is not None:
                self.proxy.close()
        tasks, stale = self.results()
        leases = [s for (s,) in self.db.sql(
            "select status from pgfence.lease_status where resource = %s order by generation",
            (self.resource,))]
        fired = self.fired and (self.proxy is None or self.step == "handler"
                                or self.proxy.fired.is_set())
        return Outcome(done, timeline, tasks, stale, leases, fired)

    def _go(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()

    def _break(self, proc: subprocess.Popen[str]) -> None:
        """The fault, at the step the worker stopped at; the worker goes on from here."""
        step, fault = self.step, self.fault
        if step == "handler" or fault == "restart":
            # Between statements: the worker goes on once postgres.js has seen its connection
            # close (then its next statement reconnects), except where nothing closes it.
            if fault == "restart":
                self.bouncer.restart()
            elif fault == "lose-answer":
                assert self.proxy is not None and self.proxy.cut() >= 1
            else:
                assert self._terminate("") >= 1, "no backend of the worker to terminate"
            if not (fault == "terminate" and self.target == "pgbouncer"):
                self._until(proc, "closed")
            self._go(proc)
        elif fault == "lose-answer":
            assert self.proxy is not None
            self.proxy.arm(self.statements[str(step)])
            self._go(proc)
        else:
            holder = self.db.session(f"holder-{self.app}")
            holder.begin()
            holder.run(self.locks[str(step)], {"resource": self.resource, "queue": self.queue})
            self._go(proc)
            self.db.wait_until("select exists (select from pg_stat_activity where "
                               "application_name = %s and wait_event_type = 'Lock')", (self.app,))
            assert self._terminate("and wait_event_type = 'Lock'") == 1
            holder.rollback()
            holder.close()

    def _until(self, proc: subprocess.Popen[str], event: str) -> None:
        """Reads the worker's events (none of them awaiting an answer) until ``event``."""
        assert proc.stdout is not None
        while True:
            line = proc.stdout.readline()
            assert line, f"the worker exited ({proc.wait()}) before {event}"
            at = json.loads(line)["at"]
            self.timeline.append(at)
            if at == event:
                return

    def _terminate(self, condition: str) -> int:
        """Terminates the worker's backends (``condition`` on pg_stat_activity); how many."""
        pids = [pid for (pid,) in self.db.sql(
            "select pid from pg_stat_activity where application_name = %s " + condition,
            (self.app,))]
        for pid in pids:
            self.db.sql("select pg_terminate_backend(%s)", (pid,))
        self.db.wait_until("select not exists (select from pg_stat_activity "
                           "where pid = any(%s))", (pids,))
        return len(pids)


def check(run: FaultRun, outcome: Outcome) -> None:
    """Everything a cell must show whatever its path; raises AssertionError naming the cell."""
    cell = f"{run.fault} at {run.step} ({run.target})"
    done = outcome.done
    assert done["error"] is None, f"{cell}: the worker failed: {done['error']}"
    assert outcome.fired or run.fault is None, f"{cell}: the fault did not happen"
    assert done["runs"] == {str(p["n"]): 1 for p in run.payloads}, \
        f"{cell}: handlers ran {done['runs']}"
    for payload, (n, state, _, result, error) in zip(run.payloads, outcome.tasks, strict=True):
        # A returned result completed its task, a thrown error failed it (back in the queue).
        expected = ((n, "queued", None, {"error": f"task {n} fails"}) if payload.get("fail")
                    else (n, "completed", {"n": n, "by": run.app}, None))
        assert (n, state, result, error) == expected, \
            f"{cell}: task {n} is {(state, result, error)}"
    assert outcome.stale == 0, f"{cell}: stale results"
    verdicts = done["verdicts"]
    assert verdicts["stale"] == 0 and \
        verdicts["accepted"] + verdicts["duplicate"] == len(run.payloads), \
        f"{cell}: verdicts {verdicts}"
    assert outcome.leases[-1] == "released" and set(outcome.leases) <= {"released", "superseded"}, \
        f"{cell}: leases {outcome.leases}"
    # After the fault, no claim before a renewal that passed (unless the client could not see
    # it: a server backend behind PgBouncer dying between transactions).
    unseen = run.step == "handler" and run.fault == "terminate" and run.target == "pgbouncer"
    if "FAULT" in outcome.timeline and not unseen:
        after = outcome.timeline[outcome.timeline.index("FAULT"):]
        if "claim" in after:
            assert "renewed" in after[:after.index("claim")], \
                f"{cell}: claimed again without a renewal: {outcome.timeline}"


def check_path(run: FaultRun, outcome: Outcome) -> None:
    step = str(run.step)
    expected = expected_path(run.target, str(run.fault), step)
    path = outcome.path(step, run.baseline)
    assert path == expected, f"{run.fault} at {step} ({run.target}): {path} != {expected}"


@pytest.fixture
def own_bouncer(cluster: Cluster) -> Iterator[PgBouncer]:
    """A PgBouncer of these tests' own: they restart it."""
    b = cluster.pgbouncer()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def faults(db: Database, cluster: Cluster, own_bouncer: PgBouncer,
           deno_env: dict[str, str]) -> Any:
    def make(target: str, fault: str | None, step: str | None, broken: str = "",
             batch: bool | None = None) -> FaultRun:
        return FaultRun(db, cluster, own_bouncer, deno_env, target, fault, step, broken, batch)
    return make


def test_the_cycle_without_faults(faults: Any) -> None:
    """The control: the baselines every path is measured from, one task a claim and a batch."""
    for target in ("direct", "pgbouncer"):
        for batch in (False, True):
            run = faults(target, None, None, batch=batch)
            outcome = run.run()
            check(run, outcome)
            assert outcome.done["steps"] == run.baseline, outcome.done["steps"]
            assert outcome.done["verdicts"] == {"accepted": len(run.payloads), "duplicate": 0,
                                                "stale": 0}
            assert outcome.leases == ["released"]


@pytest.mark.parametrize(("target", "fault"), FAULTS, ids=[f"{t}-{f}" for t, f in FAULTS])
def test_every_result_applied_once_whatever_step_breaks(faults: Any, target: str,
                                                        fault: str) -> None:
    problems = []
    for step in STEPS:
        run = faults(target, fault, step)
        outcome = run.run()
        try:
            check(run, outcome)
            check_path(run, outcome)
        except AssertionError as e:
            problems.append(f"{e}\n    timeline: {' '.join(outcome.timeline)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("step", ["complete", "complete_many"])
def test_negative_control_a_report_not_sent_again_is_lost(faults: Any, step: str) -> None:
    run = faults("direct", "terminate", step, broken="no-resend")
    outcome = run.run()
    assert "ConnectionLost" in str(outcome.done["error"]), outcome.done
    with pytest.raises(AssertionError, match="the worker failed"):
        check(run, outcome)
    # The results are nowhere; their tasks wait.
    assert [state for (_, state, *_) in outcome.tasks if state != "queued"] == \
        ["claimed"] * (2 if run.batch else 1)


def test_negative_control_without_doubt_it_claims_again_unrenewed(faults: Any) -> None:
    run = faults("direct", "terminate", "claim", broken="no-doubt")
    outcome = run.run()
    with pytest.raises(AssertionError, match="claimed again without a renewal"):
        check(run, outcome)


# --- the fault table of docs/deno.md --------------------------------------------------------

COLUMNS = (("direct", "terminate", "backend terminated"), ("direct", "lose-answer", "answer lost"),
           ("pgbouncer", "terminate", "PgBouncer: server backend terminated"),
           ("pgbouncer", "lose-answer", "PgBouncer: answer lost"),
           ("pgbouncer", "restart", "PgBouncer restarted"))
AGAIN = {"acquire": "sent again", "renew": "renewed again at once",
         "claim": "not sent again; claimed anew after a renewal",
         "complete": "sent again, same attempt id",
         "complete_many": "sent again, same attempt ids",
         "fail": "sent again, same attempt id",
         "drain": "sent again", "release": "sent again"}


def phrase(step: str, path: Path) -> str:
    """A cell of the fault table: what the worker did, in words."""
    if path.again:
        parts = [AGAIN[step]]
    elif path.renewed or step != "handler":
        parts = ["reconnected silently"]
    else:
        parts = ["not seen: PgBouncer opened another server connection"]
    if path.renewed and step not in ("renew", "claim"):
        parts.append("the lease in doubt until renewed")
    if path.duplicate:
        parts.append("answered duplicate" if path.duplicate == 1 else "each id answered duplicate")
    if path.leases > 1:
        parts.append("the retry is told a lease is current: the one granted unseen, which "
                     "expires unused; then acquired anew")
    if path.attempts is not None and path.attempts[0] > 1:
        parts.append("the task claimed unseen returns after its visibility: attempt 2")
    if path.attempts is not None and path.attempts[1] > 1:
        parts.append("the claim it rode with is not sent again: the next task, claimed unseen, "
                     "returns after its visibility: attempt 2")
    return "; ".join(parts)


def fault_table() -> str:
    rows = ["| step broken | " + " | ".join(title for _, _, title in COLUMNS) + " |",
            "|---" * (len(COLUMNS) + 1) + "|"]
    for step in STEPS:
        cells = [phrase(step, expected_path(t, f, step)) for t, f, _ in COLUMNS]
        rows.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def test_docs_show_the_fault_table() -> None:
    """docs/deno.md's fault table is FAULT_TABLE, which the runs above check cell by cell."""
    doc = (ROOT / "docs/deno.md").read_text()
    start, end = "<!-- fault table: tests/test_deno_faults.py -->\n", "\n<!-- /fault table -->"
    assert start in doc and end in doc, "docs/deno.md has no fault table"
    shown = doc[doc.index(start) + len(start):doc.index(end)]
    assert shown == fault_table(), f"docs/deno.md's fault table should be:\n{fault_table()}"


# --- the pgflow worker's batch: complete_many of pgfence_pgflow -------------------------------

class FlowFaultRun(FaultRun):
    """The same worker process as a FlowWorker (fault_worker.ts, $FLOW) of a pgflow flow of one
    step, `only`, three runs of it started with the payloads (max_attempts 1: the thrown error
    fails its task for good), taken in one batch: the two results in one
    pgfence_pgflow.complete_many, which the fault breaks; the failure's fail_task at once."""

    locks: ClassVar[Mapping[str, str]] = {
        "complete_many": "select from pgflow.runs where flow_slug = %(queue)s for update"}
    statements: ClassVar[Mapping[str, str]] = {"complete_many": "pgfence_pgflow.complete_many("}

    def __init__(self, db: Database, cluster: Cluster, bouncer: PgBouncer,
                 env: dict[str, str], target: str, fault: str | None,
                 broken: str = "") -> None:
        self.flow = f"f_{uuid.uuid4().hex[:8]}"
        super().__init__(db, cluster, bouncer, {**env, "FLOW": self.flow}, target, fault,
                         "complete_many" if fault else None, broken, batch=True)
        self.queue = self.env["QUEUE"] = self.flow

    def seed(self) -> None:
        self.db.sql("select pgflow.create_flow(%s, max_attempts => 1, timeout => 600)",
                    (self.flow,))
        self.db.sql("select pgflow.add_step(%s, 'only')", (self.flow,))
        for payload in self.payloads:
            self.db.sql("select pgflow.start_flow(%s, %s)", (self.flow, json.dumps(payload)))

    def results(self) -> tuple[list[tuple[Any, ...]], int]:
        """Each task's (n, status, attempts_count, output, error_message), and the stale
        results of the flow's attempts."""
        tasks = self.db.sql("select (r.input->>'n')::int, st.status, st.attempts_count, "
                            "st.output, st.error_message from pgflow.step_tasks st "
                            "join pgflow.runs r using (run_id) where st.flow_slug = %s "
                            "order by 1", (self.flow,))
        stale = self.db.one("select count(*) from pgfence_pgflow.stale_results s "
                            "join pgfence_pgflow.attempts a using (attempt_id) "
                            "where a.flow_slug = %s", (self.flow,))
        return tasks, int(stale)


def check_flow(run: FlowFaultRun, outcome: Outcome) -> None:
    """What every run of the flow must show: each handler ran once, each result applied once
    (the returned ones completed their tasks, the thrown error failed its task), nothing
    stale, every report answered accepted or duplicate, the lease released."""
    cell = f"{run.fault} at the flow's complete_many ({run.target})"
    done = outcome.done
    assert done["error"] is None, f"{cell}: the worker failed: {done['error']}"
    assert outcome.fired or run.fault is None, f"{cell}: the fault did not happen"
    assert done["runs"] == {"1": 1, "2": 1, "3": 1}, f"{cell}: handlers ran {done['runs']}"
    assert outcome.tasks == [(1, "completed", 1, {"n": 1, "by": run.app}, None),
                             (2, "failed", 1, None, "task 2 fails"),
                             (3, "completed", 1, {"n": 3, "by": run.app}, None)], \
        f"{cell}: tasks {outcome.tasks}"
    assert outcome.stale == 0, f"{cell}: stale results"
    verdicts = done["verdicts"]
    assert verdicts["stale"] == 0 and verdicts["accepted"] + verdicts["duplicate"] == 3, \
        f"{cell}: verdicts {verdicts}"
    assert outcome.leases[-1] == "released", f"{cell}: leases {outcome.leases}"


@pytest.fixture
def flow_faults(flow: Database, flow_cluster: Cluster, flow_bouncer: PgBouncer,
                deno_env: dict[str, str]) -> Any:
    def make(target: str, fault: str | None, broken: str = "") -> FlowFaultRun:
        return FlowFaultRun(flow, flow_cluster, flow_bouncer, deno_env, target, fault, broken)
    return make


# (target, fault): whether the first copy committed (its answer lost: each id then answered
# duplicate) or rolled back (its backend terminated while it waited: accepted when sent again).
FLOW_FAULTS = [("direct", None), ("direct", "lose-answer"), ("direct", "terminate"),
               ("pgbouncer", "lose-answer"), ("pgbouncer", "terminate")]


@pytest.mark.parametrize(("target", "fault"), FLOW_FAULTS,
                         ids=[f"{t}-{f or 'none'}" for t, f in FLOW_FAULTS])
def test_the_flow_workers_batch_is_applied_once_whatever_breaks_it(
        flow_faults: Any, target: str, fault: str | None) -> None:
    run = flow_faults(target, fault)
    outcome = run.run()
    check_flow(run, outcome)
    sent = outcome.done["steps"].get("complete_many", 0)
    duplicate = outcome.done["verdicts"]["duplicate"]
    assert (sent, duplicate) == {None: (1, 0), "lose-answer": (2, 2), "terminate": (2, 0)}[fault], \
        f"complete_many sent {sent} times, {duplicate} duplicates: {outcome.timeline}"


def test_negative_control_a_flow_batch_not_sent_again_is_lost(flow_faults: Any) -> None:
    run = flow_faults("direct", "terminate", broken="no-resend")
    outcome = run.run()
    assert "ConnectionLost" in str(outcome.done["error"]), outcome.done
    with pytest.raises(AssertionError, match="the worker failed"):
        check_flow(run, outcome)
    # The two results are nowhere: their tasks are still started.
    assert [status for (_, status, *_) in outcome.tasks] == ["started", "failed", "started"]
