"""One install path per database (issue 29): Sqitch and the other paths (the one file, its
upgrade files, the CLI) never both change one database; Sqitch adopts a one-file database at
every release. What the server's catalogs and the revert scripts decide (drift against a
release's fingerprint, a revert with live state) is tests/test_drift_and_revert.py's, on every
version; this module's rules are the CLI's, Sqitch's registry and the plan's.

Every test runs real Sqitch and the real CLI against the test's cluster. The path matrix these
tests cover is in docs/upgrading.md ("Which paths a database may take").
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import tomllib
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pgfence.connection import connect
from pgfence.releases import Files, key
from testkit import install
from testkit.cluster import Cluster
from testkit.install import SQITCH_ENV
from testkit.install import sqitch as sqitch_ok
from tests.support import HUNG, ROOT, bundle
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
                           capture_output=True, text=True, timeout=HUNG, stdin=subprocess.DEVNULL)
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
    assert f'sqitch deploy --to @v{HEAD} "db:$DATABASE_URL"' in out, out
    assert "git checkout" not in out, "a clone need not have git tags"
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
    # The recipe it names: record what the database holds, then verify; Sqitch then upgrades
    # it from there.
    sqitch_ok("deploy", "--log-only", "--to", "@v0.2.0", db.sqitch)
    sqitch_ok("verify", db.sqitch)
    sqitch_ok("deploy", db.sqitch)
    assert db.one("select pgfence.version()") == HEAD
    assert "Nothing to deploy" in sqitch_ok("deploy", db.sqitch).stdout
    renews(db)


def test_a_one_file_database_refuses_sqitch_deploy_and_keeps_working(make: Any) -> None:
    db = make()
    install.core(db.cluster, db.name)
    before = db.dump()
    out = sqitch("deploy", db.sqitch)
    assert out.returncode != 0 and 'schema "pgfence" already exists' in out.stdout + out.stderr
    assert db.dump() == before
    assert db.one("select pgfence.version()") == HEAD
    renews(db)


# --- item 3: adoption by Sqitch at every release ------------------------------------------------

RELEASED = sorted((p.name.removeprefix("pgfence--").removesuffix(".sql")
                   for p in (ROOT / "sql/releases").glob("pgfence--*.sql")),
                  key=key)


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
    install.core(fresh.cluster, fresh.name)
    assert db.dump() == fresh.dump()
    renews(db)


def test_negative_control_a_verify_that_pins_a_release_fails_adoption(make: Any,
                                                                    tmp_path: Path) -> None:
    """The verify script as it was (version() = '0.1.0' exactly) fails --log-only at the head."""
    db = make()
    install.core(db.cluster, db.name)
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


def test_the_first_change_after_every_tag_refuses_a_database_another_path_moved() -> None:
    """The rule of the plan that keeps `sqitch deploy` off a database upgraded by another path:
    the script that the first change after each release runs checks that the database holds
    that release (up to 0.2.1 in a DO block, as checks.sql does; from 0.3.0 on with
    pgfence.expect_release, which scripts/bundle requires too)."""
    rules = bundle()
    entries = rules.read_plan()
    found = 0
    for e, after in itertools.pairwise(entries):
        for tag in e.tags[-1:]:
            release = tag.removeprefix("v")
            text = rules.script(entries, after).read_text()
            guard = (f"if v_found is distinct from '{release}' then" if rules.legacy(tag)
                     else f"perform pgfence.expect_release('pgfence', '{release}');")
            assert guard in text, (
                f"{rules.script(entries, after).relative_to(ROOT)}, the first change after "
                f"@v{release}, must refuse a database that does not hold {release}")
            found += 1
    assert found, "no change after a tag"


# --- issue 43 item 8 e: a layer's section ends with its release's change ------------------------

EXTRA = """-- Deploy pgfence_pgmq:extra
begin;
create function pgfence_pgmq.extra() returns int language sql as 'select 1';
commit;
"""


def with_a_change_after_the_release(tmp_path: Path) -> Path:
    """A copy of layers/pgmq whose plan, before its last release's tag, has a change after its
    release's change (added with `sqitch add`, its line left after release_X instead of moved
    above it), and the layer's fingerprints: what scripts/bundle reads of a layer."""
    root = tmp_path / "repo"
    shutil.copytree(ROOT / "layers/pgmq", root / "layers/pgmq")
    (root / "sql/releases").mkdir(parents=True)
    shutil.copy2(ROOT / "sql/releases/fingerprints-pgmq", root / "sql/releases")
    (root / "layers/pgmq/deploy/extra.sql").write_text(EXTRA)
    plan = root / "layers/pgmq/sqitch.plan"
    # Before the release's tag (a released plan ends with it): its section still open.
    lines = plan.read_text().rstrip("\n").splitlines()
    while lines[-1].startswith("@"):
        lines.pop()
    assert lines[-1].startswith("release_"), lines[-1]
    plan.write_text("\n".join(lines) + "\nextra 2026-12-07T00:00:00Z pgfence <pgfence@localhost> "
                                       "# a change after the release's\n")
    return root


