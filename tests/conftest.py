"""Fixtures: one cluster per run, one template database, a fresh clone of it per test.

scripts/test starts the cluster and exports its settings (PGHOST, PGPORT, ...). Run alone,
pytest starts a cluster of its own (testkit.cluster) and removes it at the end; with
pytest-xdist (``-n N``) the controller starts it and its workers share it. Templates (and the
wheel of tests/test_wheel.py) are built once per run, by the first worker to need them
(tests.support.once_per_run). What test files share beside fixtures is in tests/support.py.

VERSIONS below is the one place that says which test modules depend on the server's version.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

import pytest

from testkit import install, permutations
from testkit.cluster import Cluster, ClusterError, PgBouncer
from testkit.harness import Database
from tests.pgflow14 import CRON_DATABASE, cron_cluster, install_pgflow14
from tests.support import DENO, ROOT, once_per_run, xdist_worker

# The Supabase CLI (npm supabase 3.1.0) is a Bun executable. JavaScriptCore's optimizing JIT
# tiers (DFG, FTL) spend CPU compiling code that one short command never runs again: with them
# off, a call costs 0.87 s of CPU instead of 1.45 s, and test_cli's Supabase cases 29 % less
# (docs/development.md). The CLI and what it does are the same; only how its JavaScript runs.
os.environ.setdefault("BUN_JSC_useDFGJIT", "0")
os.environ.setdefault("BUN_JSC_useFTLJIT", "0")

# -- which modules depend on the server's version -------------------------------------------
# A matrix run (scripts/test --pg all) runs a module marked ONCE on its first version only
# (pytest --once=skip on the others). A module not listed runs on every version: a new module
# is per version until someone writes down here why it need not be.
ONCE, PER_VERSION = "once", "per version"
VERSIONS: dict[str, tuple[str, str]] = {
    # what tests pgfence's SQL on the server: per version
    "test_backup.py": (PER_VERSION, "pg_dump and pg_restore of this server, with live state"),
    "test_complete_many.py": (PER_VERSION, "row locks and deadlock detection of the server"),
    "test_drift_and_revert.py": (PER_VERSION, "the fingerprint reads the server's catalogs; "
                                              "the revert scripts move live state here"),
    "test_failover.py": (PER_VERSION, "streaming replication, promotion, sequences after it"),
    "test_frozen_owner.py": (PER_VERSION, "idle_in_transaction_session_timeout ends a session"),
    "test_hmac.py": (PER_VERSION, "pgcrypto's hmac and digest on this server"),
    "test_install.py": (PER_VERSION, "Sqitch and the bundle install, revert, reinstall here"),
    "test_isolation.py": (PER_VERSION, "REPEATABLE READ / SERIALIZABLE row-lock semantics"),
    "test_labels.py": (PER_VERSION, "the server's regex classes and Unicode tables"),
    "test_names.py": (PER_VERSION, "the server's regex engine against Python's"),
    "test_ownership.py": (PER_VERSION, "I1-I4, I7 under interleavings: locks, snapshots"),
    "test_permutations.py": (PER_VERSION, "every interleaving: lock waits and MVCC are the "
                                          "server's (exhaustive on every version)"),
    "test_pgflow.py": (PER_VERSION, "the pgflow layer's SQL on the server"),
    "test_pgflow_requeue.py": (PER_VERSION, "the pgflow layer's stalled-task rule on the server "
                                            "(property-based)"),
    "test_pgmq.py": (PER_VERSION, "the pgmq layer's SQL on the server"),
    "test_stale_results.py": (PER_VERSION, "I5 checks in SQL"),
    "test_supabase_install.py": (PER_VERSION, "roles and default privileges (CREATEROLE "
                                              "changed in 16)"),
    "test_supabase_rpc.py": (PER_VERSION, "set local role and request settings in SQL"),
    "test_updates.py": (PER_VERSION, "update windows under interleavings"),
    "test_upgrade.py": (PER_VERSION, "every release upgraded to head on this server"),
    "test_layer_conformance.py": (PER_VERSION, "every layer's SQL on the server: installs, "
                                               "grants, idle bounds, windows, upgrades with "
                                               "live state and Sqitch's revert"),
    "test_wedge.py": (PER_VERSION, "lock_timeout, SKIP LOCKED / NOWAIT of the server"),
    "test_work_boundary.py": (PER_VERSION, "claim and completion under interleavings"),
    # what tests something else than the server: once
    "campaign/test_campaign.py": (ONCE, "the clients and PgBouncer under faults; the SQL "
                                        "rules it relies on are tested per version above"),
    "test_apidoc.py": (ONCE, "pdoc and deno doc read the clients' source; no server"),
    "test_bench.py": (ONCE, "the benchmark driver's plumbing; no number is asserted"),
    "test_cli.py": (ONCE, "the CLI and its transports (psycopg, PgBouncer, Supabase CLI); "
                          "the SQL they send is tested per version above"),
    "test_cli_deploy.py": (ONCE, "the CLI in deploy scripts (--wait, --json, the operator "
                                 "verbs) over both transports; the SQL it calls is per version "
                                 "above"),
    "test_cli_install.py": (ONCE, "the CLI runs the SQL files; test_install and test_upgrade "
                                  "run the same files on every version"),
    "test_client.py": (ONCE, "the Python client's loop and deadlines; its SQL is tested per "
                             "version above"),
    "test_client_batches.py": (ONCE, "the client's batch rule; time is the test's clock"),
    "test_client_context.py": (ONCE, "the handler's context in the client"),
    "test_client_faults.py": (ONCE, "the client's answer to a killed connection: a terminated "
                                    "backend rolls back alike on every version"),
    "test_client_rules.py": (ONCE, "pgfence._core alone; no database"),
    "test_control_plane.py": (ONCE, "an example's processes; acquire/fence are per version "
                                    "in test_ownership"),
    "test_demo.py": (ONCE, "the demo's narration; its SQL is the tested functions"),
    "test_major_upgrade.py": (ONCE, "pg_upgrade from 15 to 16, 17 and 18, in clusters of "
                                    "its own of each version"),
    "test_errors.py": (ONCE, "the clients' error classes against docs/errors.md; a raised "
                             "SQLSTATE is the same on every version"),
    "test_doctor.py": (ONCE, "the doctor command over its transports; health()'s checks are "
                             "per version in test_health"),
    "test_deno_client.py": (ONCE, "deno fmt/lint/check and the Deno client's own tests; "
                                  "the wire protocol is the same on every version"),
    "test_deno_faults.py": (ONCE, "the Deno client's retries under faults, as for Python's"),
    "test_deno_pgflow.py": (ONCE, "the Deno pgflow worker; the layer's SQL is per version in "
                                  "test_pgflow"),
    "test_docs.py": (ONCE, "the docs' examples run as written; what they call is tested per "
                           "version above"),
    "test_lint.py": (ONCE, "pgspot and squawk read the SQL text; no server"),
    "test_mutation.py": (ONCE, "tests the tests (scripts/mutate), not the server"),
    "test_suite_plan.py": (ONCE, "reads this table, the test files and the docs"),
    "test_client_pgmq.py": (ONCE, "the pgmq consumer's loop in the clients; the layer's SQL is "
                                  "per version in test_pgmq and test_layer_conformance"),
    "test_deno_pgmq.py": (ONCE, "the Deno pgmq consumer; the layer's SQL is per version in "
                                "test_pgmq and test_layer_conformance"),
    "test_quickstart.py": (ONCE, "the README's commands (pip, pgfence init, Supabase CLI, Deno); "
                                 "the SQL they apply is per version in test_install"),
    "test_meetings.py": (ONCE, "testkit.permutations' choice of interleavings; no server"),
    "test_init.py": (ONCE, "pgfence init writes files; no server"),
    "test_install_paths.py": (ONCE, "which install path may follow which: the CLI's refusals, "
                                    "Sqitch's registry, the plan; each path's SQL runs on every "
                                    "version in test_install, test_upgrade and pgTAP's Sqitch "
                                    "install"),
    "test_cli_output.py": (ONCE, "how the CLI prints what the database returns"),
    "test_packaging.py": (ONCE, "scripts/build and the Deno package metadata; no server"),
    "test_version.py": (ONCE, "the files that name the release; no server"),
    "test_pgflow14.py": (ONCE, "pgflow 0.14.1 needs pg_cron, which only PostgreSQL 15 (Debian's) "
                               "has here"),
    "test_wheel.py": (ONCE, "pip wheel and a venv; `pgfence install` of the same bundle is "
                            "per version in test_install"),
}


@pytest.fixture(scope="session")
def versions_table() -> dict[str, tuple[str, str]]:
    """VERSIONS, for tests/test_suite_plan.py (test files import nothing from here)."""
    return VERSIONS


def module_key(config: pytest.Config, path: Path) -> str:
    """A test file's name in the tables below: its path inside tests/."""
    with suppress(ValueError):
        return path.relative_to(config.rootpath / "tests").as_posix()
    return ""


