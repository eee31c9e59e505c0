"""The control-plane examples (examples/control_plane/server.py on threads, fastapi_app.py on
asyncio) as real processes: two replicas share one leader resource; the leader is frozen with
SIGSTOP, the standby takes over, and the resumed old leader's mutations are refused. Along the
way, /ready answers 200 on the leader only, and the roles swap with the takeover. Negative
controls run the same scenario with replicas that write without fence() (tables in observe
mode: the stale write lands and the history check of docs/control-plane.md finds it), and with
a readiness that ignores leadership (the standby answers 200: the readiness check catches it).

Both examples pass the conformance check (pgfence.conformance), and each promise of it fails on
an example broken to break it: a /ready that no longer asks the database, a standby that no
longer serves reads, a replica that writes without fence. A job is assigned once, however many
assignments race for it (the negative control: the example without its `state = 'queued'`).

The replicas are real processes on real time: the frozen leader's lease must run out on the
clock, and its own deadline pass, for the takeover and the resumed leader's view to be what
they are in production. So their ttl is short (TTL), and until the freeze the leader keeps its
lease only by renewing it every third of that. On a machine too slow for those renewals, the
lease lapsed before the freeze and the scenario failed with nothing wrong: now such a run
(Outran: the database shows the lease ended, or the leader says it no longer trusts it) is
run again in a fresh database with twice the ttl; and then, before the freeze, the test waits
until the leader has renewed its way past its first ttl, so that a longer ttl cannot hide
renewals that do not work. The other waits end as soon as what they wait for has happened,
and are bounded for a hung process only."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster, free_port
from testkit.harness import HANG, Database
from tests.support import HUNG, ROOT

SERVER = ROOT / "examples/control_plane/server.py"
FASTAPI = ROOT / "examples/control_plane/fastapi_app.py"
# The replicas' lease ttl (s), and how long it may grow when the machine outran it (Outran).
TTL = 1.0
MAX_TTL = 16.0
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def history_check() -> str:
    """The stale-write query of docs/control-plane.md, as the doc prints it."""
    text = (ROOT / "docs/control-plane.md").read_text()
    match = re.search(r"<!-- control-plane check[^>]*-->\s*```sql\n(.*?)```", text, flags=re.S)
    assert match, "docs/control-plane.md has no block marked 'control-plane check'"
    return match.group(1)


def call(url: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    try:
        with HTTP.open(request, timeout=HANG) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@dataclass
class Replica:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def name(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any]:
        return call(f"{self.name}/health")[1]

    def ready(self) -> int:
        """The status a load balancer routing by /ready sees."""
        return self.readiness()[0]

    def readiness(self) -> tuple[int, dict[str, Any]]:
        """/ready's status and answer (its reason, when not ready)."""
        return call(f"{self.name}/ready")

    def role(self) -> str | None:
        """leader, standby, or None while it is not answering yet."""
        assert self.proc.poll() is None, f"{self.name} exited:\n{self.log.read_text()}"
        try:
            return str(self.health()["role"])
        except OSError:
            return None

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return call(f"{self.name}{path}", body)


def wait_for(what: str, done: Callable[[], bool], timeout: float = HANG) -> None:
    """Polls another process's state; the deadline only bounds a failure (two Python
    processes' start and an election, on a loaded machine: long)."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def init(db: Database, *flags: str) -> None:
    subprocess.run([sys.executable, str(SERVER), "--init", "--dsn", db.dsn, *flags],
                   check=True, capture_output=True)


@contextmanager
def replicas(db: Database, tmp_path: Path, flags: list[str], n: int = 2,
             server: Path = SERVER, ttl: float = TTL) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for i in range(n):
            port, log = free_port(), tmp_path / f"replica-{i}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    [sys.executable, str(server), "--dsn", db.dsn, "--port", str(port),
                     "--ttl", f"{ttl:g}", "--poll", "0.1", *flags],
                    stdout=out, stderr=subprocess.STDOUT)
            started.append(Replica(port, proc, log))
        yield started
    finally:
        for r in started:
            r.proc.send_signal(signal.SIGCONT)      # a frozen process cannot handle SIGTERM
            r.proc.terminate()
        for r in started:
            try:
                r.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
            print(f"--- {r.name}\n{r.log.read_text()}")  # shown when the test fails


@dataclass
class Outcome:
    db: Database                                    # where it ran (a fresh one if run again)
    old: Replica
    new: Replica
    g1: int
    g2: int
    stale: list[tuple[int, dict[str, Any]]]         # the resumed old leader's two mutations
    old_role: str | None
    new_role: str | None
    violations: list[tuple[Any, ...]]
    leases: list[tuple[Any, ...]]                   # (generation, owner, status) at the end
    ready: dict[str, int]                           # /ready's status, by role and moment
    resumed_role: str                               # /health of the old leader on waking up
    resumed_reason: str                             # why /ready said no to it then


class Outran(Exception):
    """Before the freeze, the leader's lease lapsed (its renewals came later than the ttl
    allows): the machine was slower than the scenario's ttl, not the scenario wrong."""


