"""One schedule from start to verdict.

A fresh database cloned from the cluster's template gets the campaign's tables (and, for a
negative control, its broken functions). Process workers take their slots; a starter thread
calls ``request_start`` and starts an invocation worker for each id it gets, and runs
``requeue_expired``; a feeder thread enqueues tasks while faults are applied. The injector
applies the schedule; then the supervisor waits for the queue to empty, drains every worker
with SIGTERM, and hands the database to the checker.

The layers' fleet works a pgmq queue and a pgflow flow instead: the feeder sends messages
(``pgmq.send``) and starts runs (``pgflow.start_flow``), and every worker is an invocation
worker. On pgflow 0.14.1 each schedule's database is the cluster's pg_cron database, made
afresh (pg_cron's extension lives in that one database, so it cannot be cloned); pgflow's own
jobs are paused there: the starter is the cron.
"""

from __future__ import annotations

import itertools
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg

from pgfence.connection import connect
from testkit import install
from testkit.cluster import LOOPBACK, USER, Cluster
from tests.pgflow14 import CRON_DATABASE, install_pgflow14

from . import database
from .checker import Violation, check
from .database import Db
from .faults import Injector, wait_for
from .fleet import Fleet
from .schedule import FLOW, LAYERS, Settings, make_schedule
from .variants import Variant


@dataclass
class Outcome:
    variant: str
    seed: str
    applied: Counter[str] = field(default_factory=Counter)
    missed: Counter[str] = field(default_factory=Counter)
    figures: dict[str, int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)
    seconds: float = 0.0

    def by_invariant(self) -> Counter[str]:
        return Counter(v.invariant for v in self.violations)


