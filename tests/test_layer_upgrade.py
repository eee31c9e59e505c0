"""Layer upgrades: a database holding a release of pgfence and its pgmq and pgflow layers, with
live state in the core and in both layers (a message read, a pgflow task started, neither
finished), carried to the head by the one-file upgrades (pgfence's own, then each layer's
sql/upgrades/pgfence-LAYER--A--B.sql) and by Sqitch (pgfence's plan, then each layer's). The
result is a fresh install's schema; what was started before the upgrade finishes after it,
by the rules of the layers (a valid late result is kept); Sqitch reverts the layers to their
release and deploys them again. Also: each layer release's recorded fingerprint, and the
refusals of a layer upgrade file, each leaving the database as it was.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgfence.connection import connect
from testkit.cluster import Cluster, ClusterError
from tests.support import (
    bundle_query,
    install_bundle,
    install_pgflow,
    install_pgflow_layer,
    install_pgmq_layer,
    sqitch,
)
from tests.test_upgrade import (
    HEAD,
    RELEASES,
    UPGRADES,
    Databases,
    check_live_state,
    make_live_state,
    one,
    refused,
    schema_dump,
    version_key,
)

LAYERS = ("pgmq", "pgflow")


def layer_releases(layer: str) -> list[str]:
    found = [p.name.removeprefix(f"pgfence-{layer}--").removesuffix(".sql")
             for p in RELEASES.glob(f"pgfence-{layer}--*.sql")]
    return sorted(found, key=version_key)


def layer_chain(layer: str, start: str) -> list[Path]:
    """The layer's upgrade files from its release `start` towards the head, in order. A release
    in which the layer did not change has none: its schema is the next one's."""
    steps = {p.name.split("--")[1]: p for p in UPGRADES.glob(f"pgfence-{layer}--*--*.sql")}
    files, at = [], start
    while at in steps:
        files.append(steps[at])
        at = steps[at].name.removesuffix(".sql").split("--")[2]
    return files


def layer_fingerprint(dbs: Databases, database: str, layer: str) -> str:
    return dbs.psql(database, "-At", "-c",
                    bundle_query("fingerprint.sql", f"pgfence_{layer}")).strip()


def recorded(layer: str) -> dict[str, str]:
    path = RELEASES / f"fingerprints-{layer}"
    lines = path.read_text().splitlines() if path.is_file() else []
    return dict(line.split() for line in lines if line.strip() and not line.startswith("#"))


# Releases that carry the layers, older than the head: where a layer upgrade starts.
STARTS = [v for v in layer_releases("pgflow") if v != HEAD]
# Every layer upgrade file, by layer and the release it starts from.
FILES = [(p.name.split("--")[0].removeprefix("pgfence-"), p.name.split("--")[1])
         for p in sorted(UPGRADES.glob("pgfence-*--*--*.sql"))]


@pytest.fixture
def dbs(cluster: Cluster) -> Iterator[Databases]:
    made = Databases(cluster)
    yield made
    for name in made.made:
        cluster.drop_database(name)


def install_release_with_layers(dbs: Databases, database: str, release: str) -> None:
    """pgmq and pgflow, then pgfence `release` and its layers, from the release files, and
    the queue and the flow of the live state."""
    install_pgflow(dbs.cluster, database)
    dbs.install_release(database, release)
    for layer in LAYERS:
        dbs.psql(database, "--single-transaction", "-f",
                 RELEASES / f"pgfence-{layer}--{release}.sql")
    with connect(dbs.dsn(database), "release") as conn:
        queue_and_flow(conn)


def head_with_layers(dbs: Databases) -> str:
    """A fresh install of the head and its layers (after pgmq and pgflow), with the queue and
    the flow the live state makes, whose tables pgmq and pgflow create."""
    head = dbs.fresh("head")
    install_pgflow(dbs.cluster, head)
    install_bundle(dbs.cluster, head)
    install_pgmq_layer(dbs.cluster, head)
    install_pgflow_layer(dbs.cluster, head)
    with connect(dbs.dsn(head), "head") as conn:
        queue_and_flow(conn)
    return head


def queue_and_flow(conn: psycopg.Connection[tuple[object, ...]]) -> None:
    """pgmq queue `jobs`, pgflow flow `two` (first -> second)."""
    conn.execute("select pgmq.create('jobs')")
    conn.execute("select pgflow.create_flow('two')")
    conn.execute("select pgflow.add_step('two', 'first')")
    conn.execute("select pgflow.add_step('two', 'second', array['first'])")


# --- live state in the layers: made on the old release, finished after the upgrade -------------

@dataclass
class LayerLive:
    message: uuid.UUID      # a pgmq message read under the live lease, not archived yet
    task: uuid.UUID         # a pgflow task started under the live lease, not completed yet
    run: uuid.UUID          # its run, which has a second task (step `second`) still to come