def lapsed(db: Database, g1: int | None) -> str | None:
    """Why generation g1 is not the one lease of the resource, current, now; None if it is."""
    status = db.one("select coalesce(max(status), 'gone') from pgfence.lease_status "
                    "where generation = %s", (g1,))
    others = db.one("select count(*) from pgfence.leases where generation is distinct from %s",
                    (g1,))
    return None if (status, others) == ("current", 0) else (
        f"generation {g1} is {status}, and {others} other lease(s) were granted")


def fresh_database(request: pytest.FixtureRequest) -> Database:
    """A database like the `db` fixture's, dropped at the test's end."""
    cluster: Cluster = request.getfixturevalue("cluster")
    name = f"t_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name, request.getfixturevalue("template"))
    request.addfinalizer(lambda: cluster.drop_database(name))
    db = Database(cluster.dsn(name))
    request.addfinalizer(db.close)
    return db


def freeze_leader_and_resume(request: pytest.FixtureRequest, db: Database, tmp_path: Path,
                             flags: list[str], init_flags: tuple[str, ...] = (),
                             server: Path = SERVER) -> Outcome:
    """The scenario (``scenario``) on a database made ready by ``init``; run again, in a fresh
    database with twice the ttl, while the machine outruns the replicas' ttl (Outran)."""
    ttl = TTL
    while True:
        init(db, *init_flags)
        try:
            return scenario(db, tmp_path / f"ttl-{ttl:g}", flags, server, ttl)
        except Outran as e:
            if ttl >= MAX_TTL:
                raise AssertionError(f"{e}, even with a ttl of {ttl:g} s") from e
            print(f"ttl {ttl:g} s outran: {e}; run again with {2 * ttl:g} s")
            ttl *= 2
            db = fresh_database(request)


def scenario(db: Database, tmp_path: Path, flags: list[str], server: Path,
             ttl: float) -> Outcome:
    tmp_path.mkdir()
    ready: dict[str, int] = {}
    with replicas(db, tmp_path, flags, server=server, ttl=ttl) as (a, b):
        # Only one leader: started together, they settle to one leader and one standby, and
        # no health check along the way ever shows two.
        seen: list[tuple[str | None, str | None]] = []

        def settled() -> bool:
            seen.append((a.role(), b.role()))
            return set(seen[-1]) == {"leader", "standby"}

        wait_for("one leader and one standby", settled)
        old, new = (a, b) if seen[-1][0] == "leader" else (b, a)
        g1 = old.health()["generation"]
        try:
            before_the_freeze(db, old, new, g1, seen, ready, ttl)
        except Outran:
            raise
        except Exception as e:
            # A step before the freeze went otherwise than the scenario says: no verdict if
            # the leader's lease had lapsed by then.
            if (why := lapsed(db, g1)) is not None:
                raise Outran(why) from e
            raise

        # Freeze the leader; the standby takes over once the lease expires.
        os.kill(old.proc.pid, signal.SIGSTOP)
        frozen_at = db.one("select clock_timestamp()")
        if not db.one("select expires_at > %(t)s and coalesce(least(ended_at, drained_at), "
                      "'infinity') > %(t)s from pgfence.leases where generation = %(g)s",
                      {"t": frozen_at, "g": g1}):
            raise Outran("the lease had ended when the leader was frozen")
        wait_for("the standby's takeover", lambda: new.role() == "leader")
        g2 = new.health()["generation"]
        assert g2 > g1
        ready["new leader"] = new.ready()
        status, job2 = new.post("/jobs", {"spec": {"n": 2}})
        assert (status, job2["generation"]) == (201, g2)

        # The old leader wakes up and tries to mutate.
        os.kill(old.proc.pid, signal.SIGCONT)
        resumed_role = str(old.health()["role"])
        ready["resumed old leader"], answer = old.readiness()
        stale = [old.post("/jobs", {"spec": {"n": "stale"}}),
                 old.post(f"/jobs/{job2['id']}/assign", {"runner": "stale"})]
        return Outcome(db, old, new, g1, g2, stale, old.role(), new.role(),
                       db.sql(history_check()),
                       db.sql("select generation, owner, status from pgfence.lease_status "
                              "order by generation"),
                       ready, resumed_role, str(answer.get("reason")))


