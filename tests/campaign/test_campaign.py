"""The fault campaign in CI: one seeded schedule against the real package finds no violation,
and the same schedule against each negative control finds the violation it is about; the same
for the layers' fleet (Python PgmqWorkers, Deno FlowWorkers in Edge isolates, on pgflow 0.14.1
where it can be installed, else 0.8.1) and its controls.

The campaign restarts its server, so it runs on a cluster of its own (with its own PgBouncer),
not on the session's. See docs/campaign.md; scripts/campaign runs longer campaigns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from testkit.cluster import Cluster
from tests.pgflow14 import CRON_SETTINGS, missing

from .schedule import ALWAYS, LAYERS, Settings, layer_settings
from .supervisor import Campaign, Outcome
from .variants import CONTROLS, VARIANTS

SEED = "ci:1"
# A fault is applied at its moment (an owner armed to pause, a successor or a re-claim waited
# for), within bounds that a slow machine can outrun: the fault is then missed, or the pause
# ends before its moment came, and the run shows nothing. Such a run is not a verdict: the
# schedule runs again with the injector's waits this many times as long (Settings.patience).
# A violation in any run is one, and is never run again.
PATIENCE = (1.0, 4.0, 16.0)


def patiently(campaign: Campaign, name: str, done: Callable[[Outcome], bool]) -> Outcome:
    """The schedule against variant ``name``; again with more patience until ``done``."""
    for patience in PATIENCE:
        outcome = campaign.run(VARIANTS[name], SEED, patience)
        if done(outcome):
            break
        print(f"{name}, patience {patience:g}: faults applied {dict(outcome.applied)}, missed "
              f"{dict(outcome.missed)}, {len(outcome.violations)} violations: run again")
    return outcome


# The invariant each control breaks, and so must be caught breaking.
CAUGHT_BY = {"no-lock": "I2", "now": "I2", "no-attempt-check": "I5", "advisory": "I2",
             "pgflow-stale-complete": "I5", "pgmq-stale-archive": "I5",
             "pgflow-early-takeover": "I5"}
# A layer's control breaks its layer: the violations name its work (tests/campaign/database.py).
NAMES = {"pgflow-stale-complete": "run", "pgmq-stale-archive": "message",
         "pgflow-early-takeover": "run"}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Campaign]:
    with Cluster.start(["fsync=off"]) as cluster:
        # Progress is judged in real time: every task done within the bound after the last
        # fault. Here that is liveness, not speed: 15 s (scripts/campaign's default) failed
        # the real package on a 2-core machine under a load of 15, 90 s could too on a slower
        # one (issue 23), so the bound is ten minutes, which only a queue that stopped for
        # good (or a variant that stops it) runs out. The wait ends as soon as the queue is
        # empty, so a good run costs no more than before.
        yield Campaign(cluster, replace(Settings(), random_faults=2, progress_bound=600.0),
                       tmp_path_factory.mktemp("campaign-logs"))


def test_real_package_keeps_every_invariant(campaign: Campaign) -> None:
    outcome = patiently(campaign, "real",
                        lambda o: bool(o.violations) or set(ALWAYS) <= set(o.applied))
    assert [str(v) for v in outcome.violations] == [], f"logs in {campaign.logs}"
    assert outcome.figures["tasks"] >= Settings.initial_tasks
    assert outcome.figures["writes"] >= outcome.figures["tasks"]
    # The faults that expose the controls below were applied here too, and refused.
    assert {"pause-before-fence", "pause-in-fence", "pause-before-complete",
            "restart"} <= set(outcome.applied)


# `now` is left out here: the campaign catches it only when a resumed fence lands within
# milliseconds after the lease's expiry, which one short schedule on a loaded machine does not
# always produce (seen in CI). Its deterministic negative control is
# tests/test_ownership.py::test_negative_control_expiry_judged_on_now; `scripts/campaign
# --variant controls` still runs it.
CI_CONTROLS = tuple(name for name in CONTROLS if name != "now")


@pytest.mark.parametrize("name", CI_CONTROLS)
def test_negative_control_is_caught(campaign: Campaign, name: str) -> None:
    outcome = patiently(campaign, name, lambda o: o.by_invariant()[CAUGHT_BY[name]] > 0)
    assert outcome.by_invariant()[CAUGHT_BY[name]] > 0, (
        f"{name}: {VARIANTS[name].summary}: no {CAUGHT_BY[name]} violation found "
        f"(faults applied: {dict(outcome.applied)}, missed: {dict(outcome.missed)}; "
        f"logs in {campaign.logs})")


# -- the layers' fleet ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layer_campaign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Campaign]:
    """The layers' fleet on a cluster of its own: with pg_cron for pgflow 0.14.1 where it can
    be installed (tests/pgflow14.py), else on pgflow 0.8.1. Progress as above."""
    pgflow = "0.8.1" if missing() else "0.14.1"
    s = replace(layer_settings(), random_faults=2, progress_bound=600.0, pgflow=pgflow)
    with Cluster.start(["fsync=off", *(CRON_SETTINGS if pgflow == "0.14.1" else ())]) as cluster:
        yield Campaign(cluster, s, tmp_path_factory.mktemp("layer-campaign-logs"))


def applied_to_the_layers(o: Outcome) -> bool:
    """The pause between the fenced write and the result applied to each resource's owner, a
    kill and a pooler restart (a terminate may find no backend under a worker's name: a
    transaction pooler names its server connections by the client that used them last)."""
    return (o.applied["pause-before-complete"] == len(LAYERS)
            and {"kill", "pooler"} <= set(o.applied))


def test_the_layers_keep_every_invariant(layer_campaign: Campaign) -> None:
    """The faults applied (and the run a verdict only then); no violation."""
    outcome = patiently(layer_campaign, "real",
                        lambda o: bool(o.violations) or applied_to_the_layers(o))
    assert [str(v) for v in outcome.violations] == [], f"logs in {layer_campaign.logs}"
    assert applied_to_the_layers(outcome), (outcome.applied, outcome.missed)
    # Each enqueue is a message and a run of two steps.
    assert outcome.figures["tasks"] >= 3 * layer_settings().initial_tasks, outcome.figures
    assert outcome.figures["writes"] >= outcome.figures["tasks"], outcome.figures


# The third layer control, pgflow-early-takeover, is scripts/campaign's only (CI's time).
LAYER_CONTROLS = ("pgflow-stale-complete", "pgmq-stale-archive")


@pytest.mark.parametrize("name", LAYER_CONTROLS)
def test_negative_control_of_a_layer_is_caught(layer_campaign: Campaign, name: str) -> None:
    caught_by, names = CAUGHT_BY[name], NAMES[name]

    def caught(o: Outcome) -> bool:
        return any(v.invariant == caught_by and f"task {names} " in v.detail
                   for v in o.violations)

    outcome = patiently(layer_campaign, name, caught)
    assert caught(outcome), (
        f"{name}: {VARIANTS[name].summary}: no {caught_by} violation of a {names} found "
        f"(faults applied: {dict(outcome.applied)}, missed: {dict(outcome.missed)}; "
        f"logs in {layer_campaign.logs})")