def version_dependence(config: pytest.Config, path: Path) -> str:
    """ONCE or PER_VERSION for a test file (PER_VERSION when VERSIONS does not list it)."""
    return VERSIONS.get(module_key(config, path), (PER_VERSION, ""))[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--interleavings", choices=("all", "meetings"), default="all",
                     help="testkit.permutations: run every interleaving (default), or those "
                          "that cover every meeting of a step with another session (a matrix "
                          "run's later versions)")
    parser.addoption("--once", choices=("run", "skip", "only"), default="run",
                     help="the modules that VERSIONS (tests/conftest.py) marks once: run them "
                          "(default), leave them out (a matrix run's later versions), or run "
                          "only them")


# -- what pytest-xdist's workers must not run at once ----------------------------------------
# Tests that change what the whole cluster shares run in one xdist group (--dist loadgroup
# sends a group to one worker, in order): by module, or by a fixture they take.
GROUPS: dict[str, tuple[str, str]] = {
    "test_supabase_install.py": ("roles", "creates Supabase's roles by fixed names"),
    "test_supabase_rpc.py": ("roles", "creates service_role"),
    "test_quickstart.py": ("roles", "grants and revokes pgfence's roles to service_role, which "
                                    "every database of the cluster shares"),
    "test_health.py": ("roles", "its \"roles confined\" check reads every login role of the "
                                "cluster, which its own case and the Supabase tests create"),
    "test_doctor.py": ("roles", "prints test_health's checks, \"roles confined\" among them"),
    "reads_cluster_roles": ("roles", "its doctor judges \"roles confined\", as test_doctor's"),
    "bare_role": ("roles", "a login role of the cluster's, which \"roles confined\" of the "
                           "cases above would count while it lives"),
    "test_idle_bound.py": ("idle", "its cases wait for the idle bound together: one batch"),
    "cron_ran": ("cron", "pg_cron runs jobs on the minute: the module's jobs share one wait"),
    "password_role": ("hba", "rewrites pg_hba.conf and reloads the server"),
    "campaign/test_campaign.py": ("campaign", "one campaign cluster, not one per worker: its "
                                              "progress is judged in real time"),
}