def before_the_freeze(db: Database, old: Replica, new: Replica, g1: int,
                      seen: list[tuple[str | None, str | None]], ready: dict[str, int],
                      ttl: float) -> None:
    """What the scenario checks while the leader holds its lease. Outran if an answer shows
    that the leader no longer trusts it (its local deadline passed: renewals came late)."""
    def trusted(answer: dict[str, Any]) -> None:
        said = json.dumps(answer)
        if any(w in said for w in ("not trusted locally", "not the leader", "lease lost")):
            raise Outran(f"the leader answered {said}")

    assert ("leader", "leader") not in seen
    assert db.one("select owner from pgfence.resource_status") == old.name
    status, answer = old.readiness()
    if status != 200:
        trusted(answer)
    ready["leader"], ready["standby"] = status, new.ready()

    # Writes through the leader succeed; through the standby they are refused.
    status, job = old.post("/jobs", {"spec": {"n": 1}})
    trusted(job)
    assert (status, job["generation"]) == (201, g1)
    status, refused = new.post("/jobs", {"spec": {"n": "via standby"}})
    assert status == 503 and refused["leader"]["owner"] == old.name
    status, assigned = old.post(f"/jobs/{job['id']}/assign", {"runner": "r-1"})
    trusted(assigned)
    assert status == 200
    assert new.health()["role"] == "standby"

    if ttl > TTL:
        # Run again with a longer ttl, which must not stand in for renewals: the leader keeps
        # its lease past its first ttl by renewing it (however long that takes).
        db.wait_until("select status <> 'current' or renewed_at > acquired_at "
                      "+ make_interval(secs => %s) from pgfence.lease_status "
                      "where generation = %s", (ttl, g1))
    if (why := lapsed(db, g1)) is not None:
        raise Outran(why)
    if old.role() != "leader":
        raise Outran("the leader no longer trusts its lease")


def assert_ready_only_on_the_leader(o: Outcome) -> None:
    """What a load balancer routing by /ready needs: 200 from the current leader only."""
    assert o.ready == {"leader": 200, "standby": 503,
                       "new leader": 200, "resumed old leader": 503}


@pytest.mark.parametrize(("server", "flags"), [(SERVER, []), (SERVER, ["--no-local-check"]),
                                               (FASTAPI, [])],
                         ids=["fenced", "database-decides", "fastapi"])
def test_resumed_old_leader_is_refused(request: pytest.FixtureRequest, db: Database,
                                       tmp_path: Path, server: Path, flags: list[str]) -> None:
    o = freeze_leader_and_resume(request, db, tmp_path, flags, server=server)
    db = o.db
    assert [status for status, _ in o.stale] == [503, 503]
    assert o.stale[0][1]["leader"]["owner"] == o.new.name
    if flags:
        # The replica still believed it led, past its own deadline: what ended its term was
        # PostgreSQL refusing its lease (its renewal, the readiness probe's fence, or the
        # write's), whichever came first after it woke.
        assert "refused" in o.resumed_reason and "expired locally" not in o.resumed_reason
    else:
        assert o.resumed_role == "standby"          # its own deadline had passed
    assert (o.old_role, o.new_role) == ("standby", "leader")
    assert o.violations == []
    # Nothing the old leader sent after the takeover was committed.
    assert db.sql("select generation, action from job_events order by id") == [
        (o.g1, "created"), (o.g1, "assigned"), (o.g2, "created")]
    assert db.sql("select state, runner from jobs order by id") == [
        ("assigned", "r-1"), ("queued", None)]
    assert o.leases == [(o.g1, o.old.name, "superseded"), (o.g2, o.new.name, "current")]
    # /ready follows the lease: leader 200, standby 503, swapped by the takeover; the resumed
    # old leader is not ready, even while it still believes it leads (--no-local-check).
    assert_ready_only_on_the_leader(o)