def make_layer_state(dbs: Databases, database: str, lease: uuid.UUID) -> LayerLive:
    with connect(dbs.dsn(database), "live-layers") as conn:
        conn.execute("select pgmq.send('jobs', '{\"n\": 1}')")
        message = one(conn, "select attempt_id from pgfence_pgmq.read(%s, 'jobs', '1 hour')",
                      lease)
        run = one(conn, "select run_id from pgflow.start_flow('two', '{\"n\": 1}')")
        task = one(conn, "select attempt_id from pgfence_pgflow.start_tasks(%s, 'two', 'two', "
                         "'1 hour', 1)", lease)
    return LayerLive(message, task, run)  # type: ignore[arg-type]


def check_layer_state(dbs: Databases, database: str, lease: uuid.UUID, live: LayerLive) -> None:
    with connect(dbs.dsn(database), "after-layers") as conn:
        # Started before the upgrade, finished after it: the late results are kept.
        assert one(conn, "select pgfence_pgmq.archive(%s)", live.message) == "accepted"
        assert one(conn, "select pgfence_pgflow.complete_task(%s, '{\"a\": 1}')",
                   live.task) == "accepted"
        assert one(conn, "select pgfence_pgflow.complete_task(%s, '{\"a\": 1}')",
                   live.task) == "duplicate"
        # The run goes on under the same lease, by the upgraded start_tasks.
        second = conn.execute("select attempt_id, step_slug, input from pgfence_pgflow.start_tasks("
                              "%s, 'two', 'two', '1 hour', 1)", (lease,)).fetchone()
        assert second is not None and second[1] == "second"
        assert second[2] == {"run": {"n": 1}, "first": {"a": 1}}
        assert one(conn, "select pgfence_pgflow.complete_task(%s, '{}')", second[0]) == "accepted"
        assert one(conn, "select status from pgflow.runs where run_id = %s",
                   live.run) == "completed"


# --- the upgrade paths --------------------------------------------------------------------------

def test_every_layer_release_an_upgrade_starts_from_has_its_fingerprint(dbs: Databases) -> None:
    assert FILES or not STARTS, "a layer release older than the head, but no layer upgrade"
    for layer, start in FILES:
        name = dbs.fresh("lprint")
        install_release_with_layers(dbs, name, start)
        found = layer_fingerprint(dbs, name, layer)
        assert recorded(layer).get(start) == found, (
            f"record `{start} {found}` in sql/releases/fingerprints-{layer}")


@pytest.mark.parametrize("path", ["file", "sqitch"])
@pytest.mark.parametrize("start", STARTS)
def test_layer_upgrade_keeps_live_state_of_the_core_and_the_layers(dbs: Databases, start: str,
                                                                   path: str) -> None:
    name = dbs.fresh("lup")
    install_release_with_layers(dbs, name, start)
    live = make_live_state(dbs, name)
    layer_live = make_layer_state(dbs, name, live.current)
    if path == "file":
        dbs.upgrade_by_file(name, start, LAYERS)
    else:
        # One-file installs moved onto Sqitch (--log-only), then deployed to the head.
        sqitch("deploy", "--log-only", "--to", f"@v{start}", f"db:pg:{name}")
        sqitch("deploy", f"db:pg:{name}")
        for layer in LAYERS:
            sqitch("deploy", "--log-only", "--to", f"@v{start}", f"db:pg:{name}", layer=layer)
            sqitch("deploy", f"db:pg:{name}", layer=layer)
    assert dbs.version(name) == HEAD
    assert schema_dump(name) == schema_dump(head_with_layers(dbs))
    check_layer_state(dbs, name, live.current, layer_live)
    check_live_state(dbs, name, live)


@pytest.mark.parametrize("start", STARTS)
def test_sqitch_reverts_the_layers_to_their_release_and_deploys_again(dbs: Databases,
                                                                       start: str) -> None:
    name, release = dbs.fresh("lrev"), dbs.fresh("lrel")
    install_release_with_layers(dbs, release, start)
    install_pgflow(dbs.cluster, name)
    sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}")
    for layer in LAYERS:
        sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}", layer=layer)
    with connect(dbs.dsn(name), "release") as conn:
        queue_and_flow(conn)
    live = make_live_state(dbs, name)
    layer_live = make_layer_state(dbs, name, live.current)
    sqitch("deploy", f"db:pg:{name}")
    for layer in LAYERS:
        sqitch("deploy", f"db:pg:{name}", layer=layer)
    head = schema_dump(name)
    for layer in reversed(LAYERS):
        sqitch("revert", "-y", "--to", f"@v{start}", f"db:pg:{name}", layer=layer)
    # The target named for the revert's first step (pgfence.check_revert, docs/upgrading.md).
    sqitch("revert", "-y", "--to", f"@v{start}", "--set", f"pgfence_revert_to={start}",
           f"db:pg:{name}")
    assert schema_dump(name) == schema_dump(release)
    for layer in LAYERS:
        assert layer_fingerprint(dbs, name, layer) == layer_fingerprint(dbs, release, layer)
    sqitch("deploy", f"db:pg:{name}")
    for layer in LAYERS:
        sqitch("deploy", f"db:pg:{name}", layer=layer)
    assert schema_dump(name) == head
    check_layer_state(dbs, name, live.current, layer_live)