@pytest.fixture
def reads_cluster_roles() -> None:
    """Nothing but a group: a case that takes it runs with the roles group (see GROUPS)."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for key in (module_key(config, item.path), *getattr(item, "fixturenames", ())):
            if key in GROUPS:
                item.add_marker(pytest.mark.xdist_group(GROUPS[key][0]))
    once = config.getoption("once")
    if once == "run":
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        once_only = version_dependence(config, item.path) == ONCE
        (keep if once_only == (once == "only") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


# -- one cluster for the run, shared by pytest-xdist's workers -------------------------------
_OWN: list[Cluster] = []


def pytest_configure(config: pytest.Config) -> None:
    """An xdist controller without a cluster (pytest -n N alone) starts one for its workers,
    which inherit its exports."""
    permutations.COVER = config.getoption("interleavings")
    if (getattr(config.option, "numprocesses", None) and not xdist_worker(config)
            and not os.environ.get("PGFENCE_CLUSTER")):
        c = Cluster.start(["fsync=off"])
        _OWN.append(c)
        os.environ.update(c.env())
        # pgfence's roles are the cluster's: made now, before workers install pgfence at once
        # and race to create them (scripts/test's pgTAP run makes them first the same way).
        c.create_database("pgfence_roles")
        install.core(c, "pgfence_roles")
        c.drop_database("pgfence_roles")


def pytest_unconfigure(config: pytest.Config) -> None:
    while _OWN:
        _OWN.pop().remove()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The xdist controller drops the templates its workers shared (each worker leaves them:
    another may still clone one)."""
    config = session.config
    if xdist_worker(config) or not getattr(config.option, "numprocesses", None):
        return
    # The factory whose basetemp holds the workers' (as xdist itself reads it).
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    shared = factory.getbasetemp() / "once"
    names = [p.read_text() for p in shared.glob("template-*.done")]
    if names and os.environ.get("PGFENCE_CLUSTER"):
        c = Cluster.from_env()
        for name in names:
            with suppress(ClusterError, OSError):
                c.drop_database(name)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The run's cluster; its exports and binaries are in os.environ while the run lasts."""
    saved = dict(os.environ)
    own = not os.environ.get("PGFENCE_CLUSTER")
    c = Cluster.start(["fsync=off"]) if own else Cluster.from_env()
    os.environ.clear()
    os.environ.update(c.env(saved))
    try:
        yield c
    finally:
        if own:
            c.remove()
        os.environ.clear()
        os.environ.update(saved)


