"""Upgrades: every release in sql/releases/ is carried to the head, by the one-file upgrades
and by Sqitch, with live state in it; the result is the schema of a fresh install, the pgTAP
suite passes on it, and what was live before still works. Also: the refusals (wrong version,
a schema changed by hand, no transaction block), Sqitch up/down/up across a release, and the
rule that a released deploy script is never edited.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb

import pgfence
from pgfence.connection import connect
from pgfence.releases import key as version_key
from testkit import conformance, install, layers
from testkit.cluster import Cluster, ClusterError
from testkit.harness import Database
from testkit.install import SQITCH_ENV, sqitch
from tests.support import ROOT, bundle
from tests.test_install import schema_dump as dump

RELEASES = ROOT / "sql/releases"
UPGRADES = ROOT / "sql/upgrades"
HEAD = re.match(r"-- pgfence (\S+):", (ROOT / "sql/pgfence.sql").read_text()).group(1)  # type: ignore[union-attr]


# Releases up to this one are fingerprinted by migrations/fingerprint.sql; later ones by
# pgfence.schema_fingerprint (scripts/bundle's LEGACY, read rather than written again).
LEGACY = bundle().LEGACY


def legacy(release: str) -> bool:
    """Whether ``release``'s upgrade file checks the database by itself (up to LEGACY), rather
    than by pgfence.check_release."""
    return version_key(release) <= version_key(LEGACY)


def released() -> list[str]:
    found = [p.name.removeprefix("pgfence--").removesuffix(".sql")
             for p in RELEASES.glob("pgfence--*.sql")]
    return sorted(found, key=version_key)


def chain(start: str, to: str = HEAD) -> list[Path]:
    """The upgrade files from release `start` to `to` (the head), in order."""
    steps: dict[str, Path] = {}
    for p in UPGRADES.glob("pgfence--*--*.sql"):
        steps[p.name.removeprefix("pgfence--").split("--")[0]] = p
    files, at = [], start
    while at != to:
        assert at in steps, f"no upgrade from {at} towards {to}"
        files.append(steps[at])
        at = steps[at].name.removesuffix(".sql").split("--")[2]
    return files


OLDER = [v for v in released() if v != HEAD]


def layer_steps(layer: str) -> list[tuple[str, str, Path]]:
    """The layer's upgrade files, (from, to, file), in order. A release in which the layer did
    not change has none from it: its schema is the next release's, whose file starts there."""
    steps = []
    for p in UPGRADES.glob(f"pgfence-{layer}--*--*.sql"):
        _, frm, dst = p.name.removesuffix(".sql").split("--")
        steps.append((frm, dst, p))
    return sorted(steps, key=lambda s: version_key(s[0]))


