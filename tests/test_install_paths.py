"""One install path per database (issue 29): Sqitch and the other paths (the one file, its
upgrade files, the CLI) never both change one database; `pgfence version` compares the schema
with its release's fingerprint; Sqitch adopts a one-file database at every release; a Sqitch
revert keeps live state working under the older release or refuses, naming it.

Every test runs real Sqitch and the real CLI against the test's cluster. The path matrix these
tests cover is in docs/upgrading.md ("Which paths a database may take").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgfence import cli
from pgfence.connection import connect
from pgfence.releases import Files
from testkit.cluster import Cluster
from tests.support import ROOT, SQITCH_ENV, install_bundle
from tests.support import sqitch as sqitch_ok
from tests.test_install import schema_dump

HEAD = Files().newest()
RELEASE_0_1_0 = ROOT / "sql/releases/pgfence--0.1.0.sql"
UPGRADE = ROOT / "sql/upgrades/pgfence--0.1.0--0.2.0.sql"


def sqitch(*args: str) -> subprocess.CompletedProcess[str]:
    """Sqitch that may fail: the caller looks at its exit code and output."""
    return subprocess.run(["sqitch", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **SQITCH_ENV})


@dataclass
class Db:
    cluster: Cluster
    name: str

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.cluster.port}/{self.name}"

    @property
    def sqitch(self) -> str:
        return f"db:pg:{self.name}"

    def psql(self, *args: str | Path) -> str:
        return self.cluster.psql(self.name, *args)

    def try_psql(self, path: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction",
                               "-d", self.name, "-f", str(path)], capture_output=True, text=True)

    def one(self, query: str, *params: object) -> Any:
        with connect(self.cluster.dsn(self.name), "paths") as conn:
            row = conn.execute(query, params or None).fetchone()
        assert row is not None
        return row[0]

    def cli(self, *args: str) -> tuple[int, str]:
        p = subprocess.run([sys.executable, "-m", "pgfence.cli", "--db-url", self.url, *args],
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        return p.returncode, p.stdout + p.stderr

    def confirm(self) -> str:
        return f"--confirm=127.0.0.1:{self.cluster.port}/{self.name}"

    def dump(self) -> str:
        return schema_dump(self.name, exclude=("app",))


@pytest.fixture
def make(cluster: Cluster, sqitch_template: Callable[[str], str]) -> Iterator[Any]:
    """make(): an empty database; make(deployed="@v0.1.0"), make(deployed=""): one that
    `sqitch deploy` brought to that release or to the plan's head (a clone)."""
    made: list[str] = []

    def fresh(deployed: str | None = None) -> Db:
        name = f"p_{uuid.uuid4().hex[:10]}"
        cluster.create_database(name, None if deployed is None else sqitch_template(deployed))
        made.append(name)
        return Db(cluster, name)

    yield fresh
    for name in made:
        cluster.drop_database(name)


def renews(db: Db) -> None:
    """A lease works: acquire, renew, fence, release (what 42883 broke in the issue)."""
    resource = f"r{uuid.uuid4().hex[:8]}"
    with connect(db.cluster.dsn(db.name), "works") as conn:
        conn.execute("select pgfence.register(%s)", (resource,))
        row = conn.execute("select lease_id from pgfence.acquire(%s, 'w', '1 hour')",
                           (resource,)).fetchone()
        assert row is not None
        assert conn.execute("select state from pgfence.renew(%s, '1 hour')",
                            (row[0],)).fetchone() == ("active",)
        conn.execute("select pgfence.fence(%s)", (row[0],))
        conn.execute("select pgfence.release(%s)", (row[0],))


# --- item 1: one install path per database -----------------------------------------------------

def test_sqitch_then_the_cli_and_the_upgrade_file_are_refused(make: Any) -> None:
    db = make(deployed="@v0.1.0")
    before = db.dump()
    code, out = db.cli("upgrade", db.confirm())
    assert code == 1 and "Sqitch deploys pgfence" in out, out
    assert 'sqitch deploy "db:$DATABASE_URL"' in out, out
    code, out = db.cli("version")
    assert code == 0 and "deployed by Sqitch (registry schema sqitch)" in out, out
    assert "pgfence --db-url" not in out, "version suggests a path that would be refused"
    refused = db.try_psql(UPGRADE)
    assert refused.returncode != 0 and "Sqitch deploys pgfence in this database" in refused.stderr
    assert db.dump() == before
    # The path it names works.
    sqitch_ok("deploy", db.sqitch)
    assert db.one("select pgfence.version()") == HEAD
    renews(db)