def make_template(cluster: Cluster, layers: tuple[str, ...]) -> str:
    """pgfence, the layers (with those they need and what they stand on) and the tests'
    helpers, by testkit.install's one recipe."""
    # Named per run: two runs on one cluster (PGFENCE_CLUSTER) must not drop each other's.
    name = f"pgfence_template_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name)
    try:
        install.install(cluster, name, layers, with_helpers=True)
    except BaseException:
        cluster.drop_database(name)
        raise
    return name


@pytest.fixture(scope="session")
def templates(pytestconfig: pytest.Config, cluster: Cluster) -> Iterator[Callable[..., str]]:
    """``templates(*layers)``: the template database with those layers, built once per run
    (tests.support.once_per_run) by the first worker to ask. Without xdist this process drops
    them at the end; with xdist the controller does, after every worker is done."""
    made: set[str] = set()

    def template(*layers: str) -> str:
        key = "-".join(layers) or "core"
        name = once_per_run(pytestconfig, f"template-{key}",
                            lambda _: make_template(cluster, layers))
        made.add(name)
        return name

    yield template
    if not xdist_worker(pytestconfig):
        for name in made:
            cluster.drop_database(name)


@pytest.fixture(scope="session")
def template(templates: Callable[..., str]) -> str:
    return templates()


@pytest.fixture(scope="session")
def mq_template(templates: Callable[..., str]) -> str:
    """pgmq (the extension), pgfence and its pgmq layer."""
    return templates("pgmq")


@pytest.fixture(scope="session")
def flow_template(templates: Callable[..., str]) -> str:
    """pgmq, pgflow (its migrations from npm, with the test-only realtime.send stand-in),
    pgfence, its pgmq layer and its pgflow layer."""
    return templates("pgflow")


