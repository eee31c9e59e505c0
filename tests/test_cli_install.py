"""`pgfence install`, `upgrade` and `version` against a real cluster, directly, through PgBouncer
and through the real Supabase CLI (npm supabase@3.1.0, installed by scripts/setup).

The real SQL files (sql/pgfence.sql, sql/releases/, sql/upgrades/) are what the commands run.
The rules of chaining several upgrade files in one transaction are also shown on small
synthetic releases (written per test under tmp_path), because they need a chain of files that
fails in its second step, which no real release should ever be.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pgfence import cli
from pgfence.releases import Files, key
from pgfence.transport import Refused, Supabase
from testkit import install
from testkit.cluster import Cluster
from testkit.harness import Database
from tests.support import HUNG, ROOT, SUPABASE, acquired, bundle_query

PACKAGE = Files()
RELEASE_0_1_0 = ROOT / "sql/releases/pgfence--0.1.0.sql"


@dataclass
class Result:
    code: int
    out: str
    err: str

    def doc(self) -> Any:
        return json.loads(self.out)   # --json: exactly one JSON document on stdout


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None,
        binary: list[str] | None = None) -> Result:
    p = subprocess.run([*(binary or [sys.executable, "-m", "pgfence.cli"]), *args], cwd=cwd,
                       capture_output=True, text=True, timeout=HUNG, stdin=subprocess.DEVNULL,
                       env={**os.environ, **(env or {})})
    return Result(p.returncode, p.stdout, p.stderr)


def in_process(args: list[str], capsys: pytest.CaptureFixture[str]) -> Result:
    """The CLI in this process, for the tests that give it other SQL files (Cli.files)."""
    code = cli.main(args)
    out, err = capsys.readouterr()
    return Result(code, out, err)


@dataclass
class Target:
    cluster: Cluster
    db: Database
    dbname: str
    name: str               # what the CLI shows and --confirm must match
    args: list[str]         # the CLI's target arguments
    transport: str


Empty = tuple[Cluster, Database, str]


def target_for(transport: str, cluster: Cluster, db: Database, dbname: str,
               pgbouncer: int | None = None) -> Target:
    port = str(pgbouncer or cluster.port)
    url = f"postgresql://postgres@127.0.0.1:{port}/{dbname}"
    name = f"127.0.0.1:{port}/{dbname}"
    if transport == "supabase":
        return Target(cluster, db, dbname, name, ["--supabase", "--supabase-bin", str(SUPABASE),
                                                  f"--remote={url}"], transport)
    return Target(cluster, db, dbname, name, ["--db-url", url], transport)


@pytest.fixture
def empty(cluster: Cluster) -> Iterator[Empty]:
    """A new database without pgfence (the cluster's pgfence roles may exist: they are shared)."""
    dbname = f"ci_{uuid.uuid4().hex[:12]}"
    cluster.create_database(dbname)
    db = Database(cluster.dsn(dbname))
    try:
        yield cluster, db, dbname
    finally:
        db.close()
        cluster.drop_database(dbname)


@pytest.fixture(params=["direct", "supabase"])
def target(request: pytest.FixtureRequest, empty: Empty) -> Target:
    return target_for(request.param, *empty)


def install_file(t: Target, path: Path) -> None:
    """Installs a release the way the README says: psql, one transaction."""
    t.cluster.psql(t.dbname, "--single-transaction", "-f", path)


def has_schema(db: Database) -> bool:
    return bool(db.one("select to_regnamespace('pgfence') is not null"))


def fingerprint(t: Target) -> str:
    """Everything an install or upgrade could change: pg_dump of the whole database (schema
    and data), and the catalog rows of every non-system object and of the pgfence roles with
    their xmin, which changes whenever a statement rewrites the row (even to the same text)."""
    dump = subprocess.run([t.cluster.tool("pg_dump"), "--no-owner", "-d", t.cluster.dsn(t.dbname)],
                          check=True, capture_output=True, text=True).stdout
    dump = "\n".join(line for line in dump.splitlines()
                     if line.strip() and not line.startswith(("--", "\\restrict", "\\unrestrict")))
    catalog = t.db.one(r"""
        select string_agg(format('%s %s %s %s', kind, oid, xmin, name), E'\n'
                          order by kind, name, oid)
          from (select 'namespace' as kind, oid, xmin::text, nspname::text as name
                  from pg_namespace where nspname !~ '^(pg_|information_schema)'
                union all
                select 'proc', p.oid, p.xmin::text, p.oid::regprocedure::text from pg_proc p
                 where p.pronamespace in (select oid from pg_namespace
                                           where nspname !~ '^(pg_|information_schema)')
                union all
                select 'class', c.oid, c.xmin::text, c.oid::regclass::text from pg_class c
                 where c.relnamespace in (select oid from pg_namespace
                                           where nspname !~ '^(pg_|information_schema)')
                union all
                select 'type', y.oid, y.xmin::text, y.oid::regtype::text from pg_type y
                 where y.typnamespace in (select oid from pg_namespace
                                           where nspname !~ '^(pg_|information_schema)')
                union all
                select 'role', oid, xmin::text, rolname::text from pg_authid
                 where rolname like 'pgfence%'
                union all
                select 'event trigger', oid, xmin::text, evtname::text from pg_event_trigger) x
    """)
    return f"{dump}\n{catalog}"


# --------------------------------------------------------------------------------------------
# install and version, with the package's real sql/pgfence.sql


@pytest.mark.parametrize("transport", ["direct", "pgbouncer", "supabase"])
def test_install_on_a_fresh_database(transport: str, empty: Empty,
                                     request: pytest.FixtureRequest, tmp_path: Path) -> None:
    bouncer = request.getfixturevalue("pgbouncer") if transport == "pgbouncer" else None
    t = target_for("direct" if transport == "pgbouncer" else transport, *empty, pgbouncer=bouncer)
    newest = PACKAGE.newest()
    before = run([*t.args, "--json", "version"], tmp_path)
    assert before.code == 0, before.out + before.err
    assert before.doc() == {"target": t.name, "installed": None, "package": newest,
                            "state": "not_installed", "upgrade_files": [],
                            "sqitch_registry": None, "fingerprint": None,
                            "release_fingerprint": None, "drift": None, "layers": []}

    out = run([*t.args, "--json", "install", "--confirm", t.name], tmp_path)
    assert out.code == 0, out.out + out.err
    assert out.doc() == {"target": t.name, "installed": newest, "previous": None,
                         "changed": True}
    assert t.db.one("select pgfence.version()") == newest
    # It is the whole release: a worker can take a lease.
    t.db.sql("select pgfence.register('r')")
    assert t.db.one("select generation from pgfence.acquire('r', 'w', '30 s')") == 1

    after = run([*t.args, "version"], tmp_path)
    assert after.code == 0, after.err
    assert f"installed: {newest}" in after.out and "up to date" in after.out


def test_install_twice_says_so_and_changes_nothing(target: Target, tmp_path: Path) -> None:
    install_file(target, ROOT / "sql/pgfence.sql")
    target.db.sql("select pgfence.register('r')")
    before = fingerprint(target)
    out = run([*target.args, "install", "--confirm", target.name], tmp_path)
    assert out.code == 1, out.out + out.err
    assert f"pgfence {PACKAGE.newest()} is already installed on {target.name}" in out.err
    assert "nothing was changed" in out.err
    assert fingerprint(target) == before


def test_the_fingerprint_sees_a_same_text_rewrite(target: Target) -> None:
    """The fingerprint that proves "nothing changed" sees even a statement that rewrites a
    function with its own text, the smallest thing a re-run install file could do."""
    install_file(target, ROOT / "sql/pgfence.sql")
    before = fingerprint(target)
    definition = target.db.one("select pg_get_functiondef('pgfence.version()'::regprocedure)")
    target.db.sql(definition)
    assert fingerprint(target) != before


def test_install_that_loses_a_race_is_refused_by_the_sql(target: Target, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Another installer wins between the CLI's look and its install: the file itself fails
    (schema pgfence exists), in its transaction, and nothing changes."""
    install_file(target, ROOT / "sql/pgfence.sql")
    before = fingerprint(target)
    monkeypatch.setattr(cli.Cli, "installed", lambda self: cli.Installed(False, None))
    out = in_process([*target.args, "install", "--confirm", target.name], capsys)
    assert out.code == 1, out.err
    assert "the install failed and was rolled back, nothing was changed" in out.err
    assert 'schema "pgfence" already exists' in out.err
    assert fingerprint(target) == before


@pytest.mark.parametrize("how", ["no-tty", "wrong-confirm", "supabase-yes-env"])
def test_install_without_confirmation_creates_nothing(how: str, empty: Empty,
                                                      tmp_path: Path) -> None:
    t = target_for("supabase" if how == "supabase-yes-env" else "direct", *empty)
    args = [*t.args, "install"]
    env = {}
    if how == "wrong-confirm":
        args += ["--confirm", "127.0.0.1:1/elsewhere"]
    if how == "supabase-yes-env":
        env = {"SUPABASE_YES": "1", "SUPABASE_ASSUME_YES": "1"}
    out = run(args, tmp_path, env=env)
    assert out.code == 4, out.out + out.err
    assert f"target: {t.name}" in out.err
    assert not has_schema(t.db)


SABOTAGE = """
create function public.sabotage() returns event_trigger language plpgsql as $$
declare
  v_made int := (select count(*) from pg_catalog.pg_proc
                  where pronamespace = pg_catalog.to_regnamespace('pgfence'));
begin
  if v_made >= 10 then
    raise exception 'sabotage: refused the next function, % pgfence functions made', v_made;
  end if;
end
$$;
create event trigger sabotage on ddl_command_end when tag in ('CREATE FUNCTION')
  execute function public.sabotage();
"""


def test_an_install_that_fails_half_way_leaves_nothing(target: Target, tmp_path: Path) -> None:
    """An event trigger fails the install file once it has made ten functions: half way."""
    target.db.sql(SABOTAGE)
    before = fingerprint(target)
    out = run([*target.args, "install", "--confirm", target.name], tmp_path)
    assert out.code == 1, out.out + out.err
    assert "the install failed and was rolled back, nothing was changed" in out.err
    # The server's message reaches the operator, and shows the failure came half way.
    made = re.search(r"sabotage: refused the next function, (\d+) pgfence functions made",
                     out.err)
    assert made and int(made.group(1)) >= 10, out.err
    assert "Traceback" not in out.err
    assert not has_schema(target.db)
    assert fingerprint(target) == before


def test_version_on_fresh_and_installed_databases(target: Target, tmp_path: Path) -> None:
    fresh = run([*target.args, "version"], tmp_path)
    assert fresh.code == 0, fresh.err
    assert "installed: not installed (no schema pgfence)" in fresh.out
    assert f"package:   {PACKAGE.newest()}" in fresh.out
    assert f"to install: pgfence {' '.join(target.args[:1])}" in fresh.out
    install_file(target, ROOT / "sql/pgfence.sql")
    doc = run([*target.args, "--json", "version"], tmp_path).doc()
    assert doc["installed"] == PACKAGE.newest() and doc["state"] == "up_to_date"


def test_version_of_a_schema_without_version_function(target: Target, tmp_path: Path) -> None:
    target.db.sql("create schema pgfence")
    doc = run([*target.args, "--json", "version"], tmp_path).doc()
    assert doc["state"] == "unknown" and doc["installed"] is None
    up = run([*target.args, "upgrade", "--confirm", target.name], tmp_path)
    assert up.code == 1 and "not a pgfence release this package can upgrade" in up.err
    again = run([*target.args, "install", "--confirm", target.name], tmp_path)
    assert again.code == 1 and "already installed" in again.err


def test_version_runs_read_only(target: Target, tmp_path: Path) -> None:
    """Sabotage: a pgfence.version() that writes. The read-only version command is refused."""
    target.db.sql("""create schema pgfence;
                     create table pgfence.sabotage (at timestamptz);
                     create function pgfence.version() returns text language sql as
                       $$ insert into pgfence.sabotage values (now()) returning '0.1.0' $$""")
    out = run([*target.args, "version"], tmp_path)
    assert out.code == 1 and "read-only transaction" in out.err, out.err
    assert target.db.one("select count(*) from pgfence.sabotage") == 0


# --------------------------------------------------------------------------------------------
# upgrade's refusals and its no-op


def test_upgrade_of_an_up_to_date_database_is_a_no_op(target: Target, tmp_path: Path) -> None:
    install_file(target, ROOT / "sql/pgfence.sql")
    target.db.sql("select pgfence.register('r')")
    before = fingerprint(target)
    # Nothing to change, so nothing to confirm.
    out = run([*target.args, "--json", "upgrade"], tmp_path)
    assert out.code == 0, out.out + out.err
    assert out.doc() == {"target": target.name, "installed": PACKAGE.newest(),
                         "previous": PACKAGE.newest(), "upgrade_files": [], "changed": False,
                         "layers": []}
    human = run([*target.args, "upgrade", "--to", PACKAGE.newest()], tmp_path)
    assert human.code == 0 and "is up to date: nothing to do" in human.out
    assert fingerprint(target) == before


@pytest.mark.parametrize("to", ["9.9.9", "0.0.1", "latest", "1.0"])
def test_upgrade_to_an_unknown_release_is_refused_before_connecting(to: str,
                                                                    tmp_path: Path) -> None:
    # Port 1 has no server: a connection would fail with exit 3, so exit 2 came first.
    for args in (["--db-url", "postgresql://postgres@127.0.0.1:1/nowhere"],
                 ["--supabase", "--supabase-bin", str(tmp_path / "no-such-supabase")]):
        out = run([*args, "upgrade", "--to", to, "--confirm", "x"], tmp_path)
        assert out.code == 2, out.err
        assert f"--to {to!r}: this package knows pgfence releases" in out.err


def test_upgrade_without_pgfence_says_to_install(target: Target, tmp_path: Path) -> None:
    out = run([*target.args, "upgrade", "--confirm", target.name], tmp_path)
    assert out.code == 1
    assert "pgfence is not installed" in out.err and "install" in out.err
    assert not has_schema(target.db)


def test_a_database_newer_than_the_package_is_refused(target: Target, tmp_path: Path) -> None:
    """Simulates a database upgraded by a newer pgfence release than this package knows: its
    pgfence.version() is replaced by one that says 9.9.9."""
    install_file(target, ROOT / "sql/pgfence.sql")
    if target.db.one("select to_regclass('pgfence.releases') is not null"):
        # From 0.3.0 on the database records its release (pgfence.seal): a newer release is a
        # newer record of the same schema, as a newer package would seal it.
        target.db.sql("insert into pgfence.releases (schema_name, release) "
                      "values ('pgfence', '9.9.9')")
        target.db.sql("insert into pgfence.schema_records select schema_name, '9.9.9', object, "
                      "digest from pgfence.schema_records where schema_name = 'pgfence' "
                      "and release = %s", (PACKAGE.newest(),))
    else:
        target.db.sql("create or replace function pgfence.version() returns text language sql "
                      "as $$ select '9.9.9' $$")
    before = fingerprint(target)
    up = run([*target.args, "upgrade", "--confirm", target.name], tmp_path)
    assert up.code == 1, up.out + up.err
    assert f"has pgfence 9.9.9, newer than {PACKAGE.newest()}" in up.err
    assert "install a newer pgfence package" in up.err
    doc = run([*target.args, "--json", "version"], tmp_path).doc()
    assert doc["state"] == "newer_than_package" and doc["installed"] == "9.9.9"
    assert run([*target.args, "install", "--confirm", target.name], tmp_path).code == 1
    assert fingerprint(target) == before


# --------------------------------------------------------------------------------------------
# upgrade of a real v0.1.0 database (needs sql/releases/pgfence--0.1.0.sql and the upgrade
# files from 0.1.0 to the newest release)


def needs_an_upgrade_from_0_1_0() -> None:
    if not RELEASE_0_1_0.is_file():
        pytest.skip("sql/releases/pgfence--0.1.0.sql is not in this tree yet")
    if PACKAGE.newest() == "0.1.0":
        pytest.skip("the newest release is 0.1.0: there is nothing to upgrade to yet")
    assert PACKAGE.chain("0.1.0", PACKAGE.newest()), "no upgrade files from 0.1.0 to the newest"


def test_upgrade_a_v0_1_0_database_with_live_state(target: Target, tmp_path: Path) -> None:
    needs_an_upgrade_from_0_1_0()
    newest = PACKAGE.newest()
    install_file(target, RELEASE_0_1_0)
    a = target.db.session("a")
    target.db.sql("select pgfence.register('r')")
    lease = acquired(a.acquire("r", "before-upgrade"))
    task = target.db.one("select pgfence.enqueue('q', '{\"n\": 1}')")

    shown = run([*target.args, "version"], tmp_path)
    print(shown.out)                       # `pgfence version` before the upgrade, for the log
    assert "installed: 0.1.0" in shown.out and "upgrade available" in shown.out

    unconfirmed = run([*target.args, "upgrade"], tmp_path)
    assert unconfirmed.code == 4 and target.db.one("select pgfence.version()") == "0.1.0"

    out = run([*target.args, "--json", "upgrade", "--confirm", target.name], tmp_path)
    assert out.code == 0, out.out + out.err
    doc = out.doc()
    assert doc["previous"] == "0.1.0" and doc["installed"] == newest and doc["changed"]
    assert doc["upgrade_files"] == [u.name for u in PACKAGE.chain("0.1.0", newest) or []]

    shown = run([*target.args, "version"], tmp_path)
    print(shown.out)                       # and after
    assert f"installed: {newest}" in shown.out and "up to date" in shown.out
    # The lease taken before the upgrade still works after it; nothing was reissued.
    a.renew(lease)
    a.begin()
    assert a.fence(lease) == lease.generation
    a.commit()
    claimed = target.db.sql("select task_id, attempt_id from pgfence.claim(%s, 'q')",
                            (lease.lease_id,))
    assert [row[0] for row in claimed] == [task]
    assert a.release(lease) is True
    assert acquired(a.acquire("r", "after-upgrade")).generation == lease.generation + 1


def test_upgrade_of_a_hand_altered_v0_1_0_database_is_refused(target: Target,
                                                              tmp_path: Path) -> None:
    needs_an_upgrade_from_0_1_0()
    install_file(target, RELEASE_0_1_0)
    target.db.sql("alter table pgfence.resources add column by_hand text")
    before = fingerprint(target)
    out = run([*target.args, "upgrade", "--confirm", target.name], tmp_path)
    assert out.code == 1, out.out + out.err
    # The CLI compares the schema with the release's fingerprint before it asks (the upgrade
    # file would refuse it too, tests/test_upgrade.py).
    assert "differs from release 0.1.0 as released" in out.err
    assert "nothing was changed" in out.err
    assert "Traceback" not in out.err
    assert target.db.one("select pgfence.version()") == "0.1.0"
    assert fingerprint(target) == before


# --------------------------------------------------------------------------------------------
# Chains of upgrade files, on synthetic releases: each file refuses outside a transaction
# block and refuses a database that is not its source release, as the real ones do.

SYNTHETIC_GUARD = """
do $$
begin
  if pg_catalog.now() = pg_catalog.statement_timestamp() then
    raise exception 'synthetic pgfence: run me inside a transaction block' using errcode = '25P01';
  end if;
end
$$;
"""


def version_function(version: str) -> str:
    return (f"create or replace function pgfence.version() returns text language sql "
            f"as $$ select '{version}'::text $$;\n")


def upgrade_file(source: str, target: str, body: str) -> str:
    return SYNTHETIC_GUARD + f"""
do $$
begin
  if pgfence.version() is distinct from '{source}' then
    raise exception 'synthetic pgfence: this upgrades {source}, the database has %',
      pgfence.version() using errcode = '55000';
  end if;
end
$$;
""" + body + version_function(target)


def synthetic(root: Path, *, second_step_fails: bool = False, padding: int = 0) -> Files:
    """Releases 0.1.0, 0.2.0, 0.3.0 of a tiny pgfence; 0.2.0 -> 0.3.0 may fail half way."""
    (root / "releases").mkdir(parents=True)
    (root / "upgrades").mkdir()
    # The package's queries, and no fingerprint for these releases (none is compared).
    shutil.copytree(ROOT / "sql/queries", root / "queries")
    (root / "releases/fingerprints").write_text("# synthetic releases: none recorded\n")
    release_0_1_0 = ("-- pgfence 0.1.0: one-file install, synthetic\n" + SYNTHETIC_GUARD
                     + "create schema pgfence;\ncreate table pgfence.t (x int);\n"
                     + version_function("0.1.0"))
    (root / "releases/pgfence--0.1.0.sql").write_text(release_0_1_0)
    (root / "upgrades/pgfence--0.1.0--0.2.0.sql").write_text(
        upgrade_file("0.1.0", "0.2.0", "alter table pgfence.t add column y int;\n"))
    (root / "upgrades/pgfence--0.2.0--0.3.0.sql").write_text(upgrade_file(
        "0.2.0", "0.3.0", "alter table pgfence.t add column z int;\n"
        + ("select 1 / 0;\n" if second_step_fails else "")))
    (root / "pgfence.sql").write_text(
        "-- pgfence 0.3.0: one-file install, synthetic\n"
        + "".join(f"-- padding line {i:08d} {'x' * 40}\n" for i in range(padding))
        + SYNTHETIC_GUARD + "create schema pgfence;\n"
        + "create table pgfence.t (x int, y int, z int);\n" + version_function("0.3.0"))
    return Files(root)


def columns(db: Database) -> list[str]:
    return [r[0] for r in db.sql("select attname from pg_attribute where attnum > 0 "
                                 "and attrelid = 'pgfence.t'::regclass order by attnum")]


def test_upgrade_chains_every_file_in_one_transaction(target: Target, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    files = synthetic(tmp_path / "sql")
    monkeypatch.setattr(cli.Cli, "files", files)
    install_file(target, tmp_path / "sql/releases/pgfence--0.1.0.sql")
    out = in_process([*target.args, "--json", "upgrade", "--confirm", target.name], capsys)
    assert out.code == 0, out.out + out.err
    assert out.doc()["upgrade_files"] == ["pgfence--0.1.0--0.2.0.sql",
                                          "pgfence--0.2.0--0.3.0.sql"]
    assert target.db.one("select pgfence.version()") == "0.3.0"
    assert columns(target.db) == ["x", "y", "z"]


def test_a_chain_that_fails_in_its_second_file_leaves_the_first_undone(
        target: Target, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = synthetic(tmp_path / "sql", second_step_fails=True)
    monkeypatch.setattr(cli.Cli, "files", files)
    install_file(target, tmp_path / "sql/releases/pgfence--0.1.0.sql")
    before = fingerprint(target)
    out = in_process([*target.args, "upgrade", "--confirm", target.name], capsys)
    assert out.code == 1, out.out + out.err
    assert "division by zero" in out.err and "rolled back" in out.err
    assert target.db.one("select pgfence.version()") == "0.1.0"
    assert columns(target.db) == ["x"]
    assert fingerprint(target) == before
    # Negative control: the first file alone works, so the chain above did run it and the
    # rollback took it back.
    first = in_process([*target.args, "upgrade", "--to", "0.2.0", "--confirm", target.name],
                       capsys)
    assert first.code == 0, first.err
    assert columns(target.db) == ["x", "y"]


def test_the_files_guards_reach_the_operator(target: Target, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An upgrade file that finds another release than its own refuses (55000); the CLI
    shows the server's message, exit 1, nothing changed."""
    files = synthetic(tmp_path / "sql")
    monkeypatch.setattr(cli.Cli, "files", files)
    install_file(target, tmp_path / "sql/releases/pgfence--0.1.0.sql")
    # The CLI believes the database is 0.2.0; the file's own check knows better.
    monkeypatch.setattr(cli.Cli, "installed", lambda self: cli.Installed(True, "0.2.0"))
    before = fingerprint(target)
    out = in_process([*target.args, "upgrade", "--confirm", target.name], capsys)
    assert out.code == 1, out.err
    assert "this upgrades 0.2.0, the database has 0.1.0" in out.err
    assert fingerprint(target) == before


def test_downgrades_and_missing_paths_are_refused(target: Target, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    files = synthetic(tmp_path / "sql")
    (tmp_path / "sql/releases/pgfence--0.0.9.sql").write_text("-- an old release\n")
    monkeypatch.setattr(cli.Cli, "files", files)
    install_file(target, tmp_path / "sql/releases/pgfence--0.1.0.sql")
    assert in_process([*target.args, "upgrade", "--to", "0.2.0", "--confirm", target.name],
                      capsys).code == 0
    down = in_process([*target.args, "upgrade", "--to", "0.1.0", "--confirm", target.name],
                      capsys)
    assert down.code == 1 and "never downgrades" in down.err
    older = in_process([*target.args, "upgrade", "--to", "0.0.9", "--confirm", target.name],
                       capsys)
    assert older.code == 1 and "never downgrades" in older.err
    assert target.db.one("select pgfence.version()") == "0.2.0"


# --------------------------------------------------------------------------------------------
# What the Supabase CLI can and cannot carry


def test_supabase_db_query_runs_one_statement_only(empty: Empty,
                                                   tmp_path: Path) -> None:
    """Why the Supabase transport wraps a script in one DO block: `db query` prepares what it
    is given, and a prepared statement holds one command, from --file as from an argument."""
    cluster, db, dbname = empty
    script = tmp_path / "two.sql"
    script.write_text("create table one (x int);\ncreate table two (x int);\n")
    out = subprocess.run([str(SUPABASE), "db", "query", "--output-format", "json", "--agent",
                          "no", "--yes", f"--remote=postgresql://postgres@127.0.0.1:{cluster.port}/{dbname}",
                          "--file", str(script)],
                         capture_output=True, text=True, timeout=HUNG)
    assert out.returncode == 1
    assert "cannot insert multiple commands into a prepared statement" in out.stdout
    assert db.one("select count(*) from pg_class where relname in ('one', 'two')") == 0


def test_supabase_carries_an_install_file_past_the_argv_limit(
        empty: Empty, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux caps one argv string at 128 KiB; the transport sends scripts by --file."""
    t = target_for("supabase", *empty)
    files = synthetic(tmp_path / "sql", padding=4000)        # about 240 KiB
    size = len(files.install().encode())
    assert size > 200 * 1024
    monkeypatch.setattr(cli.Cli, "files", files)
    out = in_process([*t.args, "install", "--confirm", t.name], capsys)
    assert out.code == 0, out.err
    assert t.db.one("select pgfence.version()") == "0.3.0"
    # Negative control: the same SQL as one argument cannot even be started.
    with pytest.raises(OSError) as e:
        subprocess.run([str(SUPABASE), "db", "query", files.install()], capture_output=True)
    assert e.value.errno == 7          # E2BIG: Argument list too long


def test_supabase_run_script_is_one_statement_in_one_transaction(
        empty: Empty) -> None:
    """The DO block runs inside the transaction the Supabase CLI opens (a transaction block:
    now() is earlier than the statement's timestamp), and a failure takes back all of it."""
    cluster, db, dbname = empty
    sb = Supabase(str(SUPABASE), f"postgresql://postgres@127.0.0.1:{cluster.port}/{dbname}")
    sb.run_script(["create table seen (block boolean);\n"
                   "insert into seen select now() < statement_timestamp();"])
    assert db.one("select block from seen") is True
    with pytest.raises(Refused, match="division by zero"):
        sb.run_script(["create table gone (x int);", "insert into seen values (null);",
                       "select 1 / 0;"])
    assert db.one("select to_regclass('gone') is null and count(*) = 1 from seen") is True


# --------------------------------------------------------------------------------------------
# The SQL inside the package


def test_the_editable_package_reads_the_repository_sql() -> None:
    assert (ROOT / "src/pgfence/schema").is_symlink()
    assert PACKAGE.install() == (ROOT / "sql/pgfence.sql").read_text()
    assert PACKAGE.newest() in PACKAGE.known()


def test_the_header_names_the_release() -> None:
    first = (ROOT / "sql/pgfence.sql").read_text().partition("\n")[0]
    assert first.startswith(f"-- pgfence {PACKAGE.newest()}: one-file install")


# --------------------------------------------------------------------------------------------
# Transport failures and credentials


def test_an_unreachable_database_is_a_transport_failure(tmp_path: Path) -> None:
    for command in (["version"], ["install", "--confirm", "127.0.0.1:1/nowhere"],
                    ["upgrade", "--confirm", "127.0.0.1:1/nowhere"]):
        out = run(["--db-url", "postgresql://postgres@127.0.0.1:1/nowhere", *command], tmp_path)
        assert out.code == 3, (command, out.err)
        assert "Traceback" not in out.err


def test_a_lost_answer_says_how_to_find_out(empty: Empty, tmp_path: Path) -> None:
    """The Supabase CLI dies (SIGKILL) after its install committed, before it answered."""
    t = target_for("supabase", *empty)
    fake = ROOT / "tests/bin/fake-supabase"
    args = ["--supabase", "--supabase-bin", str(fake), *t.args[3:]]
    out = run([*args, "install", "--confirm", t.name], tmp_path,
              env={"FAKE_SUPABASE_MODE": "die-after-first-write",
                   "FAKE_SUPABASE_REAL": str(SUPABASE),
                   "FAKE_SUPABASE_STATE": str(tmp_path / "state")})
    assert out.code == 3, out.err
    assert "killed by signal SIGKILL" in out.err
    assert "it committed entirely or not at all. To see which: pgfence --supabase" in out.err
    # It did commit (the fake ran it for real), and version says so.
    version = run([*t.args, "--json", "version"], tmp_path)
    assert version.doc()["state"] == "up_to_date"


def test_no_credentials_in_any_output(empty: Empty, tmp_path: Path) -> None:
    cluster, _, dbname = empty
    secret = "s3cr3t-Pa55word"
    port = cluster.port
    good = f"postgresql://postgres:{secret}@127.0.0.1:{port}/{dbname}"
    dead = f"postgresql://postgres:{secret}@127.0.0.1:1/{dbname}"
    confirm = ["--confirm", f"127.0.0.1:{port}/{dbname}"]
    supabase = ["--supabase", "--supabase-bin", str(SUPABASE)]
    outputs = [
        run(["--db-url", good, "version"], tmp_path),
        run(["--db-url", good, "install", *confirm], tmp_path),
        run(["--db-url", good, "install", *confirm], tmp_path),          # already installed
        run(["--db-url", good, "upgrade", "--to", "0.0.0", *confirm], tmp_path),
        run(["--db-url", dead, "install", "--confirm", f"127.0.0.1:1/{dbname}"], tmp_path),
        run([*supabase, f"--remote={good}", "version"], tmp_path),
        run([*supabase, f"--remote={good}", "install", *confirm], tmp_path),
        run([*supabase, f"--remote={dead}", "install", "--confirm", f"127.0.0.1:1/{dbname}"],
            tmp_path),
    ]
    assert [o.code for o in outputs] == [0, 0, 1, 2, 3, 0, 1, 3], [o.err for o in outputs]
    for out in outputs:
        assert secret not in out.out + out.err


# --------------------------------------------------------------------------------------------
# The layers: reported against the package, and upgraded with pgfence (issue 44)


def with_layers_at(t: Target, release: str, core_to: str | None = None) -> None:
    """pgmq and pgflow, then pgfence `release` and both its layers from the release files;
    with `core_to`, pgfence alone then upgraded by its files (the layers left behind)."""
    install.prerequisites(t.cluster, t.dbname, ["pgflow"])
    for name in (f"pgfence--{release}.sql", f"pgfence-pgmq--{release}.sql",
                 f"pgfence-pgflow--{release}.sql"):
        install_file(t, ROOT / "sql/releases" / name)
    if core_to is not None:
        for step in PACKAGE.chain(release, core_to) or []:
            install_file(t, ROOT / "sql/upgrades" / step.name)


def next_release(after: str) -> str:
    chain = PACKAGE.chain(after, PACKAGE.newest())
    assert chain, f"no upgrade from {after}"
    return chain[0].target


NEXT = next_release("0.2.0")


def layer_newest(layer: str) -> str:
    """The layer's newest release: the last that changed it (a release that does not change a
    layer ships no file of it), the head's too when it is not tagged yet (an upgrade file)."""
    return max([p.name.removeprefix(f"pgfence-{layer}--").removesuffix(".sql")
                for p in (ROOT / "sql/releases").glob(f"pgfence-{layer}--*.sql")]
               + [u.target for u in PACKAGE.layer_chain(layer, "0.1.0", PACKAGE.newest())],
               key=key)


def test_a_layer_left_behind_is_reported_and_upgraded(
        target: Target, tmp_path: Path, reads_cluster_roles: None) -> None:
    """pgfence upgraded alone to the next release, its layers left at 0.2.0 (the issue's case):
    version and doctor say so, and upgrade brings pgfence and the layers up in one transaction,
    each layer's file after pgfence's of its release, with nothing left to do after."""
    with_layers_at(target, "0.2.0", core_to=NEXT)
    version = run([*target.args, "--json", "version"], tmp_path)
    assert version.code == 0, version.err
    doc = version.doc()
    expected = upgrade_files(NEXT, {"pgmq": NEXT, "pgflow": "0.2.0"})
    assert (doc["installed"], doc["state"], doc["upgrade_files"]) == (
        NEXT, "upgrade_available", expected)
    assert expected[0] == f"pgfence-pgflow--0.2.0--{NEXT}.sql"   # while pgfence is at NEXT
    assert [(x["layer"], x["installed"], x["state"]) for x in doc["layers"]] == [
        ("pgmq", NEXT, "up_to_date" if layer_newest("pgmq") == NEXT else "upgrade_available"),
        ("pgflow", "0.2.0", "upgrade_available")]
    human = run([*target.args, "version"], tmp_path).out
    assert f"  pgflow layer: 0.2.0; {layer_newest('pgflow')} available" in human
    assert "up to date" not in human
    doctor = run([*target.args, "doctor", "--requeue-elsewhere", "--json"], tmp_path)
    assert doctor.code == 0, doctor.out + doctor.err
    rows = {c["check"]: c for c in doctor.doc()["checks"]}
    assert rows["pgflow layer release"]["status"] == "warning"
    assert f"0.2.0; {layer_newest('pgflow')} available" in rows["pgflow layer release"]["detail"]

    up = run([*target.args, "--json", "upgrade", "--confirm", target.name], tmp_path)
    assert up.code == 0, up.out + up.err
    assert up.doc()["upgrade_files"] == expected
    after = run([*target.args, "--json", "version"], tmp_path).doc()
    assert after["state"] == "up_to_date" and after["upgrade_files"] == []
    assert [(x["layer"], x["installed"]) for x in after["layers"]] == [
        ("pgmq", layer_newest("pgmq")), ("pgflow", layer_newest("pgflow"))]
    again = run([*target.args, "upgrade", "--confirm", target.name], tmp_path)
    assert again.code == 0 and "nothing to do" in again.out


def upgrade_files(core: str, layers: dict[str, str]) -> list[str]:
    """What an upgrade to the newest runs, in order: per release B, pgfence's file to B, then
    each layer's to B (pgmq before pgflow)."""
    newest = PACKAGE.newest()
    steps = [(key(u.target), 0, u.name) for u in PACKAGE.chain(core, newest) or []]
    for i, (layer, release) in enumerate(layers.items(), 1):
        steps += [(key(u.target), i, u.name) for u in PACKAGE.layer_chain(layer, release, newest)]
    return [name for *_, name in sorted(steps)]


def test_upgrade_carries_pgfence_and_its_layers_in_one_transaction(
        target: Target, tmp_path: Path) -> None:
    newest = PACKAGE.newest()
    with_layers_at(target, "0.2.0")
    up = run([*target.args, "--json", "upgrade", "--confirm", target.name], tmp_path)
    assert up.code == 0, up.out + up.err
    files = up.doc()["upgrade_files"]
    assert files == upgrade_files("0.2.0", {"pgmq": "0.2.0", "pgflow": "0.2.0"})
    assert files[:2] == [f"pgfence--0.2.0--{NEXT}.sql", f"pgfence-pgflow--0.2.0--{NEXT}.sql"]
    assert target.db.one("select pgfence.version()") == newest
    after = run([*target.args, "--json", "version"], tmp_path).doc()
    assert after["state"] == "up_to_date", after


def test_a_layer_left_behind_twice_is_refused_by_name(
        target: Target, tmp_path: Path, reads_cluster_roles: None) -> None:
    """pgfence upgraded alone past the release a layer's next file needs: no file can carry
    the layer now. version and doctor say so; upgrade refuses before anything runs."""
    newest = PACKAGE.newest()
    if newest == NEXT:
        pytest.skip("needs two releases after 0.2.0")
    with_layers_at(target, "0.2.0", core_to=newest)
    before = fingerprint(target)
    version = run([*target.args, "--json", "version"], tmp_path).doc()
    assert version["state"] == "no_upgrade_path"
    stuck = [x["layer"] for x in version["layers"] if x["state"] == "no_upgrade_path"]
    assert "pgflow" in stuck, version
    up = run([*target.args, "upgrade", "--confirm", target.name], tmp_path)
    assert up.code == 1 and "left behind" in up.err, up.err
    assert any(f"the {layer} layer" in up.err for layer in stuck), up.err
    doctor = run([*target.args, "doctor", "--requeue-elsewhere", "--json"], tmp_path).doc()
    assert "pgflow layer release" in [c["check"] for c in doctor["checks"]
                                      if c["status"] == "failed"]
    assert fingerprint(target) == before


def test_a_layer_changed_by_hand_is_refused(
        target: Target, tmp_path: Path, reads_cluster_roles: None) -> None:
    with_layers_at(target, "0.2.0", core_to=NEXT)
    target.db.sql("create function pgfence_pgflow.mine() returns int language sql "
                  "as $$ select 1 $$")
    before = fingerprint(target)
    version = run([*target.args, "--json", "version"], tmp_path)
    assert version.code == 1 and version.doc()["state"] == "drifted"
    (pgflow,) = [x for x in version.doc()["layers"] if x["layer"] == "pgflow"]
    assert pgflow["state"] == "drifted" and pgflow["installed"] is None
    up = run([*target.args, "upgrade", "--confirm", target.name], tmp_path)
    assert up.code == 1 and "is no release of the pgflow layer" in up.err, up.err
    doctor = run([*target.args, "doctor", "--requeue-elsewhere", "--json"], tmp_path)
    assert doctor.code == 1
    assert [c["check"] for c in doctor.doc()["checks"] if c["status"] == "failed"] == [
        "pgflow layer release"]
    assert fingerprint(target) == before


def test_a_layer_sqitch_deploys_is_left_to_sqitch(empty: Empty, tmp_path: Path) -> None:
    """A registry that tracks the layer's own project (pgfence_pgflow): the CLI names the
    Sqitch command for it and changes nothing. (The registry is made as Sqitch makes it, its
    two tables: tests/test_install_paths.py runs the real Sqitch for pgfence's own.)"""
    t = target_for("direct", *empty)
    newest = PACKAGE.newest()
    with_layers_at(t, "0.2.0", core_to=NEXT)
    t.db.sql("create schema sqitch; create table sqitch.projects (project text primary key); "
             "create table sqitch.changes (change_id text); "
             "insert into sqitch.projects values ('pgfence_pgflow')")
    version = run([*t.args, "version"], tmp_path)
    assert "pgflow layer: 0.2.0; " in version.out
    assert "deployed by Sqitch (registry schema sqitch)" in version.out
    before = fingerprint(t)
    up = run([*t.args, "upgrade", "--confirm", t.name], tmp_path)
    assert up.code == 1, up.out + up.err
    assert f'cd layers/pgflow && sqitch deploy --to @v{newest} "db:$DATABASE_URL"' in up.err
    assert fingerprint(t) == before


def test_the_cli_aims_its_queries_at_a_layer_as_the_upgrade_files_do() -> None:
    """One rule for both: scripts/bundle's (tests.support.bundle_query) and the package's."""
    for name in ("fingerprint.sql", "sqitch_registry.sql"):
        ours = cli.strip(PACKAGE.query(name, "pgfence_pgflow"))
        assert ours.rstrip(";").strip() == bundle_query(name, "pgfence_pgflow").rstrip(
            ";").strip()