def test_the_cli_install_is_refused_where_sqitch_reverted_everything(make: Any) -> None:
    db = make(deployed="@v0.1.0")
    sqitch_ok("revert", "-y", db.sqitch)
    code, out = db.cli("install", db.confirm())
    assert code == 1 and "install it with Sqitch" in out, out
    refused = db.try_psql(ROOT / "sql/pgfence.sql")
    assert refused.returncode != 0 and "Sqitch deploys pgfence" in refused.stderr
    assert db.one("select to_regnamespace('pgfence') is null")


def test_negative_control_another_projects_registry_is_not_pgfences(make: Any) -> None:
    """The refusal is about project pgfence: a registry of another project changes nothing."""
    db = make(deployed="@v0.1.0")
    db.psql("-c", "update sqitch.projects set project = 'other' where project = 'pgfence'")
    # (changes reference projects with ON UPDATE CASCADE)
    code, out = db.cli("upgrade", db.confirm())
    assert code == 0, out
    assert db.one("select pgfence.version()") == HEAD


def test_a_database_upgraded_outside_sqitch_is_refused_by_sqitch_deploy(make: Any) -> None:
    """The issue's corruption: Sqitch at 0.1.0, upgraded by another path (here the upgrade file
    with the registry out of its sight, as before this release), then `sqitch deploy`: it must
    not run half and revert (dropping interval_ok, 42883 on every renew)."""
    db = make(deployed="@v0.1.0")
    db.psql("-c", "alter table sqitch.projects rename to hidden")
    db.psql("--single-transaction", "-f", UPGRADE)
    db.psql("-c", "alter table sqitch.hidden rename to projects")
    before = db.dump()
    out = sqitch("deploy", db.sqitch)
    assert out.returncode != 0
    assert "holds pgfence 0.2.0, not 0.1.0 as the Sqitch registry says" in out.stdout + out.stderr
    assert "sqitch deploy --log-only" in out.stdout + out.stderr
    assert db.dump() == before
    renews(db)
    # The recipe it names: record what the database holds, then verify.
    sqitch_ok("deploy", "--log-only", db.sqitch)
    sqitch_ok("verify", db.sqitch)
    assert "Nothing to deploy" in sqitch_ok("deploy", db.sqitch).stdout
    renews(db)


def test_a_one_file_database_refuses_sqitch_deploy_and_keeps_working(make: Any) -> None:
    db = make()
    install_bundle(db.cluster, db.name)
    before = db.dump()
    out = sqitch("deploy", db.sqitch)
    assert out.returncode != 0 and 'schema "pgfence" already exists' in out.stdout + out.stderr
    assert db.dump() == before
    assert db.one("select pgfence.version()") == HEAD
    renews(db)


# --- item 3: adoption by Sqitch at every release ------------------------------------------------

RELEASED = sorted((p.name.removeprefix("pgfence--").removesuffix(".sql")
                   for p in (ROOT / "sql/releases").glob("pgfence--*.sql")),
                  key=lambda v: tuple(int(n) for n in v.split(".")))


@pytest.mark.parametrize("release", sorted({*RELEASED, HEAD}))
def test_sqitch_adopts_a_one_file_database_at_each_release(make: Any, release: str) -> None:
    # Each release from its own file, recorded up to its tag; a head past the newest release
    # (not tagged yet) from sql/pgfence.sql, recorded whole.
    db, fresh = make(), make()
    tagged = release in RELEASED
    path = (ROOT / f"sql/releases/pgfence--{release}.sql" if tagged
            else ROOT / "sql/pgfence.sql")
    db.psql("--single-transaction", "-f", path)
    to = ["--to", f"@v{release}"] if tagged else []
    adopted = sqitch("deploy", "--log-only", *to, db.sqitch)       # verify runs (sqitch.conf)
    assert adopted.returncode == 0, adopted.stdout[-2000:] + adopted.stderr[-2000:]
    sqitch_ok("verify", db.sqitch)
    sqitch_ok("deploy", db.sqitch)                                   # up to the head
    install_bundle(fresh.cluster, fresh.name)
    assert db.dump() == fresh.dump()
    renews(db)


