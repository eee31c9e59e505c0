"""Ownership under interleavings: I1 one owner, I2 fenced writes, I3 monotonic tokens,
I4 own lease only, I7 clocks decide liveness, never safety.

Each scenario returns what happened; the test asserts the invariant, and its negative control
runs the same scenario against a deliberately broken copy of the real function and asserts
that the invariant check notices.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from testkit.harness import Database, Lease, Session, sqlstate
from tests.support import acquired


def protected_table(db: Database, resource: str = "r") -> None:
    db.sql("create table audit (generation bigint, written_by text)")
    db.sql("grant all on audit to public")
    db.sql("select pgfence.protect('audit', %s)", (resource,))


# --------------------------------------------------------------------------------------------
# I1: concurrent acquirers, exactly one winner


def racing_acquirers(db: Database, n: int = 6) -> list[Lease]:
    """The first of n sessions acquires inside an open transaction; the others race it."""
    db.sql("select pgfence.register('r')")
    first, *others = [db.session(f"s{i}") for i in range(n)]
    first.begin()
    lease = first.acquire("r")
    steps = [s.start("select * from pgfence.acquire('r', %s, '30 seconds')", (s.name,))
             for s in others]
    for step in steps:
        step.settle()
    first.commit()
    rows = [step.result()[0] for step in steps]
    return [x for x in [lease, *(Lease(*r) for r in rows if r[0] is not None)] if x]


def test_racing_acquirers_one_winner(db: Database) -> None:
    winners = racing_acquirers(db)
    assert len(winners) == 1
    assert db.one("select count(*) from pgfence.lease_status where status = 'current'") == 1


def test_negative_control_acquire_without_locks_lets_two_win(db: Database) -> None:
    # Broken: no lock on the resource row, and the unique index behind it gone.
    db.install_mutant("acquire-no-lock")
    db.sql("drop index pgfence.leases_one_active")
    assert len(racing_acquirers(db)) > 1


def takeover_racing_a_renewal(db: Database) -> tuple[Lease | None, str]:
    """The owner renews inside a transaction just before its lease expires, and commits after
    the expiry; meanwhile a standby, which saw the lease expired, waits for the lease row.
    Returns what the standby got and the state of the owner's lease afterwards."""
    db.sql("select pgfence.register('r')")
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("r"))
    # The renewal must come before the expiry, however slow the machine: a margin that the
    # work outran is given again, longer (a verdict never rests on how fast this runs).
    margin = 1.0
    while True:
        db.sql("update pgfence.leases set expires_at = clock_timestamp() "
               "+ make_interval(secs => %s) where lease_id = %s", (margin, la.lease_id))
        a.begin()
        if sqlstate(lambda: a.renew(la, ttl="30 seconds")) is None:
            # Written before the expiry, committed after it: open across a margin that may
            # outlast renew's idle limit (5 s), which would end the transaction first.
            a.hold_open()
            break
        a.rollback()
        margin *= 4
    db.wait_until("select clock_timestamp() > expires_at from pgfence.leases "
                  "where lease_id = %s", (la.lease_id,))
    step = b.start("select * from pgfence.acquire('r', 'b', '30 seconds')")
    assert step.settle() and a.pid in step.blocked_by, "the takeover must wait for the renewal"
    a.commit()
    row = step.result()[0]
    state = db.one("select status from pgfence.lease_status where generation = %s",
                   (la.generation,))
    return (Lease(*row) if row[0] else None), str(state)


def test_takeover_judged_after_its_lock_wait_leaves_a_renewed_lease(db: Database) -> None:
    # Judged on the row as it is after the wait: renewed, so current, so no takeover (I1, I7).
    assert takeover_racing_a_renewal(db) == (None, "current")


def test_negative_control_takeover_judged_before_its_lock_wait(db: Database) -> None:
    # The re-check after the lock wait left out: the takeover trusts its look before the wait.
    db.install_mutant("acquire-no-recheck-after-wait")
    successor, state = takeover_racing_a_renewal(db)
    assert successor is not None and state == "superseded", "a renewed lease was taken over"


# --------------------------------------------------------------------------------------------
# I2: a takeover waits for the old owner's open fenced transaction


