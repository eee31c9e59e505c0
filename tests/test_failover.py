"""Failover to an asynchronous streaming replica (I3: lease ids are compared, not generations).

A replica of the test cluster (pg_basebackup) follows the primary until replication is cut.
An owner then acquires and writes, fenced, on the primary: commits the replica never gets.
The replica is promoted, as after the loss of the primary, and a new owner acquires there. The
sequence behind generations lost its advance with those commits, so the new owner gets the
same generation number as the old one; the old owner's lease id must still be refused on the
new primary, and its writes with it. The negative control runs the same failover with lease
ids derived from (resource, generation), i.e. generations compared: the old owner gets in.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from testkit.cluster import STARTED_WITHIN, Cluster, as_postgres, free_port, stop_server
from testkit.harness import Database, Lease, sqlstate


class Replica:
    """A hot standby of the test cluster, streaming asynchronously, in the cluster's dir (so
    that removing the cluster stops it too if the run is killed), on a port of its own."""

    def __init__(self, cluster: Cluster, primary: Database, database: str) -> None:
        self.cluster = cluster
        self.primary = primary
        self.database = database
        self.name = f"replica_{uuid.uuid4().hex[:8]}"
        self.data = cluster.dir / self.name
        self.port = free_port()
        self._db: Database | None = None

    @property
    def db(self) -> Database:
        """The replica's copy of the test database (the new primary once promoted)."""
        assert self._db is not None, "the replica is not started"
        return self._db

    def start(self) -> None:
        self.primary.sql("create table failover_marker (marker uuid)")  # in the base backup
        # A slot of its own: the primary keeps the WAL the replica has not received yet,
        # however much the other tests of the run write (without one, a checkpoint may remove
        # a segment before the replica streams it, and it never catches up).
        as_postgres(self.cluster.tool("pg_basebackup"), "-D", self.data,
                    "-d", self.cluster.dsn("postgres"), "-X", "stream",
                    "--create-slot", f"--slot={self.name}",
                    "--checkpoint=fast", "--no-sync", "--write-recovery-conf")
        with (self.data / "postgresql.conf").open("a") as conf:
            # cluster_name is the walreceiver's application_name in pg_stat_replication.
            conf.write(f"port = {self.port}\ncluster_name = '{self.name}'\n")
            # Replay waits for the test's queries rather than cancelling them: a vacuum on the
            # primary conflicted with the snapshot of the test's own pg_promote() call
            # ("canceling statement due to conflict with recovery"), under load.
            conf.write("max_standby_streaming_delay = -1\nmax_standby_archive_delay = -1\n")
        as_postgres(self.cluster.tool("pg_ctl"), "-D", self.data, "-l", self.data / "startup.log",
                    "-w", "-t", str(STARTED_WITHIN), "start")
        self._db = Database(self.dsn())

    def dsn(self) -> str:
        # Its socket is in the cluster's dir: the base backup copied unix_socket_directories.
        return f"host={self.cluster.dir} port={self.port} user=postgres dbname={self.database}"

    def catch_up(self) -> None:
        """Waits until the replica has replayed everything the primary committed so far: a
        marker committed last is visible there. (An LSN to wait for is no good: the primary's
        WAL position may end in records it has not flushed, and so not sent, yet.)"""
        marker = uuid.uuid4()
        self.primary.sql("insert into failover_marker values (%s)", (marker,))
        self.db.wait_until("select exists (select from failover_marker where marker = %s)",
                           (marker,))

    def cut(self) -> None:
        """Replication stops: the replica keeps what it has and receives nothing more."""
        self.db.sql("alter system set primary_conninfo = ''")
        self.db.sql("select pg_reload_conf()")
        self.db.wait_until("select not exists (select from pg_stat_wal_receiver)")
        self.primary.wait_until("select not exists (select from pg_stat_replication "
                                "where application_name = %s)", (self.name,))

    def promote(self) -> None:
        assert self.db.one("select pg_promote(wait => true, wait_seconds => %s)",
                           (STARTED_WITHIN,)) is True
        assert self.db.one("select pg_is_in_recovery()") is False

    def remove(self) -> None:
        if self._db is not None:
            self._db.close()
        stop_server(self.cluster.pgbin, self.data)
        shutil.rmtree(self.data, ignore_errors=True)
        self.primary.sql("select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                         "where slot_name = %s", (self.name,))


@pytest.fixture
def replica(cluster: Cluster, db: Database) -> Iterator[Replica]:
    r = Replica(cluster, db, db.one("select current_database()"))
    try:
        r.start()
        yield r
    finally:
        r.remove()


@dataclass
class Failover:
    old: Lease                      # acquired on the primary after the cut, lost with it
    new: Lease                      # acquired on the promoted replica
    old_write_on_primary: bool      # the old owner's fenced write committed on the primary
    old_lease_rows_after: int       # rows of the old lease on the new primary
    old_fence: str | None           # SQLSTATE of the old owner's fence on the new primary
    old_unfenced_write: str | None  # SQLSTATE of its write without fence there
    rows_after: list[tuple[Any, ...]]


def failover(db: Database, replica: Replica) -> Failover:
    db.sql("select pgfence.register('r')")
    db.sql("create table audit (generation bigint, written_by text)")
    db.sql("select pgfence.protect('audit', 'r')")
    replica.catch_up()
    replica.cut()

    # The old owner acquires and writes, fenced, on the primary: none of it reaches the replica.
    a = db.session("a")
    old = a.acquire("r")
    assert old is not None
    a.begin()
    a.fence(old)
    a.run("insert into audit values (%s, 'a')", (old.generation,))
    a.commit()
    old_write_on_primary = db.sql("select * from audit") == [(old.generation, "a")]

    # The primary is lost; the replica is promoted and a new owner acquires there.
    replica.promote()
    new_primary = replica.db
    old_lease_rows_after = new_primary.one(
        "select count(*) from pgfence.leases where lease_id = %s", (old.lease_id,))
    b = new_primary.session("b")
    new = b.acquire("r")
    assert new is not None

    # The old owner reaches the new primary (a pooler or DNS now points there) and carries on
    # with its lease, in a fenced write as it should, and then without fence.
    a2 = new_primary.session("a-after-failover")

    def fenced_write() -> None:
        a2.begin()
        try:
            a2.fence(old)
            a2.run("insert into audit values (%s, 'a')", (old.generation,))
            a2.commit()
        finally:
            if a2.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                a2.rollback()

    old_fence = sqlstate(fenced_write)
    old_unfenced_write = sqlstate(
        lambda: a2.run("insert into audit values (%s, 'a')", (old.generation,)))

    b.begin()
    b.fence(new)
    b.run("insert into audit values (%s, 'b')", (new.generation,))
    b.commit()
    rows_after = new_primary.sql("select * from audit order by written_by")
    return Failover(old, new, old_write_on_primary, old_lease_rows_after, old_fence,
                    old_unfenced_write, rows_after)


def test_old_lease_is_refused_after_failover_to_an_async_replica(
        db: Database, replica: Replica) -> None:
    f = failover(db, replica)
    # The scenario is the one I3 is about: the old owner's commits were lost, and its
    # generation number was handed out again (the sequence behind generations was first used
    # after the cut, so its advance was lost with those commits).
    assert f.old_write_on_primary
    assert f.old_lease_rows_after == 0
    assert f.new.generation == f.old.generation
    assert f.new.lease_id != f.old.lease_id
    # I3: the old lease authorizes nothing on the new primary.
    assert f.old_fence == "PF001"
    assert f.old_unfenced_write == "PF007"
    assert f.rows_after == [(f.new.generation, "b")]


def test_negative_control_lease_ids_derived_from_generations_let_the_old_owner_in(
        db: Database, replica: Replica) -> None:
    # Broken: the lease id is a function of (resource, generation), so comparing lease ids is
    # comparing generations. Installed before the cut, so the replica has it too.
    db.install_mutant("lease-id-from-generation")
    f = failover(db, replica)
    assert f.new.generation == f.old.generation
    assert f.new.lease_id == f.old.lease_id
    assert f.old_fence is None
    assert f.rows_after == [(f.old.generation, "a"), (f.new.generation, "b")]



def lost_claim_report(db: Database, replica: Replica) -> tuple[bool, str | None, str]:
    """A claim lost with the old primary; its handler reports to the new one."""
    db.sql("select pgfence.register('r')")
    db.sql("select pgfence.enqueue('q', '{}')")
    replica.catch_up()
    replica.cut()

    # The old owner claims the task on the primary: the claim is lost with the primary.
    a = db.session("a")
    old = a.acquire("r")
    assert old is not None
    _, old_attempt_id, _, _ = a.run("select * from pgfence.claim(%s, 'q')", (old.lease_id,))[0]

    replica.promote()
    b = replica.db.session("b")
    new = b.acquire("r")
    assert new is not None
    _, new_attempt_id, _, _ = b.run("select * from pgfence.claim(%s, 'q')", (new.lease_id,))[0]

    # The old handler finishes and reports to the new primary.
    a2 = replica.db.session("a-after-failover")
    try:
        old_report = a2.one("select pgfence.complete(%s, '{\"by\": \"a\"}')", (old_attempt_id,))
    except psycopg.Error as e:
        old_report = e.sqlstate
    new_report = b.one("select pgfence.complete(%s, '{\"by\": \"b\"}')", (new_attempt_id,))
    return new_attempt_id != old_attempt_id, old_report, new_report


def test_lost_claims_attempt_id_is_refused_after_failover(db: Database, replica: Replica) -> None:
    distinct, old_report, new_report = lost_claim_report(db, replica)
    assert distinct and old_report == "22023" and new_report == "accepted"


def test_negative_control_attempt_ids_not_signed_over_the_lease(db: Database,
                                                                replica: Replica) -> None:
    # Ids derived from (task_id, attempt) alone: the failover reissues the lost claim's id.
    db.install_mutant("attempt-id-not-over-lease")
    distinct, old_report, _ = lost_claim_report(db, replica)
    assert not distinct and old_report == "accepted"