class Databases:
    """Empty databases of the test's cluster, named after a tag, dropped after the test."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.made: list[str] = []

    def fresh(self, tag: str, template: str | None = None) -> str:
        name = f"u_{tag}_{uuid.uuid4().hex[:8]}"
        self.cluster.create_database(name, template)
        self.made.append(name)
        return name

    def psql(self, database: str, *args: str | Path) -> str:
        return self.cluster.psql(database, *args)

    def dsn(self, database: str) -> str:
        return self.cluster.dsn(database)

    def install_release(self, database: str, version: str) -> None:
        self.psql(database, "--single-transaction", "-f", RELEASES / f"pgfence--{version}.sql")

    def upgrade_by_file(self, database: str, start: str, layers: tuple[str, ...] = (),
                        to: str = HEAD) -> None:
        """From release `start` to `to` by the one-file upgrades: each of pgfence's, then (a
        layer's upgrade runs on the pgfence release it comes with) each layer's that leads to
        that release."""
        at = dict.fromkeys(layers, start)
        for step in chain(start, to):
            self.psql(database, "--single-transaction", "-f", step)
            target = step.name.removesuffix(".sql").split("--")[2]
            for layer in layers:
                for frm, dst, following in layer_steps(layer):
                    if (version_key(at[layer]) <= version_key(frm)
                            and version_key(dst) <= version_key(target)):
                        self.psql(database, "--single-transaction", "-f", following)
                        at[layer] = dst

    def fingerprint(self, database: str, release: str | None = None) -> str:
        """The fingerprint an upgrade from ``release`` checks: up to 0.2.1, of
        migrations/fingerprint.sql; from 0.3.0 on, pgfence.schema_fingerprint (the md5 of the
        one record of the schema, which check_release compares)."""
        if release is not None and version_key(release) > version_key(LEGACY):
            return self.psql(database, "-At", "-c",
                             "select pgfence.schema_fingerprint('pgfence')").strip()
        return self.psql(database, "-At", "-f", ROOT / "migrations/fingerprint.sql").strip()

    def version(self, database: str) -> str:
        return self.psql(database, "-At", "-c", "select pgfence.version()").strip()

    def head_dump(self) -> str:
        """The schema of a fresh install of the head."""
        head = self.fresh("head")
        install.core(self.cluster, head)
        return schema_dump(head)


@pytest.fixture
def dbs(cluster: Cluster) -> Iterator[Databases]:
    made = Databases(cluster)
    yield made
    for name in made.made:
        cluster.drop_database(name)


def recorded_fingerprints() -> dict[str, str]:
    lines = (RELEASES / "fingerprints").read_text().splitlines()
    return dict(line.split() for line in lines if line.strip() and not line.startswith("#"))


# --- live state: made on the old release, used after the upgrade --------------------------------

@dataclass
class Live:
    current: uuid.UUID          # an active lease with an hour to go
    draining: uuid.UUID         # drained, still renewing
    stale: uuid.UUID            # active but expired: authorizes nothing
    attempts: list[uuid.UUID]   # claimed tasks' attempt ids under `current`
    queued: int                 # a task nobody claimed yet
    invocation: uuid.UUID       # a pending startup request
    token: uuid.UUID            # an open update window over win (enabled) and win_off (disabled)
    max_generation: int


def one(conn: psycopg.Connection[tuple[object, ...]], query: str, *params: object) -> object:
    row = conn.execute(query, params or None).fetchone()
    assert row is not None
    return row[0]


def make_live_state(dbs: Databases, database: str) -> Live:
    with connect(dbs.dsn(database), "live") as conn:
        for r in ("cur", "drn", "stl", "inv", "win"):
            conn.execute("select pgfence.register(%s)", (r,))
        conn.execute("select pgfence.register('win_off', false)")
        current = one(conn, "select lease_id from pgfence.acquire('cur', 'a', '1 hour')")
        draining = one(conn, "select lease_id from pgfence.acquire('drn', 'b', '1 hour')")
        conn.execute("select pgfence.drain(%s)", (draining,))
        stale = one(conn, "select lease_id from pgfence.acquire('stl', 'c', '1 hour')")
        # Time passes for c: the test moves its expiry, as pgfence_test.expire does.
        conn.execute("update pgfence.leases set expires_at = clock_timestamp() - interval '1 ms' "
                     "where lease_id = %s", (stale,))
        for n in range(4):
            conn.execute("select pgfence.enqueue('q', %s)", (Jsonb({"n": n}),))
        attempts = [row[0] for row in conn.execute(
            "select attempt_id from pgfence.claim(%s, 'q', 3, '1 hour')", (current,))]
        queued = one(conn, "select task_id from pgfence.tasks where state = 'queued'")
        invocation = one(conn, "select pgfence.request_start('inv', '1 hour')")
        token = one(conn, "select pgfence.prepare_update(array['win', 'win_off'], %s)",
                    uuid.uuid4())
        # The application's own table, in a schema the dump comparisons leave out.
        conn.execute("create schema app")
        conn.execute("create table app.audit (id bigint generated always as identity, "
                     "generation bigint)")
        conn.execute("select pgfence.protect('app.audit', 'cur')")
        max_generation = one(conn, "select max(generation) from pgfence.leases")
    assert len(attempts) == 3 and invocation is not None
    return Live(current, draining, stale, attempts, queued, invocation, token,  # type: ignore[arg-type]
                max_generation)  # type: ignore[arg-type]


def check_live_state(dbs: Databases, database: str, live: Live) -> None:
    with connect(dbs.dsn(database), "after") as conn:
        renew = "select state from pgfence.renew(%s, '1 hour')"
        assert one(conn, renew, live.current) == "active"
        with conn.transaction():
            generation = one(conn, "select pgfence.fence(%s)", live.current)
            conn.execute("insert into app.audit (generation) values (%s)", (generation,))
        with pytest.raises(psycopg.Error) as unfenced:
            conn.execute("insert into app.audit (generation) values (0)")
        assert unfenced.value.sqlstate == "PF007"
        # Protected before the upgrade, and known to protected_tables after it.
        assert conn.execute("select table_name, resources, mode, healthy "
                            "from pgfence.protected_tables").fetchall() == [
            ("app.audit", ["cur"], "enforce", True)]
        assert one(conn, "select pgfence.complete(%s, '{}')", live.attempts[0]) == "accepted"
        assert one(conn, "select pgfence.complete(%s, '{}')", live.attempts[0]) == "duplicate"
        assert one(conn, "select pgfence.fail(%s, '{}')", live.attempts[1]) == "accepted"
        # A batch completes a task claimed before the upgrade (complete_many reworked in 0.3.1).
        many = "select outcome from pgfence.complete_many(%s)"
        assert conn.execute(many, ([live.attempts[2]],)).fetchall() == [("accepted",)]
        assert conn.execute(many, ([live.attempts[2]],)).fetchall() == [("duplicate",)]
        assert one(conn, renew, live.draining) == "draining"
        with pytest.raises(psycopg.Error) as stale:
            conn.execute("select pgfence.fence(%s)", (live.stale,))
        assert stale.value.sqlstate == "PF001"
        taken = conn.execute("select lease_id, generation "
                             "from pgfence.acquire('stl', 'd', '1 hour')").fetchone()
        assert taken is not None and taken[1] > live.max_generation, "a generation was reissued"
        # The pending invocation still holds off a second start, and acquire acknowledges it.
        assert one(conn, "select pgfence.request_start('inv')") is None
        assert one(conn, "select generation from pgfence.acquire('inv', 'e', '1 hour', %s)",
                   live.invocation) is not None
        finished = conn.execute("select resource, outcome from pgfence.finish_update(%s)",
                                (live.token,)).fetchall()
        outcomes: dict[object, object] = dict(finished)
        assert outcomes == {"win": "restored", "win_off": "kept_disabled"}
        enabled = conn.execute("select resource, enabled from pgfence.resources "
                               "where resource like 'win%%'").fetchall()
        assert dict(enabled) == {"win": True, "win_off": False}
        fresh_attempt = one(conn, "select attempt_id from pgfence.claim(%s, 'q', 1, '1 hour')",
                            live.current)
        assert fresh_attempt not in live.attempts
        assert one(conn, "select pgfence.release(%s)", live.current) is True
        assert one(conn, "select pgfence.release(%s)", live.current) is False


def schema_dump(database: str) -> str:
    """pgfence's schema only: the live state's application table is not part of it."""
    return dump(database, exclude=("app",))


# --- the upgrade paths --------------------------------------------------------------------------

def test_every_release_has_its_fingerprint_recorded(dbs: Databases) -> None:
    recorded = recorded_fingerprints()
    for release in released():
        name = dbs.fresh("print")
        dbs.install_release(name, release)
        assert dbs.version(name) == release
        found = dbs.fingerprint(name, release)
        assert recorded.get(release) == found, (
            f"record `{release} {found}` in sql/releases/fingerprints")


def test_head_is_the_newest_release_or_newer() -> None:
    assert released(), "no release in sql/releases"
    assert version_key(HEAD) >= version_key(released()[-1])
    assert OLDER or released()[-1] == HEAD
    # The Python package carries this schema: it has the head's version number (its one
    # source, which the wheel's metadata reads; tests/test_version.py ties the rest).
    assert pgfence.__version__ == HEAD


@pytest.mark.parametrize("start", OLDER)
def test_one_file_upgrade_keeps_live_state(dbs: Databases, start: str) -> None:
    name = dbs.fresh("file")
    dbs.install_release(name, start)
    live = make_live_state(dbs, name)
    dbs.upgrade_by_file(name, start)
    assert dbs.version(name) == HEAD
    assert schema_dump(name) == dbs.head_dump()
    check_live_state(dbs, name, live)


@pytest.mark.parametrize("start", OLDER)
def test_sqitch_upgrade_of_a_one_file_install_keeps_live_state(dbs: Databases,
                                                               start: str) -> None:
    # Installed from the one file, then moved onto Sqitch: --log-only records the release's
    # changes as deployed without running them (docs/upgrading.md).
    name = dbs.fresh("sqitch")
    dbs.install_release(name, start)
    live = make_live_state(dbs, name)
    sqitch("deploy", "--log-only", "--to", f"@v{start}", f"db:pg:{name}")
    sqitch("deploy", f"db:pg:{name}")
    assert dbs.version(name) == HEAD
    assert schema_dump(name) == dbs.head_dump()
    check_live_state(dbs, name, live)


def released_layers(release: str) -> list[str]:
    """The layers that came with pgfence ``release`` (a layer newer than it has no file of it)."""
    return [n for n in layers.names() if (RELEASES / f"pgfence-{n}--{release}.sql").is_file()]


@pytest.mark.parametrize("path", ["file", "sqitch"])
@pytest.mark.parametrize("start", OLDER)
def test_upgrade_to_the_head_with_live_state_then_its_layers(dbs: Databases, start: str,
                                                             path: str) -> None:
    """A database of an older release with live state (a lease, claimed tasks, a window, a
    protected table), what every layer stands on beside it, upgraded to the head, then the
    head's layers installed: the schema is a fresh install's of the head and its layers, and a
    lease acquired before the upgrade starts and finishes work through each layer (its
    conformance driver, layers/NAME/conformance.py), the core's live state still working
    after."""
    name, fresh = dbs.fresh("layers"), dbs.fresh("target")
    for each in (name, fresh):
        install.prerequisites(dbs.cluster, each, ["all"])
    dbs.install_release(name, start)
    live = make_live_state(dbs, name)
    if path == "file":
        dbs.upgrade_by_file(name, start)
        for layer in layers.names():
            install.layer(dbs.cluster, name, layer)
    else:
        sqitch("deploy", "--log-only", "--to", f"@v{start}", f"db:pg:{name}")
        sqitch("deploy", f"db:pg:{name}")
        for layer in layers.names():
            sqitch("deploy", f"db:pg:{name}", layer=layer)
    install.install(dbs.cluster, fresh, ["all"], with_prerequisites=False)
    assert dbs.version(name) == HEAD
    assert schema_dump(name) == schema_dump(fresh)
    db = Database(dbs.dsn(name))
    try:
        s = db.session("layers")
        for found in layers.discover():
            d = conformance.driver(found)
            d.prepare(db, f"after-{found.name}")
            attempt = d.start(s, live.current)
            assert d.finish(s, attempt) == "accepted"
            assert d.finish(s, attempt) == "duplicate"
            assert d.finish(s, d.start(s, live.current)) == "accepted"
            assert db.one(f"select bool_and(ok) from {found.schema}.health()") is True
    finally:
        db.close()
    check_live_state(dbs, name, live)


@pytest.mark.parametrize("start", OLDER)
def test_pgtap_suite_passes_on_an_upgraded_database(dbs: Databases, start: str) -> None:
    # With what every layer stands on beside the release, and every layer installed onto the
    # upgrade (their pgTAP files are in the suite).
    name = dbs.fresh("pgtap")
    install.prerequisites(dbs.cluster, name, ["all"])
    dbs.install_release(name, start)
    make_live_state(dbs, name)
    dbs.upgrade_by_file(name, start)
    for layer in layers.names():
        install.layer(dbs.cluster, name, layer)
    install.helpers(dbs.cluster, name, pgtap=True)
    files = [*sorted(str(p) for p in (ROOT / "pgtap").rglob("*.sql") if "helpers" not in p.parts),
             *(str(p) for layer in layers.discover() for p in layer.pgtap)]
    prove = subprocess.run(["pg_prove", "-d", name, *files], capture_output=True, text=True)
    assert prove.returncode == 0, prove.stdout[-3000:] + prove.stderr[-2000:]
    assert "Result: PASS" in prove.stdout


@pytest.mark.parametrize("start", OLDER)
def test_sqitch_up_down_up_across_a_release(dbs: Databases, start: str,
                                            sqitch_template: Callable[[str], str]) -> None:
    name = dbs.fresh("updown", sqitch_template(f"@v{start}"))   # `sqitch deploy --to` start
    release_dump = dbs.fresh("release")
    dbs.install_release(release_dump, start)
    live = make_live_state(dbs, name)
    sqitch("deploy", f"db:pg:{name}")
    head = schema_dump(name)
    assert head == dbs.head_dump()
    # The target named for the revert's first step (pgfence.check_revert, docs/upgrading.md).
    sqitch("revert", "-y", "--to", f"@v{start}", "--set", f"pgfence_revert_to={start}",
           f"db:pg:{name}")
    assert dbs.version(name) == start
    assert schema_dump(name) == schema_dump(release_dump)
    sqitch("deploy", f"db:pg:{name}")
    assert schema_dump(name) == head
    check_live_state(dbs, name, live)


@pytest.mark.parametrize("start", OLDER)
def test_negative_control_an_upgrade_missing_a_change_is_caught(dbs: Databases, start: str,
                                                                tmp_path: Path) -> None:
    step = chain(start)[0]
    sections = re.split(r"(?m)^(?=-- change: )", step.read_text())
    # Leave out one change that is neither the lockdown step nor health, nor the release's own
    # change or the one its record needs (release_X, releases), nor the version unless it is
    # the only other one: the last such,
    # so that nothing after it in the file needs it and the broken file still applies.
    changes = [i for i, s in enumerate(sections) if s.startswith("-- change: ")
               and not s.startswith(("-- change: lockdown\n", "-- change: health\n",
                                     "-- change: release"))]
    if not changes:
        pytest.skip(f"the upgrade from {start} holds only its release's own change")
    victim = max((i for i in changes if not sections[i].startswith("-- change: version\n")),
                 default=changes[-1])
    broken = tmp_path / step.name
    broken.write_text("".join(s for i, s in enumerate(sections) if i != victim))
    name = dbs.fresh("broken")
    dbs.install_release(name, start)
    dbs.psql(name, "--single-transaction", "-f", str(broken))
    try:
        for later in chain(start)[1:]:
            dbs.psql(name, "--single-transaction", "-f", str(later))
    except ClusterError as e:
        # The next upgrade file's own check found the schema is not the release it starts from
        # (check_release, from LEGACY on: not as released, by the release's fingerprint).
        assert any(said in str(e) for said in ("differs from release",
                                               "but the database has pgfence", "as released"))
        return
    assert schema_dump(name) != dbs.head_dump()


# --- refusals: nothing changes ------------------------------------------------------------------

def refused(database: str, path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", *flags, "-d", database,
                           "-f", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("start", OLDER)
def test_upgrade_refuses_another_version(dbs: Databases, start: str) -> None:
    name = dbs.fresh("wrongver")
    install.core(dbs.cluster, name)  # already the head
    before = schema_dump(name)
    out = refused(name, chain(start)[0], "--single-transaction")
    said = (f"but the database has pgfence {HEAD}" if legacy(start)  # the file's own check
            else f"from release {start}, but the database holds {HEAD}")  # check_release's
    assert out.returncode != 0 and said in out.stderr, out.stderr
    assert schema_dump(name) == before


@pytest.mark.parametrize("start", OLDER)
def test_upgrade_refuses_a_schema_changed_by_hand(dbs: Databases, start: str) -> None:
    name = dbs.fresh("handmade")
    dbs.install_release(name, start)
    dbs.psql(name, "-c", "create or replace function pgfence.check_name(arg text, value text) "
                     "returns void language plpgsql as $$ begin end $$")
    before = schema_dump(name)
    out = refused(name, chain(start)[0], "--single-transaction")
    said = ("differs from release" if legacy(start)
            else f"differs from its release {start} as installed")
    assert out.returncode != 0 and said in out.stderr, out.stderr
    assert schema_dump(name) == before
    assert dbs.version(name) == start


def test_upgrade_refuses_a_database_without_pgfence(dbs: Databases) -> None:
    if not OLDER:
        pytest.skip("no upgrade file yet")
    name = dbs.fresh("empty")
    out = refused(name, chain(OLDER[0])[0], "--single-transaction")
    assert out.returncode != 0 and "no pgfence" in out.stderr, out.stderr


@pytest.mark.parametrize("on_error_stop", [True, False])
def test_install_outside_a_transaction_changes_nothing(dbs: Databases,
                                                       on_error_stop: bool) -> None:
    name = dbs.fresh("notx")
    flags = ["-v", f"ON_ERROR_STOP={int(on_error_stop)}"]
    out = subprocess.run(["psql", "-X", "-q", *flags, "-d", name,
                          "-f", str(ROOT / "sql/pgfence.sql")], capture_output=True, text=True)
    assert "must run inside one transaction" in out.stderr, out.stderr
    if on_error_stop:
        assert out.returncode != 0
    # Without ON_ERROR_STOP psql goes on, but the session is read-only: nothing is created.
    left = dbs.psql(name, "-At", "-c",
                    "select count(*) from pg_namespace where nspname = 'pgfence'")
    assert left.strip() == "0"


def test_negative_control_without_the_guard_psql_installs_unhardened(dbs: Databases,
                                                                    tmp_path: Path) -> None:
    text = (ROOT / "sql/pgfence.sql").read_text()
    unguarded = tmp_path / "unguarded.sql"
    # The guard's test made always false: the script runs statement by statement, unhardened.
    unguarded.write_text(text.replace("operator(pg_catalog.<>) 'on' then", "is null then"))
    name = dbs.fresh("unguarded")
    out = refused(name, unguarded)
    assert out.returncode == 0, out.stderr
    assert "SET LOCAL can only be used in transaction blocks" in out.stderr


# --- released history is read-only --------------------------------------------------------------

def copy_repo(tmp_path: Path) -> Path:
    copy = tmp_path / "repo"
    for item in ["scripts/bundle", "src", "testkit", "migrations", "layers", "sql", "sqitch.plan",
                 "sqitch.conf"]:
        src, dst = ROOT / item, copy / item
        dst.parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
    return copy


def released_script(change: str) -> bool:
    """Whether deploy/<change>.sql is the file a release was built from (not reworked since)."""
    plan = (ROOT / "sqitch.plan").read_text()
    names = re.findall(r"^([a-z_]+) ", plan, flags=re.M)
    last_tag = max(i for i, line in enumerate(plan.splitlines()) if line.startswith("@"))
    after = re.findall(r"^([a-z_]+) ", "\n".join(plan.splitlines()[last_tag:]), flags=re.M)
    return change in names and change not in after


def test_editing_a_released_deploy_script_is_refused(tmp_path: Path) -> None:
    # (enqueue: released in 0.1.0 and never reworked since.)
    assert released_script("enqueue")
    copy = copy_repo(tmp_path)
    script = copy / "migrations/deploy/enqueue.sql"
    script.write_text(script.read_text() + "\n-- edited\n")
    out = subprocess.run([copy / "scripts/bundle", "--check"], capture_output=True, text=True)
    assert out.returncode == 1
    assert f"sql/releases/pgfence--{released()[-1]}.sql is out of date" in out.stderr, out.stderr


@pytest.mark.parametrize("layer", released_layers(released()[-1]))
def test_editing_a_released_layer_script_is_refused(tmp_path: Path, layer: str) -> None:
    copy = copy_repo(tmp_path)
    plan = (copy / "layers" / layer / "sqitch.plan").read_text()
    assert f"@v{released()[-1]} " in plan, f"layers/{layer} has no tag @v{released()[-1]}"
    first = re.findall(r"^([a-z_]+) ", plan, flags=re.M)[1]
    script = copy / "layers" / layer / "deploy" / f"{first}.sql"
    script.write_text(script.read_text() + "\n-- edited\n")
    out = subprocess.run([copy / "scripts/bundle", "--check"], capture_output=True, text=True)
    assert out.returncode == 1
    assert f"sql/releases/pgfence-{layer}--{released()[-1]}.sql is out of date" in out.stderr, (
        out.stderr)


def test_negative_control_a_reworked_script_changes_only_the_head(tmp_path: Path) -> None:
    # A change after the newest release, made as docs/development.md says (sqitch rework of a
    # released change; the next release's own change, release_X, kept last; the first change
    # after the tag guards the release), in a copy: the released files stay as they are, only
    # the head's files change.
    copy = copy_repo(tmp_path)
    env = {**os.environ, **SQITCH_ENV}
    plan = copy / "sqitch.plan"
    at_release = plan.read_text().rstrip().splitlines()[-1].startswith("@")
    major, minor, _ = (int(p) for p in released()[-1].split("."))
    head = f"{major}.{minor + 1}.0" if at_release else HEAD
    subprocess.run(["sqitch", "rework", "enqueue", "-n", "rework enqueue"], cwd=copy,
                   check=True, capture_output=True, env=env)
    script = copy / "migrations/deploy/enqueue.sql"
    # It may be the first change after the tag (else the guard holds there too: the head is
    # sealed only by its release's change, last).
    guard = (f"do $$ begin perform pgfence.expect_release('pgfence', '{released()[-1]}'); "
             "end $$;\n")
    script.write_text(script.read_text().replace("begin;\n", "begin;\n" + guard, 1)
                      + "\n-- edited\n")
    lines = plan.read_text().splitlines(keepends=True)
    if at_release:
        subprocess.run(["sqitch", "add", f"release_{head}", "-n", f"Release {head}"], cwd=copy,
                       check=True, capture_output=True, env=env)
        (copy / f"migrations/deploy/release_{head}.sql").write_text(
            f"begin;\ndo $$ begin perform pgfence.seal('pgfence', '{head}'); end $$;\ncommit;\n")
    else:  # the head's release change stays last
        last = next(ln for ln in lines if ln.startswith(f"release_{HEAD} "))
        lines.remove(last)
        plan.write_text("".join(lines) + last)
    out = subprocess.run([copy / "scripts/bundle", "--check"], capture_output=True, text=True)
    assert out.returncode == 1
    assert "sql/pgfence.sql is out of date" in out.stderr, out.stderr
    assert f"sql/upgrades/pgfence--{released()[-1]}--{head}.sql" in out.stderr, out.stderr
    assert "sql/releases/" not in out.stderr, out.stderr