def layer_files_of(rules: Any, root: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """scripts/bundle's files of the pgmq layer under ``root``, bundled as the pgfence release
    its open section would ship with (the one it seals: the repository's head may be later)."""
    monkeypatch.setattr(rules, "ROOT", root)
    monkeypatch.setattr(rules, "SQL", root / "sql")
    plan = (root / "layers/pgmq/sqitch.plan").read_text()
    head = re.findall(r"(?m)^release_(\S+) ", plan)[-1]
    return rules.layer_files("pgmq", head)


def test_a_layer_section_that_does_not_end_with_its_release_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """scripts/bundle refuses a layer plan whose section ends with anything but its release's
    change (pgfence.seal, which runs the lockdown last): a change after it would ship, in the
    layer's install and upgrade, with whatever default privileges grant."""
    rules = bundle()
    with pytest.raises(rules.PlanError, match=r"layers/pgmq: the plan section ending at extra "
                                              r"must end with its release's change"):
        layer_files_of(rules, with_a_change_after_the_release(tmp_path), monkeypatch)


def test_negative_control_a_rule_without_the_end_lets_the_layer_out_unlocked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cluster: Cluster, template: str) -> None:
    """scripts/bundle as the catalogued mutant `bundle-layer-seal-anywhere` (the section only
    has to hold its release's change): the same plan passes, and its layer install, run after
    pgfence and pgmq, leaves the change's function to PUBLIC."""
    mutants = tomllib.loads((ROOT / "tests/mutation/mutants.toml").read_text())["mutant"]
    [m] = [m for m in mutants if m["id"] == "bundle-layer-seal-anywhere"]
    source = (ROOT / "scripts/bundle").read_text()
    assert source.count(m["text"]) == 1
    variant = types.ModuleType("pgfence_bundle_variant")
    variant.__dict__["__file__"] = str(ROOT / "scripts/bundle")
    monkeypatch.setitem(sys.modules, variant.__name__, variant)  # its dataclasses look it up
    exec(compile(source.replace(m["text"], m["replacement"]), "scripts/bundle", "exec"),
         variant.__dict__)
    files = layer_files_of(variant, with_a_change_after_the_release(tmp_path), monkeypatch)
    install = files[tmp_path / "repo/sql/pgfence-pgmq.sql"]
    name = f"p_{uuid.uuid4().hex[:10]}"
    cluster.create_database(name, template)
    try:
        cluster.psql(name, "-c", "create extension pgmq")
        (tmp_path / "layer.sql").write_text(install)
        cluster.psql(name, "--single-transaction", "-f", tmp_path / "layer.sql")
        public = cluster.psql(name, "-At", "-c", "select has_function_privilege('public', "
                              "'pgfence_pgmq.extra()', 'execute')")
        assert public.strip() == "t"
    finally:
        cluster.drop_database(name)
