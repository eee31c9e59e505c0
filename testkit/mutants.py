"""The one catalogue of deliberately broken variants: tests/mutation/mutants.toml.

Each entry is a mutant: one exact piece of text in a live script and its replacement (or
several, ``[[mutant.edit]]``, for a variant that breaks one mechanism in two places), the
invariant or contract clause it breaks, what goes wrong, and the test that killed it. Two tools
read it:

- scripts/mutate applies a mutant to a copy of the scripts, rebuilds the one-file install and
  runs the suite on it: the suite must fail (``killed``);
- a negative control installs a mutant into its test database by name
  (``testkit.harness.Database.install_mutant``): each edit goes into the one function of its
  script whose installed definition holds the text. The scenario must then fail its check.

So every negative control is a mutant the mutation tool runs too, and its positive twin is
what kills it. A script is a live deploy script (migrations/deploy/NAME.sql or a layer's
layers/LAYER/deploy/NAME.sql, never a released NAME@TAG.sql) or a document whose SQL the tests
run as written (docs/NAME.md), or scripts/bundle, whose rules decide what every generated
install and upgrade holds (scripts/mutate only: no database function holds its text).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "tests/mutation/mutants.toml"
DEPLOY = "migrations/deploy"
BUNDLE = "scripts/bundle"  # the one script besides the SQL and the docs that a mutant may change
SCRIPT = re.compile(r"(migrations|layers/[\w-]+)/deploy/[\w-]+\.sql|docs/[\w-]+\.md|scripts/bundle")
FUNCTION = re.compile(r"create\s+(?:or\s+replace\s+)?function\s+([\w.]+)\s*\(", re.I)


@dataclass(frozen=True)
class Edit:
    file: str          # NAME.sql (the core's deploy/), or a path (layers/..., docs/...)
    text: str
    replacement: str

    @property
    def path(self) -> str:
        """The script in the repository."""
        return self.file if "/" in self.file else f"{DEPLOY}/{self.file}"

    def problem(self, root: Path) -> str | None:
        """Why this edit cannot be applied to the scripts under ``root``, or None."""
        if "@" in self.file or not SCRIPT.fullmatch(self.path):
            return f"{self.file} is neither a live deploy script nor {BUNDLE}"
        path = root / self.path
        if not path.is_file():
            return f"{self.path} does not exist"
        n = path.read_text().count(self.text)
        if n == 0:
            return f"text not found in {self.path}"
        if n > 1:
            return f"text ambiguous in {self.path} (found {n} times)"
        return None

    def functions(self, root: Path = ROOT) -> list[str]:
        """The functions its script creates (schema-qualified names)."""
        return sorted(set(FUNCTION.findall((root / self.path).read_text())))


@dataclass(frozen=True)
class Mutant:
    id: str
    edits: tuple[Edit, ...]
    breaks: str        # the invariant (I1-I7) or the contract clause it breaks
    why: str = ""
    equivalent: str = ""   # why no test can kill it, if none can
    killed_by: str = ""    # the killer the last run found (scripts/mutate --fast runs it)

    @property
    def file(self) -> str:
        return ", ".join(dict.fromkeys(e.file for e in self.edits))

    def absent(self, root: Path) -> bool:
        """An optional layer's mutant, in a tree that does not have that layer."""
        return any(e.path.startswith("layers/")
                   and not (root / "layers" / e.path.split("/")[1]).is_dir() for e in self.edits)

    def problem(self, root: Path) -> str | None:
        for e in self.edits:
            found = e.problem(root)
            if found:
                return found
        return None

    def apply(self, root: Path) -> None:
        """The scripts under ``root`` with this mutant's edits (each text is there once)."""
        for e in self.edits:
            path = root / e.path
            path.write_text(path.read_text().replace(e.text, e.replacement))


def _mutant(entry: dict[str, Any]) -> Mutant:
    entry = dict(entry)
    edits = [Edit(**e) for e in entry.pop("edit", [])]
    if "file" in entry:
        edits.insert(0, Edit(entry.pop("file"), entry.pop("text"), entry.pop("replacement")))
    if not edits:
        raise ValueError(f"mutant {entry.get('id')}: no edit")
    return Mutant(edits=tuple(edits), **entry)


def load(path: Path = CATALOGUE) -> tuple[list[Mutant], list[str]]:
    """The catalogue's mutants, and the tests scripts/mutate runs on each."""
    data = tomllib.loads(path.read_text())
    mutants = [_mutant(m) for m in data["mutant"]]
    ids = [m.id for m in mutants]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate mutant ids: {', '.join(dupes)}")
    return mutants, list(data["tests"])


@cache
def catalogue() -> dict[str, Mutant]:
    return {m.id: m for m in load()[0]}


def install(one: Callable[[str, Sequence[Any]], Any],
            replace_in_function: Callable[[str, str, str], None], ids: Sequence[str]) -> None:
    """Installs the mutants ``ids`` into a database: for each edit, the one function of its
    script whose definition holds the text (``one`` runs a query of one value), replaced by
    ``replace_in_function``. Fails loudly when that is not exactly one function."""
    for mutant_id in ids:
        for e in catalogue()[mutant_id].edits:
            names = e.functions()
            # (The CASE keeps pg_get_functiondef from aggregates, which it refuses.)
            holding = one("select coalesce(array_agg(p.oid::regprocedure::text), '{}') "
                          "from pg_catalog.pg_proc p "
                          "where case when p.prokind = 'f' and p.pronamespace::regnamespace::text "
                          "                || '.' || p.proname = any (%s) "
                          "      then strpos(pg_catalog.pg_get_functiondef(p.oid), %s) > 0 end",
                          (names, e.text))
            assert len(holding) == 1, (
                f"mutant {mutant_id}: {len(holding)} installed functions of {e.path} "
                f"({', '.join(names)}) hold its text {e.text!r}: one expected")
            replace_in_function(holding[0], e.text, e.replacement)


def table(found: Sequence[Mutant]) -> str:
    """The catalogue as docs/development.md shows it (scripts/mutate --list --table)."""
    lines = ["| mutant | script | breaks | what goes wrong | killed by |", "|---|---|---|---|---|"]
    for m in found:
        killer = f"equivalent: {m.equivalent}" if m.equivalent else f"`{m.killed_by}`"
        lines.append(f"| `{m.id}` | {m.file} | {m.breaks} | {m.why} | {killer} |")
    return "\n".join(lines)