@dataclass
class Takeover:
    blocked: bool
    blocked_by_owner: bool
    old_write_committed: bool
    successor: Lease


def takeover_during_fenced_transaction(db: Database) -> Takeover:
    db.sql("select pgfence.register('r')")
    protected_table(db)
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("r"))
    a.begin()
    generation = a.fence(la)
    db.expire(la)                                   # A pauses past its ttl, transaction open
    step = b.start("select * from pgfence.acquire('r', 'b', '30 seconds')")
    blocked = step.settle()
    blocked_by_owner = a.pid in step.blocked_by
    a.run("insert into audit values (%s, 'a')", (generation,))
    a.commit()
    row = step.result()[0]
    return Takeover(blocked, blocked_by_owner,
                    db.one("select count(*) from audit where written_by = 'a'") == 1,
                    Lease(*row) if row[0] else None)  # type: ignore[arg-type]


def test_takeover_waits_for_open_fenced_transaction(db: Database) -> None:
    t = takeover_during_fenced_transaction(db)
    assert t.blocked and t.blocked_by_owner, "the successor must wait for A's fenced transaction"
    assert t.old_write_committed
    assert t.successor is not None, "once A's transaction ended, the expired lease is taken over"
    # The old generation's write committed before the successor's lease: commit order.
    order = db.sql("""
        select (select pg_xact_commit_timestamp(xmin) from audit)
             < (select pg_xact_commit_timestamp(xmin) from pgfence.leases
                 where lease_id = %s)""", (t.successor.lease_id,))
    assert order == [(True,)]


def test_negative_control_fence_without_row_lock(db: Database) -> None:
    db.install_mutant("hold-current-no-lock")
    t = takeover_during_fenced_transaction(db)
    assert not t.blocked, "without the lock the successor is granted while A's transaction is open"


def renewal_during_fenced_transaction(db: Database) -> bool:
    """Whether the owner's renewal blocks behind its own long fenced transaction."""
    db.sql("select pgfence.register('r')")
    work, heartbeat = db.session("work"), db.session("heartbeat")
    lease = acquired(work.acquire("r"))
    work.begin()
    work.fence(lease)
    step = heartbeat.start("select * from pgfence.renew(%s, '30 seconds')", (lease.lease_id,))
    blocked = step.settle()
    work.commit()
    assert step.result()[0][1] == "active"
    return blocked


def test_renewal_does_not_wait_for_fenced_transaction(db: Database) -> None:
    assert renewal_during_fenced_transaction(db) is False


def test_negative_control_fence_with_exclusive_lock_blocks_renewal(db: Database) -> None:
    db.install_mutant("hold-current-for-update")
    assert renewal_during_fenced_transaction(db) is True




def drain_draining(s: Session, lease: Lease) -> None:
    assert s.drain(lease) == "draining"


def renewal_waiting_across_expiry(db: Database) -> tuple[str | None, bool]:
    """The owner renews while another transaction holds the lease row locked without changing
    it (a repeated drain), and the lease expires before that transaction ends. Returns the
    renewal's SQLSTATE (None if it succeeded) and whether the lease is current afterwards."""
    db.sql("select pgfence.register('r')")
    owner, other = db.session("owner"), db.session("other")
    lease = acquired(owner.acquire("r"))
    owner.drain(lease)
    live = "select expires_at > clock_timestamp() from pgfence.leases where lease_id = %s"
    # The renewal must be queued before the expiry, however slow the machine: a margin that
    # the work outran is given again, longer (a verdict never rests on how fast this runs).
    margin = 2.0
    while True:
        db.sql("update pgfence.leases set expires_at = clock_timestamp() "
               "+ make_interval(secs => %s) where lease_id = %s", (margin, lease.lease_id))
        other.begin()
        # FOR UPDATE on the lease row; changes nothing. Refused if the expiry came first.
        step = None
        if sqlstate(lambda: drain_draining(other, lease)) is None:
            # Open until the lease expired: a margin that may outlast drain's idle limit (5 s).
            other.hold_open()
            step = owner.start("select * from pgfence.renew(%s, '30 seconds')",
                               (lease.lease_id,))
            blocked = step.settle()
            if db.one(live, (lease.lease_id,)):
                assert blocked, "the renewal must wait for the row lock"
                break                            # queued before the expiry
        other.rollback()
        if step is not None:
            sqlstate(step.result)                # came after the expiry (refused)
        margin *= 4                              # try with more time
    db.wait_until("select not (" + live + ")", (lease.lease_id,))
    other.commit()
    return sqlstate(step.result), db.one(live, (lease.lease_id,))


