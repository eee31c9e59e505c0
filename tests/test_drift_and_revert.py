"""What decides, on the server, whether a database is its release and whether a Sqitch revert
may run (issue 29): `pgfence version` compares the schema with its release's fingerprint,
which is read from the server's catalogs; a Sqitch revert keeps live state working under the
older release or refuses, naming it. Which install path may follow which is
tests/test_install_paths.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgfence import cli
from pgfence.connection import connect
from testkit import install
from testkit.harness import Database
from testkit.install import SQITCH_ENV
from testkit.install import sqitch as sqitch_ok
from tests import test_install_paths as paths
from tests.support import HUNG, ROOT
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
    """The record is what sees it: sealed again over the drifted schema, it names nothing; only a
    released version's recorded fingerprint still tells (a head not yet released has none, so
    the newest release is installed from its file)."""
    db = make()
    install.core(db.cluster, db.name, release=paths.RELEASED[-1])
    db.psql("-c", "drop function pgfence.complete_many(uuid[], jsonb[])")
    assert cli.main(["--db-url", db.url, "version"]) == 1
    capsys.readouterr()
    db.psql("-c", "select pgfence.seal('pgfence', pgfence.version())")
    # The record taken after the drift names nothing; the released version's fingerprint
    # (sql/releases/fingerprints), which the CLI compares too, still tells.
    assert db.one("select count(*) from pgfence.schema_drift('pgfence')") == 0
    assert cli.main(["--db-url", db.url, "version"]) == 1
    assert "NOT up to date" in capsys.readouterr().out


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


# The plan's last change (its last line that is not a tag).
LAST_CHANGE = [line.split()[0] for line in (ROOT / "sqitch.plan").read_text().splitlines()
               if line.strip() and not line.startswith(("@", "%", "#"))][-1]


def untouched(db: Db) -> None:
    """Nothing was reverted: the head as its release recorded it, and Sqitch's registry says so
    (before issue 43, a refused revert had reverted 15 changes: health, prune and complete_many
    gone, PF001 naming lease ids again)."""
    assert db.one("select pgfence.version()") == HEAD
    assert db.one("select count(*) from pgfence.schema_drift('pgfence')") == 0
    assert db.one("select change from sqitch.changes where project = 'pgfence' "
                  "order by committed_at desc limit 1") == LAST_CHANGE


def test_revert_refuses_while_it_would_strand_live_state_then_keeps_it(make: Any) -> None:
    db = make(deployed="")
    live = live_state(db)
    out = sqitch("revert", "-y", "--to", "@v0.1.0", "--set", "pgfence_revert_to=0.1.0", db.sqitch)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "3 task(s) claimed under 0.2.0 (queues q)" in said, said
    assert "would delete 1 stale-result record(s)" in said, said
    untouched(db)
    # Refused: what is claimed still completes and extends.
    with connect(db.cluster.dsn(db.name), "after") as conn:
        assert conn.execute("select pgfence.extend(%s, '1 hour') is not null",
                            (live.attempts[0],)).fetchone() == (True,)
        for attempt in live.attempts:
            assert conn.execute("select pgfence.complete(%s, '{}')",
                                (attempt,)).fetchone() == ("accepted",)
    out = sqitch("revert", "-y", "--to", "@v0.1.0", "--set", "pgfence_revert_to=0.1.0", db.sqitch)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "would delete 1 stale-result record(s)" in said, said
    assert "task(s) claimed" not in said, said
    assert db.one("select count(*) from pgfence.stale_results") == 2
    untouched(db)
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




# --- issue 43 item 2: a revert that will refuse refuses before anything is reverted -------------

def test_a_revert_to_a_release_told_its_target_is_refused_only_for_what_it_strands(
        make: Any) -> None:
    """Told its target (0.2.1, which verifies 0.2.0's attempt ids), a revert with tasks claimed
    goes through, and what was claimed completes under 0.2.1; without the target the first step
    checks a revert of every change, refuses, and says how to name it."""
    db = make(deployed="")
    live = live_state(db)
    out = sqitch("revert", "-y", "--to", "@v0.2.1", db.sqitch)
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "a revert to nothing would strand live state" in said, said
    assert "--set pgfence_revert_to=A" in said, said
    untouched(db)
    sqitch_ok("revert", "-y", "--to", "@v0.2.1", "--set", "pgfence_revert_to=0.2.1", db.sqitch)
    assert db.one("select pgfence.version()") == "0.2.1"
    with connect(db.cluster.dsn(db.name), "on 0.2.1") as conn:
        for attempt in live.attempts:
            assert conn.execute("select pgfence.complete(%s, '{}')",
                                (attempt,)).fetchone() == ("accepted",)
    sqitch_ok("deploy", db.sqitch)
    assert db.one("select pgfence.version()") == HEAD


def test_negative_control_without_the_first_steps_check_a_refused_revert_is_half_done(
        make: Any, tmp_path: Path) -> None:
    """The revert of the release's change without pgfence.check_revert (the project copied, the
    repository's scripts as they are): refused at `extend`, after the changes above it were
    reverted, as the issue found: complete_many, health and prune gone until a deploy."""
    db = make(deployed="")
    live_state(db)
    project = tmp_path / "project"
    project.mkdir()
    for name in ("sqitch.conf", "sqitch.plan"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "migrations", project / "migrations")
    end = "\\endif\n"
    for first in (project / "migrations/revert").glob("release_*.sql"):  # each release's first step
        text = first.read_text()
        if "\\if :{?pgfence_revert_to}" in text:
            check = text[text.index("\\if :{?pgfence_revert_to}"):text.index(end) + len(end)]
            first.write_text(text.replace(check, ""))
    out = subprocess.run(["sqitch", "revert", "-y", "--to", "@v0.1.0", db.sqitch], cwd=project,
                         capture_output=True, text=True, env={**os.environ, **SQITCH_ENV})
    said = out.stdout + out.stderr
    assert out.returncode != 0 and "revert of extend refused" in said, said
    assert db.one("select pgfence.version()") != HEAD
    assert db.one("select to_regprocedure('pgfence.complete_many(uuid[], jsonb[])')") is None


def test_a_layer_is_reverted_before_the_core_it_needs(mq: Database) -> None:
    """A layer sealed 0.3.0 needs the core's pgfence.unseal to revert itself, and every layer
    needs pgfence 0.2.0: the core's revert below either refuses, naming the layer."""
    head = mq.one("select pgfence.version()")
    mq.one("select pgfence.check_revert(%s)", (head,))
    for to, named in (("0.2.1", "layer pgfence_pgmq holds release 0.3.0: revert it first "
                                "(cd layers/pgmq && sqitch revert --to @v0.2.1)"),
                      ("0.1.0", "layer pgfence_pgmq is installed (it needs pgfence 0.2.0)"),
                      (None, "layer pgfence_pgmq is installed")):
        with pytest.raises(psycopg.Error) as refused:
            mq.one("select pgfence.check_revert(%s)", (to,))
        assert refused.value.sqlstate == "55000"
        assert named in (refused.value.diag.message_detail or ""), refused.value.diag.message_detail
    with pytest.raises(psycopg.Error) as bad:
        mq.one("select pgfence.check_revert('latest')")
    assert bad.value.sqlstate == "22023"
