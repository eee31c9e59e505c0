"""What a layer tells the layer conformance suite (tests/test_layer_conformance.py): a driver.

River's one driver test suite, which every database driver runs, is the model: the suite is
generic, and each layer supplies a small driver, ``layers/NAME/conformance.py`` with a
``DRIVER``, that knows how to make a lease hold work in flight in that layer and how to finish
it. A new layer gets every check of the suite by existing (testkit.layers finds it).
"""

from __future__ import annotations

import importlib.util
import uuid
from dataclasses import dataclass
from typing import Protocol

from testkit import layers
from testkit.harness import Database, Session
from testkit.layers import Layer


@dataclass(frozen=True)
class Call:
    """A function of the layer that a worker calls. ``sql`` names the lease, the attempt and
    the resource as ``{lease}``, ``{attempt}`` and ``{resource}``; where it names an attempt,
    the suite starts one (committed) first. ``locks``: it locks rows other sessions need, so it
    must bound its transaction's idle time as the core's functions do; ``unbounded``: why it
    does not yet (an xfail, strict: it fails the suite once the layer is fixed)."""

    signature: str      # as pg_catalog.regprocedure prints it
    sql: str
    locks: bool
    unbounded: str = ""
    ended: bool = False  # a call of a worker that stopped: the suite releases the lease first


class Driver(Protocol):
    calls: tuple[Call, ...]        # every function of the layer pgfence_worker may execute
    capabilities: str              # SQL: every capability (attempt id) the layer's tables hold
    grant_checks: tuple[str, ...]  # mutants of the catalogue that break its check of the
    #                                third party's grants: the grants scenario fails under each

    def prepare(self, db: Database, resource: str) -> None:
        """The third party's objects the work needs (a queue, a flow) and the resource."""

    def start(self, s: Session, lease_id: uuid.UUID) -> uuid.UUID:
        """One piece of work in flight under the lease (committed): its attempt id."""

    def finish(self, s: Session, attempt_id: uuid.UUID) -> str:
        """The attempt's result: accepted, duplicate or stale."""

    def supersede(self, db: Database, attempt_id: uuid.UUID) -> None:
        """Whatever makes the attempt's result stale from now on (a newer attempt took the
        work over); the suite has ended the attempt's lease first."""

    def grant(self, db: Database, role: str) -> None:
        """What the third party itself needs from ``role`` to start and finish the work."""

    def withhold(self, db: Database, role: str) -> None:
        """One privilege the third party needs to finish the work, revoked from ``role``."""


def driver(layer: Layer) -> Driver:
    """The layer's driver: ``DRIVER`` of layers/NAME/conformance.py."""
    path = layer.dir / "conformance.py"
    spec = importlib.util.spec_from_file_location(f"pgfence_layer_{layer.name}_conformance", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: no conformance driver")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found: Driver = module.DRIVER
    return found


def live_work(db: Database, lease_id: uuid.UUID) -> dict[str, uuid.UUID]:
    """Work in flight under the lease in every layer (each prepared first by its driver): the
    attempt id of each, by layer. For tests that carry live state through something (an
    upgrade, a backup) and finish it after (``finish_live_work``)."""
    s = db.session(f"live-work-{uuid.uuid4().hex[:8]}")
    work = {}
    for layer in layers.discover():
        found = driver(layer)
        found.prepare(db, f"live-{layer.name}")
        work[layer.name] = found.start(s, lease_id)
    return work


def finish_live_work(db: Database, lease_id: uuid.UUID, work: dict[str, uuid.UUID]) -> None:
    """Work started before, finished now: each late result is accepted (a retry is a
    duplicate), and new work goes on under the same lease."""
    s = db.session(f"finish-work-{uuid.uuid4().hex[:8]}")
    for name, attempt in work.items():
        found = driver(layers.layer(name))
        assert found.finish(s, attempt) == "accepted", name
        assert found.finish(s, attempt) == "duplicate", name
        assert found.finish(s, found.start(s, lease_id)) == "accepted", name
