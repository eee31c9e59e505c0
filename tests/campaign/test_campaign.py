"""The fault campaign in CI: one seeded schedule against the real package finds no violation,
and the same schedule against each negative control finds the violation it is about.

The campaign restarts its server, so it runs on a cluster of its own (with its own PgBouncer),
not on the session's. See docs/campaign.md; scripts/campaign runs longer campaigns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from testkit.cluster import Cluster

from .schedule import ALWAYS, Settings
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
CAUGHT_BY = {"no-lock": "I2", "now": "I2", "no-attempt-check": "I5", "advisory": "I2"}


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