def test_negative_control_unfenced_stale_leader_write_lands(
        request: pytest.FixtureRequest, db: Database, tmp_path: Path) -> None:
    """Broken on purpose: replicas that write without fence(), tables in observe mode."""
    o = freeze_leader_and_resume(request, db, tmp_path, ["--unsafe-no-fence"], ("--observe",))
    db = o.db
    # The resumed old leader wrote with its old generation, next to its successor.
    assert [(status, body.get("generation")) for status, body in o.stale] == [
        (201, o.g1), (200, o.g1)]
    assert (o.old_role, o.new_role) == ("leader", "leader")
    # The history check detects both stale writes; observe mode recorded the unfenced ones.
    assert [(row[2], row[3], row[5]) for row in o.violations] == [
        ("created", o.g1, o.g2), ("assigned", o.g1, o.g2)]
    assert db.one("select count(*) from pgfence.unfenced_writes") > 0


def test_unfenced_writes_are_refused_by_enforced_tables(db: Database, tmp_path: Path) -> None:
    """Even a current leader cannot write without fence() while the tables enforce."""
    init(db)
    with replicas(db, tmp_path, ["--unsafe-no-fence"], n=1) as (only,):
        wait_for("leadership", lambda: only.role() == "leader")
        status, body = only.post("/jobs", {"spec": {}})
        assert (status, body["sqlstate"]) == (503, "PF007")
    assert db.one("select count(*) from jobs") == 0


def test_negative_control_readiness_ignoring_leadership_is_caught(
        request: pytest.FixtureRequest, db: Database, tmp_path: Path) -> None:
    """Broken on purpose: the example with a /ready that answers like /health, 200 on every
    replica. A load balancer would route writes to the standby; the readiness check fails."""
    broken = broken_server(tmp_path, "ready-is-health")
    o = freeze_leader_and_resume(request, db, tmp_path, [], server=broken)
    assert o.ready == {"leader": 200, "standby": 200,
                       "new leader": 200, "resumed old leader": 200}
    with pytest.raises(AssertionError):
        assert_ready_only_on_the_leader(o)
    assert o.violations == []                      # the fencing itself is intact


# --- the conformance check, and the example broken to fail each of its promises --------------

# Text of server.py, and what a broken variant puts instead (each must occur once).
BREAKS = {
    # /ready answered like /health: 200 on every replica.
    "ready-is-health": ("self.reply(*replica.service.readiness())",
                        "self.reply(200, {'ready': True})"),
    # /ready from the replica's own belief alone: elected and its lease trusted locally, no
    # database check.
    "ready-without-database": (
        "self.reply(*replica.service.readiness())",
        "self.reply(200 if replica.service.leads else 503, {'ready': replica.service.leads})"),
    # A standby that refuses reads as it refuses writes.
    "standby-refuses-reads": (
        'elif self.path == "/jobs":                 # reads: every replica serves them',
        'elif self.path == "/jobs" and not replica.leading():\n'
        '                    self.reply(503, {"error": "not the leader"})\n'
        '                elif self.path == "/jobs":'),
    # An assignment that does not ask whether the job is still queued.
    "assign-twice": ("where id = %s and state = 'queued' returning id",
                     "where id = %s returning id"),
}


def broken_server(tmp_path: Path, name: str) -> Path:
    """server.py with one promise broken on purpose (BREAKS), in a file of its own."""
    text = SERVER.read_text()
    old, new = BREAKS[name]
    assert text.count(old) == 1, f"{name}: the negative control is out of date"
    broken = tmp_path / f"{name}.py"
    broken.write_text(text.replace(old, new))
    return broken


