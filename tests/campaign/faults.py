"""The fault injector: applies one scheduled event at a time, then records it.

Each fault is applied and healed before the next one starts. A fault that finds nothing to
act on (no owner to pause, no answer to lose in time) is counted as missed, not applied.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

from testkit.cluster import Cluster, PgBouncer

from .database import Db
from .fleet import Fleet, WorkerProcess
from .schedule import LAYERS, Event, Settings

T = TypeVar("T")


def choose(items: Sequence[T], pick: float) -> T | None:
    return items[int(pick * len(items))] if items else None


def wait_for(condition: Callable[[], bool], timeout: float, every: float = 0.02) -> bool:
    """Polls ``condition`` (an observation of another process) until true or ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


class Injector:
    def __init__(self, db: Db, fleet: Fleet, cluster: Cluster, bouncer: PgBouncer,
                 s: Settings) -> None:
        self.db = db
        self.fleet = fleet
        self.cluster = cluster
        self.bouncer = bouncer
        self.s = s

    def apply(self, ev: Event) -> str | None:
        """Applies and heals ``ev``; returns what it hit, or None when it missed."""
        started: datetime = self.db.one("select clock_timestamp()")
        if ev.kind.startswith("pause-"):
            target = self.pause(ev, ev.kind.removeprefix("pause-"))
        else:
            target = getattr(self, ev.kind)(ev)
        if target is not None:
            self.db.sql("insert into campaign.faults (kind, target, started_at) "
                        "values (%s, %s, %s)", (ev.kind, target, started))
        return target

    # -- targets -----------------------------------------------------------------------------
    def owner(self, resource: str, wait: float = 3.0) -> WorkerProcess | None:
        """The process of ours that holds the resource's current lease; after a takeover or a
        restart there may be none for a moment, so it waits up to ``wait`` seconds (times the
        settings' patience)."""
        found: list[WorkerProcess] = []

        def look() -> bool:
            # In the advisory control every holder believes it owns: take the latest.
            name = self.db.one("select owner from campaign.authority where resource = %s "
                               "and (kind = 'advisory' or ended_at > clock_timestamp()) "
                               "order by acquired_at desc limit 1", (resource,))
            p = self.fleet.by_name(name) if name else None
            found[:] = [p] if p else []
            return bool(found)

        wait_for(look, wait * self.s.patience, every=0.05)
        return found[0] if found else None

    def owner_or_any(self, ev: Event) -> WorkerProcess | None:
        return self.owner(ev.resource) or choose(self.fleet.living(ev.resource), ev.pick)

    # -- processes ---------------------------------------------------------------------------
    def stop(self, ev: Event) -> str | None:
        """SIGSTOP an owner for longer than its lease, then SIGCONT."""
        p = self.owner_or_any(ev)
        if p is None:
            return None
        p.signal(signal.SIGSTOP)
        time.sleep(ev.duration)
        p.signal(signal.SIGCONT)
        return p.name

    def kill(self, ev: Event) -> str | None:
        p = self.owner_or_any(ev) if ev.param == "owner" else choose(
            self.fleet.living(ev.resource), ev.pick)
        if p is None:
            return None
        p.signal(signal.SIGKILL)
        return p.name

    def terminate(self, ev: Event) -> str | None:
        """pg_terminate_backend of every backend serving the worker (through PgBouncer: the
        server connections it used last)."""
        p = self.owner_or_any(ev)
        if p is None:
            return None
        n = self.db.one("select count(pg_terminate_backend(pid)) from pg_stat_activity "
                        "where application_name = %s or application_name like %s",
                        (p.name, p.name + "-%"))
        return f"{p.name} ({n} backends)" if n else None

    def pause(self, ev: Event, point: str) -> str | None:
        """The owner stops itself at a point of its handler (see worker.py); resumed when the
        moment that point is about has come, or after a timeout."""
        p = self.paused_owner(ev.resource, point)
        if p is None:
            return None
        begun = time.monotonic()
        lease = self.db.sql("select generation, lease_id from campaign.authority "
                            "where owner = %s order by acquired_at desc limit 1", (p.name,))
        generation, lease_id = lease[0] if lease else (None, None)
        if point == "before-fence":
            # Just after its lease expired by the database's clock, before a standby's next
            # poll takes over: does fence judge expiry by the clock of now? Sleeps until then
            # and asks again (a renewal sent before the pause may have landed meanwhile).
            deadline = time.monotonic() + (self.s.ttl + 2) * self.s.patience
            while time.monotonic() < deadline:
                left = self.db.one(
                    "select extract(epoch from expires_at + make_interval(secs => %s) "
                    "- clock_timestamp()) from pgfence.leases where lease_id = %s",
                    (float(ev.param), lease_id))
                if left is None or left <= 0:
                    break
                time.sleep(float(left))
        elif point == "in-fence":
            # Until a successor holds the resource (never, while fence's lock holds it off).
            wait_for(lambda: bool(self.db.one(
                "select exists (select from campaign.authority where resource = %s "
                "and generation > %s)", (ev.resource, generation))),
                (self.s.ttl + self.s.poll + 0.5) * self.s.patience)
        else:
            # Until the task whose handler wrote was claimed (read, started) again: its result
            # then comes from a stale attempt.
            held = self.db.sql(
                "select a.task_id, a.attempt from campaign.attempts a "
                "where a.lease_id = %s and a.open and exists (select from campaign.runs w "
                "where w.task_id = a.task_id and w.attempt = a.attempt) "
                "order by a.since desc limit 1", (lease_id,))
            if held:
                task_id, attempt = held[0]
                wait_for(lambda: bool(self.db.one(
                    "select exists (select from campaign.attempts "
                    "where task_id = %s and attempt > %s)", (task_id, attempt))),
                    (self.held(ev.resource) + self.s.ttl + 2) * self.s.patience)
        p.signal(signal.SIGCONT)
        return f"{p.name} for {time.monotonic() - begun:.1f}s"

    def held(self, resource: str) -> float:
        """How long a claim hides its task from other claims: a Python worker's claim or read,
        its batch's handlers in a row (the client's hold: qty * visibility); a pgflow start,
        the step's timeout + 2 s."""
        if self.s.fleet == "layers" and LAYERS[resource] == "pgflow":
            return self.s.flow_timeout + 2
        return self.s.qty * self.s.visibility

    def paused_owner(self, resource: str, point: str) -> WorkerProcess | None:
        """Arms the current owner; an owner that loses the lease before it reaches the point is
        disarmed and the next one armed, for up to 10 seconds (times the patience)."""
        patience = self.s.patience
        deadline = time.monotonic() + 10 * patience
        while time.monotonic() < deadline:
            p = self.owner(resource)
            if p is None:
                continue
            p.forget_answers()              # a late answer to an earlier arm
            p.tell(f"pause {point}")
            answer = p.answer(timeout=3.0 * patience)
            if answer is None:
                p.tell("disarm")
                answer = p.answer(timeout=5.0 * patience)
            if answer == f"paused {point}" and wait_for(p.stopped, 5.0 * patience):
                return p
        return None

    # -- network -----------------------------------------------------------------------------
    def drop(self, ev: Event) -> str | None:
        """Loses the first answer to the event's message that passes a relay. Only an owner
        sends COMMIT, renew and claim: when no relayed worker owns, a standby's acquire."""
        current = {name for (name,) in self.db.sql(
            "select owner from campaign.authority "
            "where kind = 'pgfence' and ended_at > clock_timestamp()")}
        owning = [p.slot.relay for p in self.fleet.living()
                  if p.slot.relay is not None and p.name in current]
        pattern = ev.param if owning or ev.param == "pgfence.acquire" else "pgfence.acquire"
        relays = owning if pattern != "pgfence.acquire" else self.fleet.relays()
        for r in relays:
            r.arm(pattern)
        wait_for(lambda: any(r.dropped.is_set() for r in relays), 4.0 * self.s.patience)
        for r in relays:
            r.disarm()
        hit = [r.name for r in relays if r.dropped.is_set()]
        return f"answer to {pattern} on {', '.join(hit)}" if hit else None

    def partition(self, ev: Event) -> str | None:
        relay = self.fleet.relay_of(ev.resource)
        if relay is None:
            return None
        relay.partition()
        time.sleep(ev.duration)
        relay.heal()
        return relay.name

    def pooler(self, ev: Event) -> str | None:
        """PgBouncer killed and started again: every connection through it drops at once."""
        self.bouncer.restart()
        return "PgBouncer kill -9 and restart"

    # -- database and operator ---------------------------------------------------------------
    def restart(self, ev: Event) -> str | None:
        self.cluster.restart()
        return "pg_ctl restart -m immediate"

    def deprecate(self, ev: Event) -> str | None:
        lease = self.db.one("select pgfence.deprecate(%s)", (ev.resource,))
        return ev.resource if lease else None

    def update(self, ev: Event) -> str | None:
        """An operator's update window over the resource: prepare, wait, finish."""
        token = self.db.one("select pgfence.prepare_update(%s, %s)",
                            ([ev.resource], uuid.UUID(ev.param)))
        time.sleep(ev.duration)
        verdicts = self.db.sql("select verdict from pgfence.update_status(%s)", (token,))
        self.db.sql("select * from pgfence.finish_update(%s)", (token,))
        return f"window {ev.duration:.1f}s ({', '.join(sorted({v for (v,) in verdicts}))})"