class Campaign:
    """Runs schedules on one cluster of its own (the campaign restarts the server), each
    schedule in a database cloned from campaign_template (pgfence from the one-file install;
    for the layers' fleet, with pgmq, pgflow and the layers), with a PgBouncer of its own in
    front. For the layers' fleet on pgflow 0.14.1, the cluster must preload pg_cron
    (tests/pgflow14.py: CRON_SETTINGS)."""

    def __init__(self, cluster: Cluster, s: Settings, logs: Path,
                 say: Callable[[str], None] = lambda _: None) -> None:
        self.cluster = cluster
        self.s = s
        self.logs = logs
        self.say = say
        self._numbers = itertools.count(1)
        self.bouncer = cluster.pgbouncer()
        # The Deno isolates' module cache: filled by the first one, read by the others.
        self.deno_dir = Path(tempfile.mkdtemp(prefix="deno.", dir=cluster.dir))
        if s.fleet == "layers" and s.pgflow == "0.14.1":
            return                          # each schedule installs its own (_database)
        cluster.create_database("campaign_template")
        if s.fleet == "layers":
            install.install(cluster, "campaign_template", ["pgflow"])
        else:
            install.core(cluster, "campaign_template")

    def run(self, variant: Variant, seed: str, patience: float = 1.0) -> Outcome:
        """One schedule; the injector's waits bounded by ``patience`` times the settings'."""
        saved, self.s = self.s, replace(self.s, patience=patience)
        try:
            return self._timed(variant, seed)
        finally:
            self.s = saved

    def _timed(self, variant: Variant, seed: str) -> Outcome:
        began = time.monotonic()
        label = f"campaign_{next(self._numbers)}_{variant.name.replace('-', '_')}"
        name = self._database(label)
        try:
            outcome = self._run(variant, seed, name, label)
        finally:
            self.cluster.drop_database(name)
        outcome.seconds = time.monotonic() - began
        return outcome

    def _database(self, label: str) -> str:
        """The schedule's database: ``label``, a clone of the template, or on pgflow 0.14.1 the
        cron database made afresh (see the module's docstring)."""
        c = self.cluster
        if self.s.fleet == "layers" and self.s.pgflow == "0.14.1":
            c.drop_database(CRON_DATABASE)
            c.create_database(CRON_DATABASE)
            with tempfile.TemporaryDirectory() as tmp:
                install_pgflow14(c, CRON_DATABASE, Path(tmp))
            install.install(c, CRON_DATABASE, ["pgflow"], with_prerequisites=False)
            c.psql(CRON_DATABASE, "-c", "select pgfence_pgflow.setup_cron()",
                   "-c", "update cron.job set active = false")
            return CRON_DATABASE
        c.create_database(label, "campaign_template")
        return label

    def _run(self, variant: Variant, seed: str, name: str, label: str) -> Outcome:
        s, cluster = self.s, self.cluster
        dsn = cluster.dsn(name)
        with connect(dsn, "supervisor") as conn:
            if s.fleet == "layers":
                self._layers(conn)
            database.install(conn, {r: LAYERS[r] if s.fleet == "layers" else "core"
                                    for r in s.resources},
                             protect=not variant.advisory, queue=s.queue, flow=FLOW)
        variant.install(dsn)
        db = Db(dsn, "supervisor")
        outcome = Outcome(variant.name, seed)
        schedule = make_schedule(seed, s)
        self.logs.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{label}.log").open("w") as log:
            def note(line: str) -> None:
                log.write(f"{time.strftime('%H:%M:%S')} supervisor: {line}\n")
                log.flush()
                self.say(line)

            note(f"{label}: variant {variant.name}, seed {seed!r}, {len(schedule)} events, "
                 f"patience {s.patience:g}")
            # The advisory control's "lease" is a lock taken through PgBouncer: every route
            # of it goes there.
            bouncer = self.bouncer.port
            direct = bouncer if variant.advisory else cluster.port
            fleet = Fleet(s, lambda port: cluster.tcp_dsn(name, port),
                          {"direct": direct, "pgbouncer": bouncer}, variant.advisory, log,
                          lambda port, app: f"postgres://{USER}@{LOOPBACK}:{port}/{name}"
                                            f"?application_name={app}", self.deno_dir)
            stop_feeding, stop_starting = threading.Event(), threading.Event()
            feeder = threading.Thread(target=self._feed, args=(Db(dsn, "feeder"), stop_feeding),
                                      daemon=True)
            starter = threading.Thread(target=self._start,
                                       args=(Db(dsn, "starter"), fleet, stop_starting),
                                       daemon=True)
            threads = [] if variant.advisory else [feeder, starter]
            if not variant.advisory:
                for _ in range(s.initial_tasks):
                    self._enqueue(db)
            for t in threads:
                t.start()
            try:
                self._warm_up(db)
                injector = Injector(db, fleet, cluster, self.bouncer, s)
                for ev in schedule:
                    time.sleep(ev.gap)
                    target = injector.apply(ev)
                    (outcome.applied if target else outcome.missed)[ev.kind] += 1
                    note(f"{ev}: {target or 'missed'}")
                stop_feeding.set()
                if not variant.advisory:
                    feeder.join()           # its last enqueue committed: the queue is complete
                    settled = wait_for(lambda: not db.one(
                        "select count(*) from campaign.tasks "
                        "where state not in ('completed', 'failed')"),
                        s.progress_bound + 2, every=0.2)
                    note("queue empty" if settled else "queue not empty at the progress bound")
            finally:
                stop_feeding.set()
                stop_starting.set()
                for t in threads:
                    t.join()
                fleet.stop()
            outcome.violations, outcome.figures = check(db, s.progress_bound)
            for v in outcome.violations[:20]:
                note(f"violation {v}")
        db.close()
        return outcome

    def _warm_up(self, db: Db) -> None:
        """Starts the schedule once every resource has an owner (or after 15 s, times the
        patience)."""
        wait_for(lambda: db.one("select count(distinct resource) from campaign.authority")
                 == len(self.s.resources), 15.0 * self.s.patience, every=0.1)

    def _layers(self, conn: psycopg.Connection[Any]) -> None:
        """The layers' queue and flow: pgmq queue ``queue``, pgflow flow FLOW (first ->
        second) as the isolates' DSL defines it, which their start verifies (0.8.1) or finds
        compiled (0.14.1: ensure_flow_compiled)."""
        s = self.s
        conn.execute("select pgmq.create(%s)", (s.queue,))
        conn.execute("select pgflow.create_flow(%s, max_attempts => %s, base_delay => 1, "
                     "timeout => %s)", (FLOW, s.max_attempts, s.flow_timeout))
        conn.execute("select pgflow.add_step(%s, 'first')", (FLOW,))
        conn.execute("select pgflow.add_step(%s, 'second', array['first'])", (FLOW,))

    def _enqueue(self, db: Db) -> None:
        if self.s.fleet == "layers":
            db.sql("select pgmq.send(%s, '{}'), pgflow.start_flow(%s, '{}')",
                   (self.s.queue, FLOW))
        else:
            db.sql("select pgfence.enqueue(%s, '{}', %s)", (self.s.queue, self.s.max_attempts))

    def _feed(self, db: Db, stop: threading.Event) -> None:
        while not stop.wait(self.s.enqueue_every):
            self._enqueue(db)
        db.close()

    def _start(self, db: Db, fleet: Fleet, stop: threading.Event) -> None:
        """The startup handshake: at most one pending start per resource, the database says."""
        # The layers' workers all go through PgBouncer.
        routes = itertools.cycle(("direct", "pgbouncer") if self.s.fleet == "core"
                                 else ("pgbouncer",))
        ttl = 3.0 * self.s.patience          # time to start a worker and acquire
        while not stop.wait(0.5):
            db.sql("select pgfence.requeue_expired()")
            for r in self.s.resources:
                invocation = db.one("select pgfence.request_start(%s, make_interval(secs => %s))",
                                    (r, ttl))
                if invocation is not None:
                    fleet.start_invocation(r, invocation, next(routes))
        db.close()
