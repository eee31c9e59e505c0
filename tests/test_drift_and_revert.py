"""What decides, on the server, whether a database is its release and whether a Sqitch revert
may run (issue 29): `pgfence version` compares the schema with its release's fingerprint,
which is read from the server's catalogs; a Sqitch revert keeps live state working under the
older release or refuses, naming it. Which install path may follow which is
tests/test_install_paths.py's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from pgfence import cli
from pgfence.connection import connect
from testkit import install
from testkit.install import sqitch as sqitch_ok
from tests import test_install_paths as paths
from tests.support import HUNG
from tests.test_install_paths import HEAD, RELEASE_0_1_0, Db, sqitch

make = paths.make  # the databases of that module's tests, a fixture (pytest finds it by name)


# --- item 2: drift ------------------------------------------------------------------------------

def version(db: Db) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "pgfence.cli", "--json", "--db-url", db.url,
                        "version"], capture_output=True, text=True, timeout=HUNG)
    return p.returncode, json.loads(p.stdout)


def test_the_heads_record_is_what_it_installed(make: Any) -> None:
    """From 0.3.0 on a database records its release (pgfence.seal): a fresh install matches its
    record, and the record's digest is the schema's fingerprint. (A release's fingerprint is
    recorded in sql/releases/fingerprints when it is tagged; the head needs no line.)"""
    db = make()
    install.core(db.cluster, db.name)
    drift = db.psql("-At", "-c", "select count(*) from pgfence.schema_drift('pgfence')")
    assert drift.strip() == "0"
    found = db.psql("-At", "-c", "select pgfence.schema_fingerprint('pgfence')").strip()
    recorded = db.psql("-At", "-c", "select md5(string_agg(object || ' ' || digest, E'\\n' "
                       "order by object)) from pgfence.schema_records "
                       "where release = pgfence.version() and schema_name = 'pgfence'").strip()
    assert found == recorded and len(found) == 32


@pytest.mark.parametrize("change", [
    "drop function pgfence.complete_many(uuid[], jsonb[])",
    "create or replace function pgfence.check_name(arg text, value text) returns void "
    "language plpgsql as $$ begin end $$",
])
@pytest.mark.parametrize("release", ["0.1.0", HEAD])
def test_a_drifted_schema_is_named_never_up_to_date(make: Any, release: str, change: str) -> None:
    db = make()
    if release == HEAD:
        install.core(db.cluster, db.name)
    else:
        db.psql("--single-transaction", "-f", RELEASE_0_1_0)
        change = change.replace("complete_many(uuid[], jsonb[])", "extend(uuid, interval)")
    code, doc = version(db)
    assert code == 0 and doc["state"] == ("up_to_date" if release == HEAD else "upgrade_available")
    db.psql("-c", change)
    code, doc = version(db)
    assert code == 1 and doc["state"] == "drifted", doc
    code, out = db.cli("version")
    assert code == 1 and "changed by hand" in out and "NOT up to date" in out, out
    code, out = db.cli("upgrade", db.confirm())
    assert code == 1 and f"differs from release {release} as released" in out, out


def test_negative_control_a_record_taken_after_the_drift_looks_up_to_date(
        make: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """The record is what sees it: sealed again over the drifted schema, it says "up to date"."""
    db = make()
    install.core(db.cluster, db.name)
    db.psql("-c", "drop function pgfence.complete_many(uuid[], jsonb[])")
    assert cli.main(["--db-url", db.url, "version"]) == 1
    capsys.readouterr()
    db.psql("-c", "select pgfence.seal('pgfence', pgfence.version())")
    assert cli.main(["--db-url", db.url, "version"]) == 0
    assert "up to date" in capsys.readouterr().out


# --- item 4: revert keeps live state or refuses -------------------------------------------------

@dataclass
class Live:
    lease: uuid.UUID
    attempts: list[uuid.UUID]
    token: uuid.UUID
    invocation: uuid.UUID


def live_state(db: Db) -> Live:
    """Made under the head: a lease, two claimed tasks, an attempt reported twice after it was
    superseded (two stale records), an open update window, a pending invocation, a protection."""
    with connect(db.cluster.dsn(db.name), "live") as conn:
        for r in ("cur", "old", "win", "inv"):
            conn.execute("select pgfence.register(%s)", (r,))
        lease = conn.execute("select lease_id from pgfence.acquire('cur', 'a', '1 hour')"
                             ).fetchone()
        assert lease is not None
        for n in range(3):
            conn.execute("select pgfence.enqueue('q', jsonb_build_object('n', %s::int))", (n,))
        attempts = [r[0] for r in conn.execute(
            "select attempt_id from pgfence.claim(%s, 'q', 3, '1 hour')", (lease[0],))]
        # The third attempt's visibility runs out (the test moves it), it is claimed again;
        # the superseded attempt then reports twice: two stale-result records of one attempt.
        conn.execute("update pgfence.tasks set visible_until = clock_timestamp() - interval '1 ms'"
                     " where task_id = pgfence.attempt_task(%s)", (attempts[2],))
        conn.execute("select pgfence.requeue_expired()")
        again = conn.execute("select attempt_id from pgfence.claim(%s, 'q', 1, '1 hour')",
                             (lease[0],)).fetchone()
        assert again is not None
        for n in range(2):     # two different results: each is kept
            assert conn.execute("select pgfence.complete(%s, jsonb_build_object('n', %s::int))",
                                (attempts[2], n)).fetchone() == ("stale",)
        token = conn.execute("select pgfence.prepare_update(array['win'], %s)",
                             (uuid.uuid4(),)).fetchone()
        invocation = conn.execute("select pgfence.request_start('inv', '1 hour')").fetchone()
        conn.execute("create schema app")
        conn.execute("create table app.audit (generation bigint)")
        conn.execute("select pgfence.protect('app.audit', 'cur')")
    assert token is not None and invocation is not None
    return Live(lease[0], [*attempts[:2], again[0]], token[0], invocation[0])


def test_revert_refuses_while_it_would_strand_live_state_then_keeps_it(make: Any) -> None:
    db = make(deployed="")
    live = live_state(db)
    out = sqitch("revert", "-y", "--to", "@v0.1.0", db.sqitch)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "3 task(s) claimed under 0.2.0 (queues q)" in said, said
    # Refused: what is claimed still completes and extends.
    with connect(db.cluster.dsn(db.name), "after") as conn:
        assert conn.execute("select pgfence.extend(%s, '1 hour') is not null",
                            (live.attempts[0],)).fetchone() == (True,)
        for attempt in live.attempts:
            assert conn.execute("select pgfence.complete(%s, '{}')",
                                (attempt,)).fetchone() == ("accepted",)
    out = sqitch("revert", "-y", "--to", "@v0.1.0", db.sqitch)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "would delete 1 stale-result record(s)" in said, said
    assert db.one("select count(*) from pgfence.stale_results") == 2
    db.psql("-c", "delete from pgfence.stale_results where report > 1")
    sqitch_ok("revert", "-y", "--to", "@v0.1.0", db.sqitch)
    assert db.one("select pgfence.version()") == "0.1.0"
    # What was live under the head works under 0.1.0.
    with connect(db.cluster.dsn(db.name), "on 0.1.0") as conn:
        assert conn.execute("select state from pgfence.renew(%s, '1 hour')",
                            (live.lease,)).fetchone() == ("active",)
        with conn.transaction():
            generation = conn.execute("select pgfence.fence(%s)", (live.lease,)).fetchone()
            conn.execute("insert into app.audit values (%s)", generation)
        with pytest.raises(psycopg.Error) as unfenced:
            conn.execute("insert into app.audit values (0)")
        assert unfenced.value.sqlstate == "PF007"
        assert dict(conn.execute("select resource, outcome from pgfence.finish_update(%s)",
                                 (live.token,)).fetchall()) == {"win": "restored"}
        assert conn.execute("select generation is not null from pgfence.acquire('inv', 'e', "
                            "'1 hour', %s)", (live.invocation,)).fetchone() == (True,)
        conn.execute("select pgfence.enqueue('q', '{}')")
        (attempt,) = conn.execute("select attempt_id from pgfence.claim(%s, 'q', 1, '1 hour')",
                                  (live.lease,)).fetchone() or (None,)
        assert conn.execute("select pgfence.complete(%s, '{}')",
                            (attempt,)).fetchone() == ("accepted",)
        assert conn.execute("select count(*) from pgfence.stale_results").fetchone() == (1,)
        assert conn.execute("select pgfence.release(%s)", (live.lease,)).fetchone() == (True,)
    sqitch_ok("deploy", db.sqitch)
    assert db.one("select pgfence.version()") == HEAD


def test_negative_control_the_old_revert_strands_a_claimed_task(make: Any) -> None:
    """Without the refusal (a claimed task hidden from it), the revert goes through and the
    task claimed under the head can no longer be completed: 22023, the issue's finding."""
    db = make(deployed="")
    live = live_state(db)
    db.psql("-c", "delete from pgfence.stale_results where report > 1")
    # The refusals count claimed tasks; one step out of their sight is the old behaviour.
    db.psql("-c", "alter table pgfence.tasks drop constraint tasks_state_check",
            "-c", "update pgfence.tasks set state = 'hidden' where state = 'claimed' "
                  f"and task_id = pgfence.attempt_task('{live.attempts[0]}')")
    db.psql("-c", "update pgfence.tasks set state = 'completed' where state = 'claimed'")
    sqitch_ok("revert", "-y", "--to", "@v0.1.0", db.sqitch)
    db.psql("-c", "update pgfence.tasks set state = 'claimed' where state = 'hidden'")
    with pytest.raises(psycopg.Error) as stranded:
        db.one("select pgfence.complete(%s, '{}')", live.attempts[0])
    assert stranded.value.sqlstate == "22023"