def conformance(db: Database, tmp_path: Path, server: Path, *flags: str,
                ) -> tuple[int, str, str]:
    """python -m pgfence.conformance against two replicas of ``server``: exit code, output."""
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    command = shlex.join([sys.executable, str(server), "--dsn", db.dsn, *flags]) + \
        " --port {port} --name {name} --ttl {ttl} --poll 0.1"
    out = subprocess.run([sys.executable, "-m", "pgfence.conformance", "--dsn", db.dsn,
                          "--server", command, "--logs", str(logs)],
                         capture_output=True, text=True, timeout=HUNG, cwd=tmp_path)
    for log in sorted(logs.iterdir()):
        print(f"--- {log.name}\n{log.read_text()}")     # shown when the test fails
    return out.returncode, out.stdout, out.stderr


@pytest.mark.parametrize("server", [SERVER, FASTAPI], ids=["threads", "fastapi"])
def test_the_examples_pass_the_conformance_check(db: Database, tmp_path: Path,
                                                 server: Path) -> None:
    init(db)
    code, out, err = conformance(db, tmp_path, server)
    assert (code, out.splitlines()[-1]) == (0, "conformant"), out + err
    steps = [line.split(":")[0] for line in out.splitlines() if line.startswith("ok ")]
    assert steps == ["ok   one leader", "ok   /ready only on the owner", "ok   one writer",
                     "ok   a standby serves reads", "ok   /ready asks the database",
                     "ok   a frozen leader is refused after failover"]
    # In the database: the two takeovers the check's operator made (a replica stopping at
    # the end may let the other in once more), and every committed job written under the
    # lease that was current at its commit.
    assert db.one("select count(*) from pgfence.lease_status") >= 3
    assert db.sql(history_check()) == []


@pytest.mark.parametrize(("broken", "flags", "step"), [
    ("ready-without-database", [], "/ready asks the database"),
    ("standby-refuses-reads", [], "a standby serves reads"),
    (None, ["--unsafe-no-fence"], "a frozen leader is refused after failover"),
], ids=["ready-without-database", "standby-refuses-reads", "unsafe-no-fence"])
def test_negative_control_a_broken_server_fails_the_conformance_check(
        db: Database, tmp_path: Path, broken: str | None, flags: list[str], step: str) -> None:
    # The unfenced writer's tables are in observe mode: enforced, PostgreSQL would refuse it.
    init(db, *(["--observe"] if flags else []))
    server = SERVER if broken is None else broken_server(tmp_path, broken)
    code, out, err = conformance(db, tmp_path, server, *flags)
    assert code == 1, out + err
    assert err.startswith(f"FAIL {step}: "), out + err


@pytest.mark.parametrize("server", [SERVER, FASTAPI], ids=["threads", "fastapi"])
def test_a_job_is_assigned_once(db: Database, tmp_path: Path, server: Path) -> None:
    assert assignments(db, tmp_path, server) == (1, 1)


def test_negative_control_an_assignment_that_ignores_the_jobs_state(db: Database,
                                                                  tmp_path: Path) -> None:
    accepted, recorded = assignments(db, tmp_path, broken_server(tmp_path, "assign-twice"))
    assert accepted > 1 and recorded == accepted


def assignments(db: Database, tmp_path: Path, server: Path, racers: int = 8) -> tuple[int, int]:
    """One job, ``racers`` assignments of it sent at once to the leader: how many were
    accepted, and how many the history recorded."""
    init(db)
    with replicas(db, tmp_path, [], n=1, server=server) as (only,):
        wait_for("leadership", lambda: only.role() == "leader")
        status, job = only.post("/jobs", {"spec": {}})
        assert status == 201
        with ThreadPoolExecutor(racers) as pool:
            answers = list(pool.map(
                lambda i: only.post(f"/jobs/{job['id']}/assign", {"runner": f"r-{i}"})[0],
                range(racers)))
    assert set(answers) <= {200, 409}, answers
    runners = db.sql("select runner from jobs")
    assert len(runners) == 1 and runners[0][0] is not None
    return answers.count(200), db.one(
        "select count(*) from job_events where action = 'assigned'")
