"""scripts/mutate, the mutation testing of the SQL (docs/development.md, "Mutation testing"):
every mutant of the list still applies to the scripts as they are, a few chosen from the commit
hash are killed on every run (so neither the tool nor the table rots), and the tool tells a
survivor and an invalid mutant from a killed one (its negative control).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import mutants
from testkit.cluster import Cluster
from tests.support import HUNG, ROOT

MUTATE = ROOT / "scripts/mutate"


def mutate(cluster: Cluster, *args: str | Path) -> subprocess.CompletedProcess[str]:
    # With this interpreter, whose environment has pgfence (scripts/mutate would look for .venv).
    return subprocess.run([sys.executable, str(MUTATE), *map(str, args)], env=cluster.env(),
                          capture_output=True, text=True, timeout=HUNG)


def test_every_mutant_applies_to_the_scripts_as_they_are(cluster: Cluster) -> None:
    out = mutate(cluster, "--list")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    found, _ = mutants.load()
    assert len(lines) == len(found) >= 40
    assert sum("absent:" not in ln for ln in lines) >= 40
    # A script changed under a mutant: update its text (the line says which file).
    assert [ln for ln in lines if "invalid:" in ln] == []
    assert len([m for m in found if m.equivalent]) <= 5, "equivalent mutants are kept to a handful"
    for m in found:
        assert m.killed_by or m.equivalent, f"{m.id}: no killer recorded"
        killer = m.killed_by.split("::")[0]
        # A layer's mutant before the layer lands: its killer is not here either.
        assert not killer or (ROOT / killer).is_file() or m.absent(ROOT), (
            f"{m.id}: {killer} is gone")


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


def test_the_docs_table_is_the_catalogue() -> None:
    # docs/development.md shows the whole catalogue (scripts/mutate --list --table), row for row.
    doc = (ROOT / "docs/development.md").read_text()
    found, _ = mutants.load()
    assert mutants.table(found) in doc, "regenerate it: scripts/mutate --list --table"
    # Its negative control: a catalogue with one more mutant than the table shows.
    extra = mutants.Mutant("new", (mutants.Edit("claim.sql", "x", "y"),), "I2", "why", "",
                           "pgtap/tasks/claim.sql")
    assert mutants.table([*found, extra]) not in doc


DIRECT = re.compile(r"\.replace_in_function\(")


def direct_breaks(root: Path) -> list[str]:
    """Where a test breaks a function with its own text instead of naming a mutant: a call of
    replace_in_function, or a negative control that reads a function's definition (to write
    it back changed)."""
    found = []
    for p in sorted((root / "tests").rglob("*.py")):
        control = False
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if line.startswith("def "):
                control = line.startswith("def test_negative_control")
            if DIRECT.search(line) or (control and "pg_get_functiondef" in line):
                found.append(f"{p.relative_to(root)}:{n}")
    return found


def test_every_negative_control_names_a_mutant_of_the_catalogue(tmp_path: Path) -> None:
    # One catalogue of broken variants: a negative control installs a mutant by its id
    # (Database.install_mutant), so scripts/mutate runs the very same variant.
    assert direct_breaks(ROOT) == []
    named = {m for p in (ROOT / "tests").rglob("*.py")
             for m in re.findall(r'install_mutant\(((?:"[\w-]+"(?:, )?)+)\)', p.read_text())}
    ids = {i for group in named for i in re.findall(r'"([\w-]+)"', group)}
    assert len(ids) >= 40 and ids <= set(mutants.catalogue()), ids - set(mutants.catalogue())
    # Its negative control: a test carrying its own replacement text is found.
    (tmp_path / "tests").mkdir()
    call = "db.replace_in_function" + '("f()", "a", "b")'   # (not one itself)
    read = "db.one('select pg_get_" + "functiondef(%s::regprocedure)', ('f()',))"
    (tmp_path / "tests/test_x.py").write_text(
        f"def test_negative_control_x(db):\n    {call}\n\n\n"
        f"def test_negative_control_y(db):\n    src = {read}\n")
    assert direct_breaks(tmp_path) == ["tests/test_x.py:2", "tests/test_x.py:6"]