def test_renewal_that_waited_across_expiry_is_refused(db: Database) -> None:
    assert renewal_waiting_across_expiry(db) == ("PF001", False), "expiry is final"


def test_negative_control_renewal_judged_before_its_lock_wait(db: Database) -> None:
    db.install_mutant("renew-expiry-unchecked-after-wait")
    assert renewal_waiting_across_expiry(db) == (None, True), "the expired lease came back"


# --------------------------------------------------------------------------------------------
# Paused owner A, expired, B admitted, A resumed: everything A tries is refused (I2, I4)


@dataclass
class Resumed:
    renew: str | None
    fence: str | None
    fenced_write: str | None
    unfenced_write: str | None
    drain: str | None
    release: bool
    successor_intact: bool


def resumed_owner(db: Database) -> Resumed:
    db.sql("select pgfence.register('r')")
    protected_table(db)
    a, b = db.session("a"), db.session("b")
    la = acquired(a.acquire("r"))
    db.expire(la)                                          # A is paused
    lb = acquired(b.acquire("r"))
    assert lb.generation > la.generation

    def attempt(*steps: tuple[str, tuple[object, ...]]) -> str | None:
        """Runs the steps in one transaction; the SQLSTATE that stopped it, or None."""
        try:
            a.begin()
            for query, params in steps:
                a.run(query, params)
            a.commit()
            return None
        except psycopg.Error as e:
            a.rollback()
            return e.sqlstate

    fence = ("select pgfence.fence(%s)", (la.lease_id,))
    write = ("insert into audit values (1, 'a')", ())
    out = Resumed(
        renew=attempt(("select pgfence.renew(%s, '30 seconds')", (la.lease_id,))),
        fence=attempt(fence),
        fenced_write=attempt(fence, write),
        unfenced_write=attempt(write),
        drain=attempt(("select pgfence.drain(%s)", (la.lease_id,))),
        release=a.release(la),
        successor_intact=False,
    )
    # B, the current owner, is untouched and works.
    b.renew(lb)
    b.begin()
    b.fence(lb)
    b.run("insert into audit values (%s, 'b')", (lb.generation,))
    b.commit()
    out.successor_intact = (
        db.one("select status from pgfence.lease_status where generation = %s", (lb.generation,))
        == "current"
        and db.sql("select written_by from audit") == [("b",)]
        and b.release(lb) is True
    )
    return out


def test_resumed_owner_is_refused_everything(db: Database) -> None:
    r = resumed_owner(db)
    assert r == Resumed(renew="PF001", fence="PF001", fenced_write="PF001",
                        unfenced_write="PF007", drain="PF001", release=False,
                        successor_intact=True)


def test_negative_control_fence_ignoring_lease_state(db: Database) -> None:
    db.install_mutant("hold-current-ignores-state")
    r = resumed_owner(db)
    assert r.fence is None and r.fenced_write is None, "the stale owner got through"
    assert not r.successor_intact


# --------------------------------------------------------------------------------------------
# I7: expiry is judged by the clock at the check, not by the transaction's start


def fence_after_expiry_in_old_transaction(db: Database) -> str | None:
    db.sql("select pgfence.register('r')")
    a = db.session("a")
    la = acquired(a.acquire("r"))
    a.begin()
    started = a.one("select now()")
    # The lease runs out a moment after A's transaction started; wait (by polling the clock,
    # not by sleeping a guessed time) until that moment has passed.
    db.sql("update pgfence.leases set expires_at = %s + interval '1 millisecond' "
           "where lease_id = %s", (started, la.lease_id))
    db.wait_until("select clock_timestamp() > %s + interval '1 millisecond'", (started,))
    try:
        return sqlstate(lambda: a.fence(la))
    finally:
        a.rollback()