@pytest.fixture(scope="session")
def sqitch_template(pytestconfig: pytest.Config, cluster: Cluster
                    ) -> Iterator[Callable[[str], str]]:
    """A template that `sqitch deploy --to TO` made ('' for the plan's head), once per run and
    per TO, for the tests whose subject comes after that deploy: a clone carries Sqitch's
    registry with it (the sqitch schema is in the database). A deploy costs seconds; a clone
    a tenth of one."""
    made: set[str] = set()

    def build(to: str) -> str:
        name = f"pgfence_template_{uuid.uuid4().hex[:12]}"
        cluster.create_database(name)
        try:
            install.sqitch("deploy", *(["--to", to] if to else []), f"db:pg:{name}")
        except BaseException:
            cluster.drop_database(name)
            raise
        return name

    def template(to: str) -> str:
        key = to.removeprefix("@") or "head"
        name = once_per_run(pytestconfig, f"template-sqitch-{key}", lambda _: build(to))
        made.add(name)
        return name

    yield template
    if not xdist_worker(pytestconfig):
        for name in made:
            cluster.drop_database(name)


@pytest.fixture(scope="session")
def deno_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """For Deno processes: a clean environment (no PG* settings or secrets of ours) and a
    DENO_DIR of this run, so nothing comes from an earlier run's cache."""
    if not os.access(DENO, os.X_OK):
        pytest.fail(f"{DENO} is missing: run scripts/setup")
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(ROOT),
            "DENO_DIR": str(tmp_path_factory.mktemp("deno-dir")), "NO_COLOR": "1",
            "DENO_NO_UPDATE_CHECK": "1"}


@pytest.fixture(scope="session")
def bouncer(cluster: Cluster) -> Iterator[PgBouncer]:
    """PgBouncer in transaction pooling mode in front of the cluster (see PgBouncer)."""
    b = cluster.pgbouncer()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def pgbouncer(bouncer: PgBouncer) -> int:
    """Its port, for tests that build their own URLs."""
    return bouncer.port