def target(step: Path) -> str:
    """The pgfence release a layer upgrade file leads to (it runs on that release)."""
    return step.name.removesuffix(".sql").split("--")[2]


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_negative_control_a_layer_upgrade_missing_a_change_is_caught(
        dbs: Databases, layer: str, start: str, tmp_path: Path) -> None:
    step = layer_chain(layer, start)[0]
    sections = re.split(r"(?m)^(?=-- change: )", step.read_text())
    # Leave out the first change that is not the section's last (its lockdown, or from 0.3.0
    # on the release's own change, which seals it).
    victims = [i for i, s in enumerate(sections) if s.startswith("-- change: ")
               and "lockdown" not in s.partition("\n")[0]
               and not s.startswith("-- change: release_")]
    if not victims:
        pytest.skip(f"{step.name} holds only the release's own change")
    broken = tmp_path / step.name
    broken.write_text("".join(s for i, s in enumerate(sections) if i != victims[0]))
    name = dbs.fresh("lbroken")
    install_release_with_layers(dbs, name, start)
    others = tuple(each for each in LAYERS if each != layer)
    dbs.upgrade_by_file(name, start, others, to=target(step))
    dbs.psql(name, "--single-transaction", "-f", broken)
    try:
        dbs.upgrade_by_file(name, target(step), LAYERS)
    except ClusterError as e:
        # The next layer upgrade file's own check found the layer is not the release it
        # starts from.
        assert f"the pgfence_{layer} schema differs from the {layer} layer" in str(e), e
        return
    assert schema_dump(name) != schema_dump(head_with_layers(dbs))


# --- refusals: nothing changes ------------------------------------------------------------------

def refusal(dbs: Databases, name: str, step: Path) -> str:
    before = schema_dump(name)
    out = refused(name, step, "--single-transaction")
    assert out.returncode != 0, out.stdout
    assert schema_dump(name) == before
    return out.stderr


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_layer_upgrade_refuses_before_pgfence_is_upgraded(dbs: Databases, layer: str,
                                                          start: str) -> None:
    name = dbs.fresh("lorder")
    install_release_with_layers(dbs, name, start)
    step = layer_chain(layer, start)[0]
    target = step.name.removesuffix(".sql").split("--")[2]
    err = refusal(dbs, name, step)
    assert f"which runs on pgfence {target}, but the database has pgfence {start}" in err, err


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_layer_upgrade_refuses_a_layer_changed_by_hand(dbs: Databases, layer: str,
                                                       start: str) -> None:
    name = dbs.fresh("lhand")
    install_release_with_layers(dbs, name, start)
    step = layer_chain(layer, start)[0]
    dbs.upgrade_by_file(name, start, to=target(step))
    dbs.psql(name, "-c", f"create function pgfence_{layer}.extra() returns int "
                         "language sql as 'select 1'")
    err = refusal(dbs, name, step)
    assert f"the pgfence_{layer} schema differs from the {layer} layer of release {start}" in err


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_layer_upgrade_refuses_a_database_without_the_layer(dbs: Databases, layer: str,
                                                            start: str) -> None:
    name = dbs.fresh("lnone")
    install_pgflow(dbs.cluster, name)
    install_bundle(dbs.cluster, name)
    err = refusal(dbs, name, layer_chain(layer, start)[0])
    assert f"no {layer} layer in this database" in err, err


@pytest.mark.parametrize(("layer", "start"), FILES)
def test_layer_upgrade_refuses_a_layer_that_sqitch_deploys(dbs: Databases, layer: str,
                                                           start: str) -> None:
    name = dbs.fresh("lsqitch")
    install_pgflow(dbs.cluster, name)
    sqitch("deploy", f"db:pg:{name}")
    for each in LAYERS:
        sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}", layer=each)
    err = refusal(dbs, name, layer_chain(layer, start)[0])
    assert f"Sqitch deploys the {layer} layer in this database" in err, err
    assert f"cd layers/{layer} && sqitch deploy db:pg:{name}" in err, err


def test_negative_control_pgfences_own_registry_does_not_stop_a_layer_upgrade(
        dbs: Databases) -> None:
    # The registry check asks about the layer's own Sqitch project: pgfence itself deployed by
    # Sqitch (its registry tracks project pgfence), the layers installed from their files, the
    # layer upgrade files apply.
    if not FILES:
        pytest.skip("no layer upgrade file yet")
    layer, start = FILES[0]
    name = dbs.fresh("lother")
    install_pgflow(dbs.cluster, name)
    sqitch("deploy", "--to", f"@v{start}", f"db:pg:{name}")
    for each in LAYERS:
        dbs.psql(name, "--single-transaction", "-f", RELEASES / f"pgfence-{each}--{start}.sql")
    with connect(dbs.dsn(name), "release") as conn:
        queue_and_flow(conn)
    step = layer_chain(layer, start)[0]
    sqitch("deploy", "--to", f"@v{target(step)}", f"db:pg:{name}")
    dbs.psql(name, "--single-transaction", "-f", step)
    if target(step) == HEAD:
        expected = head_with_layers(dbs)
    else:
        expected = dbs.fresh("lexpected")
        install_release_with_layers(dbs, expected, target(step))
    assert layer_fingerprint(dbs, name, layer) == layer_fingerprint(dbs, expected, layer)
