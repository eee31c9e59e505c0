"""scripts/mutate, the mutation testing of the SQL (docs/development.md, "Mutation testing"):
every mutant of the list still applies to the scripts as they are, a few chosen from the commit
hash are killed on every run (so neither the tool nor the table rots), and the tool tells a
survivor and an invalid mutant from a killed one (its negative control).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from tests.support import HUNG, ROOT

MUTATE = ROOT / "scripts/mutate"
LIST = tomllib.loads((ROOT / "tests/mutation/mutants.toml").read_text())


def mutate(cluster: Cluster, *args: str | Path) -> subprocess.CompletedProcess[str]:
    # With this interpreter, whose environment has pgfence (scripts/mutate would look for .venv).
    return subprocess.run([sys.executable, str(MUTATE), *map(str, args)], env=cluster.env(),
                          capture_output=True, text=True, timeout=HUNG)


def test_every_mutant_applies_to_the_scripts_as_they_are(cluster: Cluster) -> None:
    out = mutate(cluster, "--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(LIST["mutant"]) >= 40
    assert sum("absent:" not in ln for ln in lines) >= 40
    # A script changed under a mutant: update its text (the line says which file).
    assert [ln for ln in lines if "invalid:" in ln] == []
    equivalent = [m for m in LIST["mutant"] if m.get("equivalent")]
    assert len(equivalent) <= 5, "equivalent mutants are kept to a handful"
    absent = {ln.split()[0] for ln in lines if "absent:" in ln}
    for m in LIST["mutant"]:
        assert m.get("killed_by") or m.get("equivalent"), f"{m['id']}: no killer recorded"
        killer = m.get("killed_by", "").split("::")[0]
        # A layer's mutant before the layer lands: its killer is not here either.
        assert (not killer or (ROOT / killer).is_file() or (m["id"] in absent
                and m["file"].startswith("layers/"))), f"{m['id']}: {killer} is gone"


def test_a_rotation_of_mutants_is_killed(cluster: Cluster) -> None:
    # It tests the tests, which kill a mutant on every version alike; the same three (chosen
    # by the commit) on four versions would add minutes to the matrix and nothing else.
    major = cluster.psql("postgres", "-Atc",
                         "select current_setting('server_version_num')::int / 10000")
    if os.environ.get("PGFENCE_TEST_MATRIX") and int(major) != 15:
        pytest.skip("the matrix runs the rotation on PostgreSQL 15 only")
    out = mutate(cluster, "--rotate", "3", "--fast")
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 mutants in" in out.stdout and "3 killed" in out.stdout, out.stdout


def test_negative_control_survivors_and_invalid_mutants_are_reported(cluster: Cluster,
                                                                     tmp_path: Path) -> None:
    mutants = tmp_path / "mutants.toml"
    mutants.write_text("""
tests = ["tests/test_names.py"]

[[mutant]]
id = "comment"
file = "lease_judgement.sql"
text = "-- The lease judgement, written once."
replacement = "-- The lease judgement."
breaks = "nothing"
killed_by = "pgtap/fence/fence.sql"

[[mutant]]
id = "gone"
file = "claim.sql"
text = "a text that is not in the script"
replacement = ""
breaks = "nothing"

[[mutant]]
id = "twice"
file = "acquire.sql"
text = "for update;"
replacement = ""
breaks = "nothing"

[[mutant]]
id = "released"
file = "claim@v0.1.0.sql"
text = "for update"
replacement = ""
breaks = "nothing"

[[mutant]]
id = "broken"
file = "fence.sql"
text = "create or replace function pgfence.fence(lease_id uuid)"
replacement = "create or replace function pgfence.fence(lease_id uuid"
breaks = "nothing"
""")
    out = mutate(cluster, "--mutants", mutants, "--fast")
    assert out.returncode == 1, out.stdout + out.stderr
    said = dict(ln.split(": ", 1) for ln in out.stdout.splitlines() if ": " in ln
                and not ln.startswith(("rotation", "5 mutants")))
    assert said["comment"].startswith("survived"), said
    assert said["gone"] == "invalid: text not found in migrations/deploy/claim.sql"
    assert said["twice"] == ("invalid: text ambiguous in migrations/deploy/acquire.sql"
                             " (found 2 times)")
    assert said["released"].startswith("invalid: claim@v0.1.0.sql is neither a live deploy script")
    assert said["broken"].startswith("invalid: does not install: syntax error"), said
    assert "5 mutants in" in out.stdout and "1 survived, 4 invalid" in out.stdout