@contextmanager
def clone(cluster: Cluster, template: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    cluster.create_database(name, template)
    try:
        yield name
    finally:
        cluster.drop_database(name)


@contextmanager
def fresh(request: pytest.FixtureRequest, cluster: Cluster, template: str,
          how: str) -> Iterator[Database]:
    with clone(cluster, template) as name:
        if how == "direct":
            database = Database(cluster.dsn(name))
        else:
            bouncer: PgBouncer = request.getfixturevalue("bouncer")
            database = Database(bouncer.dsn(name), admin_dsn=cluster.dsn(name))
        try:
            yield database
        finally:
            database.close()


@pytest.fixture
def db(request: pytest.FixtureRequest, cluster: Cluster, template: str) -> Iterator[Database]:
    with fresh(request, cluster, template, "direct") as database:
        yield database


@pytest.fixture(params=["direct", "pgbouncer"])
def any_db(request: pytest.FixtureRequest, cluster: Cluster, template: str) -> Iterator[Database]:
    """A fresh database, reached directly or through PgBouncer in transaction pooling mode."""
    with fresh(request, cluster, template, request.param) as database:
        yield database


@pytest.fixture
def layered(request: pytest.FixtureRequest, cluster: Cluster,
            templates: Callable[..., str]) -> Iterator[Callable[..., Database]]:
    """``layered(name, how="direct")``: a fresh database with that layer (with the layers it
    needs and what they stand on), reached directly or through PgBouncer; for the layer
    conformance suite, which runs over every layer."""
    with ExitStack() as stack:
        def make(name: str, how: str = "direct") -> Database:
            return stack.enter_context(fresh(request, cluster, templates(name), how))
        yield make


@pytest.fixture
def mq(request: pytest.FixtureRequest, cluster: Cluster, mq_template: str) -> Iterator[Database]:
    """A fresh database with pgmq and pgfence's pgmq layer."""
    with fresh(request, cluster, mq_template, "direct") as database:
        yield database


@pytest.fixture(params=["direct", "pgbouncer"])
def any_mq(request: pytest.FixtureRequest, cluster: Cluster,
           mq_template: str) -> Iterator[Database]:
    """The same, reached directly or through PgBouncer in transaction pooling mode."""
    with fresh(request, cluster, mq_template, request.param) as database:
        yield database


# -- pgflow: every pgflow test on pgflow 0.8.1 (npm) and 0.14.1 (../shared/vendor) -----------
# pgflow 0.14.1 needs pg_cron (its ensure-workers and requeue jobs), which only PostgreSQL 15
# (Debian's postgresql-15-cron, preloaded) has here: its variants run on a cluster of their own
# with pg_cron (tests/pgflow14.py), one per pytest-xdist worker, where the version under test
# has pg_cron, i.e. on the matrix's first version (15); elsewhere, and where the vendor folder
# is absent, they skip, saying why. pg_cron's extension lives in one database of its cluster
# (cron.database_name), so each 0.14.1 test installs pgflow, pgfence and the layers afresh
# there instead of cloning a template.
PGFLOW_VERSIONS = ("0.8.1", "0.14.1")


@pytest.fixture(params=PGFLOW_VERSIONS)
def pgflow_version(request: pytest.FixtureRequest) -> str:
    """The pgflow a test's `flow` has: "0.8.1" (npm) or "0.14.1" (with pg_cron)."""
    return str(request.param)


@pytest.fixture(scope="session")
def cluster14() -> Iterator[Cluster]:
    """A cluster with pg_cron preloaded, for pgflow 0.14.1 (skips where it cannot be)."""
    with cron_cluster() as c:
        yield c


@pytest.fixture(scope="session")
def bouncer14(cluster14: Cluster) -> Iterator[PgBouncer]:
    b = cluster14.pgbouncer()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def flow_cluster(request: pytest.FixtureRequest, pgflow_version: str) -> Cluster:
    """The cluster that holds the test's `flow` database."""
    name = "cluster14" if pgflow_version == "0.14.1" else "cluster"
    found: Cluster = request.getfixturevalue(name)
    return found


@pytest.fixture
def flow_bouncer(request: pytest.FixtureRequest, pgflow_version: str) -> PgBouncer:
    """PgBouncer in front of flow_cluster."""
    name = "bouncer14" if pgflow_version == "0.14.1" else "bouncer"
    found: PgBouncer = request.getfixturevalue(name)
    return found


@contextmanager
def fresh_flow(request: pytest.FixtureRequest, how: str) -> Iterator[Database]:
    if request.getfixturevalue("pgflow_version") == "0.8.1":
        with fresh(request, request.getfixturevalue("cluster"),
                   request.getfixturevalue("flow_template"), how) as database:
            yield database
        return
    c: Cluster = request.getfixturevalue("cluster14")
    c.drop_database(CRON_DATABASE)
    c.create_database(CRON_DATABASE)
    install_pgflow14(c, CRON_DATABASE, request.getfixturevalue("tmp_path"))
    install.install(c, CRON_DATABASE, ["pgflow"], with_prerequisites=False, with_helpers=True)
    if how == "direct":
        database = Database(c.dsn(CRON_DATABASE))
    else:
        bouncer: PgBouncer = request.getfixturevalue("bouncer14")
        database = Database(bouncer.dsn(CRON_DATABASE), admin_dsn=c.dsn(CRON_DATABASE))
    try:
        # pgflow's cron jobs call the layer (setup_cron), paused: a test runs a job's command
        # itself when it means to, never the scheduler behind its back.
        database.sql("select pgfence_pgflow.setup_cron()")
        database.sql("update cron.job set active = false")
        yield database
    finally:
        database.close()
        c.drop_database(CRON_DATABASE)


@pytest.fixture
def flow(request: pytest.FixtureRequest, pgflow_version: str) -> Iterator[Database]:
    """A fresh database with pgflow (pgflow_version) and pgfence's pgmq and pgflow layers."""
    with fresh_flow(request, "direct") as database:
        yield database


@pytest.fixture(params=["direct", "pgbouncer"])
def any_flow(request: pytest.FixtureRequest, pgflow_version: str) -> Iterator[Database]:
    """The same, reached directly or through PgBouncer in transaction pooling mode."""
    with fresh_flow(request, request.param) as database:
        yield database
