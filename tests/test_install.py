"""The two ways to install are one schema: Sqitch and the one-file bundle; and Sqitch goes
down to nothing and up again."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit import install
from testkit.cluster import Cluster
from testkit.install import sqitch
from tests.support import ROOT


def schema_dump(database: str, exclude: tuple[str, ...] = ()) -> str:
    """pg_dump of everything but Sqitch's registry (and `exclude`), without comments, blank
    lines and SETs."""
    skip = [f"--exclude-schema={s}" for s in ("sqitch", *exclude)]
    out = subprocess.run(["pg_dump", "--schema-only", "--no-owner", *skip, "-d", database],
                         check=True, capture_output=True, text=True).stdout
    lines = [line for line in out.splitlines()
             if line.strip() and not line.startswith(
                 ("--", "SET ", "SELECT pg_catalog.set_config", "\\restrict", "\\unrestrict"))]
    return "\n".join(lines)


@pytest.fixture
def fresh(cluster: Cluster) -> Iterator[Callable[..., str]]:
    """Makes databases (named after a tag), empty or clones of a template, and drops them
    after the test."""
    made: list[str] = []

    def make(tag: str, template: str | None = None) -> str:
        name = f"i_{tag}_{uuid.uuid4().hex[:8]}"
        cluster.create_database(name, template)
        made.append(name)
        return name

    yield make
    for name in made:
        cluster.drop_database(name)


def test_bundle_is_in_sync_with_the_plan() -> None:
    assert subprocess.run([ROOT / "scripts/bundle", "--check"]).returncode == 0


def test_negative_control_stale_bundle_is_detected(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    for item in ["scripts", "migrations", "layers", "sql", "sqitch.plan"]:
        src = ROOT / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, copy / item)
    with (copy / "sql/pgfence.sql").open("a") as f:
        f.write("-- edited by hand\n")
    assert subprocess.run([copy / "scripts/bundle", "--check"],
                          capture_output=True).returncode == 1


def test_bundle_and_sqitch_give_the_same_schema(cluster: Cluster,
                                                fresh: Callable[[str], str]) -> None:
    by_sqitch, by_bundle = fresh("sqitch"), fresh("bundle")
    sqitch("deploy", f"db:pg:{by_sqitch}")
    install.core(cluster, by_bundle)
    assert schema_dump(by_sqitch) == schema_dump(by_bundle)


def test_negative_control_schema_comparison_sees_a_missing_change(
        cluster: Cluster, fresh: Callable[[str], str]) -> None:
    full, partial = fresh("full"), fresh("partial")
    install.core(cluster, full)
    # (requeue_expired is reworked after 0.1.0: its first instance, by the tag.)
    sqitch("deploy", "--to-change", "requeue_expired@v0.1.0", f"db:pg:{partial}")
    assert schema_dump(full) != schema_dump(partial)


def test_revert_to_nothing_and_deploy_again(cluster: Cluster,
                                           fresh: Callable[..., str],
                                           sqitch_template: Callable[[str], str]) -> None:
    name = fresh("roundtrip", sqitch_template(""))     # what `sqitch deploy` made: the head
    first = schema_dump(name)
    sqitch("revert", "-y", f"db:pg:{name}")
    left = cluster.psql(name, "-At", "-c",
                        "select count(*) from pg_namespace where nspname = 'pgfence'")
    assert left.strip() == "0"
    sqitch("deploy", f"db:pg:{name}")
    assert schema_dump(name) == first


def test_plpgsql_check_finds_nothing(cluster: Cluster, fresh: Callable[[str], str]) -> None:
    name = fresh("lint")
    available = cluster.psql(name, "-At", "-c", "select count(*) from pg_available_extensions "
                             "where name = 'plpgsql_check'")
    if available.strip() == "0":
        pytest.skip("plpgsql_check is not installed for this PostgreSQL version "
                    "(only Debian's PostgreSQL 15 has it)")
    install.core(cluster, name)
    out = cluster.psql(name, "-At", "-c", "create extension plpgsql_check", "-c", r"""
        select p.oid::regprocedure || ': ' || c.level || ': ' || c.message
          from pg_proc p
          cross join lateral plpgsql_check_function_tb(
                p.oid,
                relid => coalesce((select t.tgrelid from pg_trigger t
                                    where t.tgfoid = p.oid limit 1), 0),
                fatal_errors => false) c
         where p.pronamespace = 'pgfence'::regnamespace
           and p.prolang = (select oid from pg_language where lanname = 'plpgsql')
           and (p.prorettype <> 'trigger'::regtype
                or exists (select from pg_trigger t where t.tgfoid = p.oid))""")
    assert out.strip() == "", out


def test_every_deploy_script_has_revert_and_verify() -> None:
    plan = (ROOT / "sqitch.plan").read_text()
    changes = re.findall(r"^([a-z_]+) ", plan, flags=re.M)
    assert changes, "no changes in sqitch.plan"
    for change in changes:
        for kind in ("deploy", "revert", "verify"):
            assert (ROOT / "migrations" / kind / f"{change}.sql").is_file(), (kind, change)