def test_expiry_judged_on_clock_timestamp(db: Database) -> None:
    assert fence_after_expiry_in_old_transaction(db) == "PF001"


def test_negative_control_expiry_judged_on_now(db: Database) -> None:
    db.install_mutant("is-current-now")
    assert fence_after_expiry_in_old_transaction(db) is None


# --------------------------------------------------------------------------------------------
# I3: generations never repeat, even when a resource is dropped and registered again


def generations_across_reregistration(db: Database) -> list[int]:
    s = db.session("s")
    db.sql("select pgfence.register('r')")
    seen = []
    for _ in range(3):
        lease = acquired(s.acquire("r"))
        seen.append(lease.generation)
        s.release(lease)
    # Someone deletes the resource and its history by hand, then registers it again.
    db.sql("delete from pgfence.leases where resource = 'r'")
    db.sql("delete from pgfence.resources where resource = 'r'")
    db.sql("select pgfence.register('r')")
    lease = acquired(s.acquire("r"))
    seen.append(lease.generation)
    return seen


def test_generations_strictly_increase_across_reregistration(db: Database) -> None:
    seen = generations_across_reregistration(db)
    assert seen == sorted(set(seen)), seen


def test_negative_control_per_resource_counter_repeats(db: Database) -> None:
    db.install_mutant("generation-per-resource")
    seen = generations_across_reregistration(db)
    assert seen != sorted(set(seen)), seen


def test_checks_compare_lease_id_not_generation(db: Database) -> None:
    """A lease_id is the capability: a reissued generation number cannot pass for it."""
    db.sql("select pgfence.register('r')")
    a = db.session("a")
    la = acquired(a.acquire("r"))
    db.expire(la)
    lb = acquired(a.acquire("r", owner="b"))
    # Simulate a failover that reissued A's generation number to the new lease.
    db.sql("update pgfence.leases set generation = -generation where lease_id = %s",
           (la.lease_id,))
    db.sql("update pgfence.leases set generation = %s where lease_id = %s",
           (la.generation, lb.lease_id))
    assert sqlstate(lambda: a.fence(la)) == "PF001"
    assert a.fence(lb) == la.generation


# --------------------------------------------------------------------------------------------
# Renewals are HOT updates: a busy lease table does not bloat


def hot_share_after_renewals(db: Database, n: int = 300) -> float:
    s = db.session("s")
    db.sql("select pgfence.register('r')")
    lease = acquired(s.acquire("r"))
    for _ in range(n):
        s.renew(lease)
    s.run("select pg_stat_force_next_flush()")
    s.close()
    db.sql("select pg_stat_clear_snapshot()")
    hot, total = db.sql("select n_tup_hot_upd, n_tup_upd from pg_stat_user_tables "
                        "where relid = 'pgfence.leases'::regclass")[0]
    assert total >= n
    return float(hot) / float(total)


def test_renewals_are_hot_updates(db: Database) -> None:
    assert hot_share_after_renewals(db) >= 0.95


def test_negative_control_indexed_expiry_defeats_hot(db: Database) -> None:
    db.sql("create index on pgfence.leases (expires_at)")
    assert hot_share_after_renewals(db) < 0.5


# --------------------------------------------------------------------------------------------
# The guard's marker is a proof of this transaction's fence, not a name anyone can write


def replayed_marker(db: Database) -> str | None:
    """A marker taken from a transaction that fenced, replayed in one that did not."""
    db.sql("select pgfence.register('r')")
    protected_table(db)
    a = db.session("a")
    la = acquired(a.acquire("r"))
    a.begin()
    a.fence(la)
    marker = a.one("select current_setting('pgfence.fenced')")
    a.commit()
    intruder = db.session("intruder")
    intruder.begin()
    intruder.run("select set_config('pgfence.fenced', %s, true)", (marker,))
    try:
        intruder.run("insert into audit values (0, 'intruder')")
        intruder.commit()
        return None
    except psycopg.Error as e:
        intruder.rollback()
        return e.sqlstate


def test_replayed_marker_is_refused(db: Database) -> None:
    assert replayed_marker(db) == "PF007"


def test_negative_control_marker_of_resource_names(db: Database) -> None:
    db.install_mutant("fence-token-replayable")
    assert replayed_marker(db) is None