def test_negative_control_a_verify_that_pins_a_release_fails_adoption(make: Any,
                                                                    tmp_path: Path) -> None:
    """The verify script as it was (version() = '0.1.0' exactly) fails --log-only at the head."""
    db = make()
    install_bundle(db.cluster, db.name)
    project = tmp_path / "project"         # a copy: the repository's scripts stay as they are
    project.mkdir()
    for name in ("sqitch.conf", "sqitch.plan"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "migrations", project / "migrations")
    (project / "migrations/verify/version@v0.1.0.sql").write_text(
        "select 1 / (pgfence.version() = '0.1.0')::int;\n")
    out = subprocess.run(["sqitch", "deploy", "--log-only", db.sqitch], cwd=project,
                         capture_output=True, text=True, env={**os.environ, **SQITCH_ENV})
    assert out.returncode != 0 and "division by zero" in out.stdout + out.stderr


# --- item 2: drift ------------------------------------------------------------------------------

def version(db: Db) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "pgfence.cli", "--json", "--db-url", db.url,
                        "version"], capture_output=True, text=True, timeout=120)
    return p.returncode, json.loads(p.stdout)


def test_the_head_fingerprint_is_recorded(make: Any) -> None:
    db = make()
    install_bundle(db.cluster, db.name)
    found = db.psql("-At", "-f", ROOT / "sql/queries/fingerprint.sql").strip()
    assert Files().fingerprints().get(HEAD) == found, (
        f"record `{HEAD} {found}` in sql/releases/fingerprints (the head's line)")


@pytest.mark.parametrize("change", [
    "drop function pgfence.complete_many(uuid[], jsonb[])",
    "create or replace function pgfence.check_name(arg text, value text) returns void "
    "language plpgsql as $$ begin end $$",
])
@pytest.mark.parametrize("release", ["0.1.0", HEAD])
def test_a_drifted_schema_is_named_never_up_to_date(make: Any, release: str, change: str) -> None:
    db = make()
    if release == HEAD:
        install_bundle(db.cluster, db.name)
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


def test_negative_control_without_the_heads_fingerprint_drift_looks_up_to_date(
        make: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is what sees it: a package without the head's line says "up to date"."""
    root = tmp_path / "schema"
    shutil.copytree(ROOT / "sql", root)
    prints = root / "releases/fingerprints"
    prints.write_text("".join(ln for ln in prints.read_text().splitlines(keepends=True)
                              if not ln.startswith(HEAD)))
    monkeypatch.setattr(cli.Cli, "files", Files(root))
    db = make()
    install_bundle(db.cluster, db.name)
    db.psql("-c", "drop function pgfence.complete_many(uuid[], jsonb[])")
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


def test_the_first_change_after_every_tag_refuses_a_database_another_path_moved() -> None:
    """The rule of the plan that keeps `sqitch deploy` off a database upgraded by another path:
    the first change after each release checks that the database holds that release."""
    tags: list[tuple[str, str]] = []          # (release, the first change after its tag)
    pending: str | None = None
    for line in (ROOT / "sqitch.plan").read_text().splitlines():
        word = line.split()[0] if line.strip() and not line.startswith(("%", "#")) else ""
        if word.startswith("@v"):
            pending = word[2:]
        elif word and pending is not None:
            tags.append((pending, word))
            pending = None
    assert tags, "no change after a tag"
    for release, change in tags:
        script = (ROOT / f"migrations/deploy/{change}.sql").read_text()
        assert f"if v_found is distinct from '{release}' then" in script, (
            f"migrations/deploy/{change}.sql, the first change after @v{release}, must refuse a "
            f"database whose pgfence.version() is not {release} (as checks.sql does)")
