"""One recipe for a test database: pgfence, the chosen layers and what they stand on.

    install(cluster, "db", layers=["pgflow"], how="sqitch", helpers=True)

puts in, in this order: each chosen layer's prerequisites (and those of the layers it needs;
their manifests, testkit.layers, say how), pgfence itself, the layers in install order, and
the tests' helpers (schema pgfence_test, pgtap/helpers). ``how`` is "bundle" (the one-file
installs, as `psql --single-transaction -f` runs them) or "sqitch" (`sqitch deploy` of the
repository's plan, then of each layer's). scripts/test, scripts/mutate, the benchmarks and the
tests' templates all come here; the parts are here for the tests whose subject is one step.

    python -m testkit.install [--how bundle|sqitch] [--layers all|NAME,...] [--pgtap] DATABASE

runs it on the cluster of the environment (scripts/pg up's exports); --pgtap adds the pgTAP
extension and the helpers, for pg_prove.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from pgfence.releases import key
from testkit import layers
from testkit.cluster import Cluster, ClusterError

ROOT = layers.ROOT
BUNDLE = ROOT / "sql/pgfence.sql"
TEST_HELPERS = ROOT / "pgtap/helpers/pgfence_test.sql"
SQITCH_ENV = {"SQITCH_FULLNAME": "pgfence tests", "SQITCH_EMAIL": "tests@pgfence.invalid"}
HOW = ("bundle", "sqitch")


def sqitch(*args: str, layer: str = "",
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Sqitch on the repository's plan, or on a layer's (layers/LAYER), which must succeed."""
    return subprocess.run(["sqitch", *args], cwd=ROOT / "layers" / layer if layer else ROOT,
                          check=True, capture_output=True, text=True,
                          env={**(env if env is not None else os.environ), **SQITCH_ENV})


def prerequisites(cluster: Cluster, database: str, chosen: Iterable[str]) -> None:
    """What the chosen layers (and those they need) stand on, as their manifests install it."""
    for layer in layers.with_needs(chosen):
        for found in layer.prerequisites:
            prerequisite(cluster, database, found)


def prerequisite(cluster: Cluster, database: str, found: layers.Prerequisite) -> None:
    """One prerequisite of a layer, by the steps of its manifest."""
    for step in found.install:
        if step.sql:
            cluster.psql(database, "-c", step.sql)
        for path in step.paths() if step.files else ():
            cluster.psql(database, "--single-transaction", "-f", path)


def released(name: str, release: str) -> Path:
    """The one-file install of pgfence (name "pgfence") or of a layer ("pgfence-NAME") as
    release ``release`` shipped it: a layer unchanged in that release is its newest earlier one
    (sql/releases, scripts/bundle)."""
    found = {p.name.removeprefix(f"{name}--").removesuffix(".sql"): p
             for p in (ROOT / "sql/releases").glob(f"{name}--*.sql")}
    older = [v for v in found if key(v) <= key(release)]
    if not older or (name == "pgfence" and release not in found):
        raise ValueError(f"no release {release} of {name} in sql/releases")
    return found[max(older, key=key)]


def core(cluster: Cluster, database: str, how: str = "bundle",
         release: str | None = None) -> None:
    """pgfence itself: its one-file install (of ``release``, from sql/releases, if given), or
    `sqitch deploy` of the repository's plan."""
    if how == "bundle":
        file = BUNDLE if release is None else released("pgfence", release)
        cluster.psql(database, "--single-transaction", "-f", file)
    else:
        sqitch("deploy", f"db:pg:{database}", env=cluster.env())


def layer(cluster: Cluster, database: str, name: str, how: str = "bundle",
          release: str | None = None) -> None:
    """One layer (after what it needs): sql/pgfence-NAME.sql (or as pgfence ``release``
    shipped it), or `sqitch deploy` of its plan."""
    if how == "bundle":
        file = layers.layer(name).bundle if release is None else released(f"pgfence-{name}",
                                                                            release)
        cluster.psql(database, "--single-transaction", "-f", file)
    else:
        sqitch("deploy", f"db:pg:{database}", layer=name, env=cluster.env())


def helpers(cluster: Cluster, database: str, pgtap: bool = False) -> None:
    """Schema pgfence_test (pgtap/helpers): expire() and the other helpers of the tests; with
    ``pgtap``, the pgTAP extension first, for pg_prove."""
    if pgtap:
        cluster.psql(database, "-c", "create extension if not exists pgtap")
    cluster.psql(database, "-f", TEST_HELPERS)


def install(cluster: Cluster, database: str, chosen: Sequence[str] = (), how: str = "bundle",
            *, with_prerequisites: bool = True, with_helpers: bool = False,
            release: str | None = None) -> None:
    """The chosen layers' prerequisites, pgfence, the layers (with the layers they need), and,
    ``with_helpers``, the tests' helpers: the whole recipe (see the module's docstring); with
    ``release``, pgfence and the layers as that release shipped them (the one-file installs of
    sql/releases), for the benchmarks' comparisons."""
    if how not in HOW:
        raise ValueError(f"how: one of {', '.join(HOW)}, not {how!r}")
    if with_prerequisites:
        prerequisites(cluster, database, chosen)
    if release is not None and how != "bundle":
        raise ValueError("a release is installed from its one-file installs (how='bundle')")
    core(cluster, database, how, release)
    for found in layers.with_needs(chosen):
        layer(cluster, database, found.name, how, release)
    if with_helpers:
        helpers(cluster, database)


def files(chosen: Sequence[str] = ()) -> list[Path]:
    """The one-file installs the recipe runs, in order: pgfence's, then the layers'."""
    return [BUNDLE, *(found.bundle for found in layers.with_needs(chosen))]


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.install",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--how", choices=HOW, default="bundle")
    parser.add_argument("--layers", default="", help="all, or layer names separated by commas")
    parser.add_argument("--pgtap", action="store_true", help="and pgTAP with the tests' helpers")
    parser.add_argument("database")
    args = parser.parse_args(argv)
    chosen = [n for n in args.layers.split(",") if n]
    try:
        cluster = Cluster.from_env()
        install(cluster, args.database, chosen, args.how)
        if args.pgtap:
            helpers(cluster, args.database, pgtap=True)
    except (ClusterError, layers.LayerError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or ""
        print(f"testkit.install: {e}\n{detail}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
