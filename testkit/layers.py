"""The optional layers, found by their folders: the one list of them.

A layer is one folder, ``layers/NAME/``, with one manifest, ``layer.toml``:

    name = "pgflow"                  # the folder's name
    schema = "pgfence_pgflow"        # its schema, which is also its Sqitch project
    needs = ["pgmq"]                 # the layers it installs onto
    docs = "docs/pgflow.md"          # where its contract is written (docs/contract.md names it)

    [[prerequisites]]                # what the third party is; the layer's install refuses
    name = "pgflow"                  # without it, saying "needs NAME"
    install = [                      # how a test database gets it: SQL, or files run by psql
      { sql = "create extension if not exists pgmq" },      # each in one transaction
      { files = ".tools/node_modules/@pgflow/core/dist/supabase/migrations/*.sql" },
    ]

Beside it the folder holds the layer's Sqitch project (sqitch.conf, sqitch.plan, deploy/,
revert/, verify/), its pgTAP files (pgtap/) and its conformance driver (conformance.py, for
tests/test_layer_conformance.py). scripts/bundle, scripts/test, scripts/mutate, the benchmarks
and the tests read the layers from here; nothing else lists them. The wheel ships no manifest:
``pgfence init``'s own list (pgfence.init.LAYERS) is tied to this one by tests/test_init.py.

    python -m testkit.layers         the layers, in install order, one a line
"""

from __future__ import annotations

import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "layer.toml"


class LayerError(Exception):
    pass


@dataclass(frozen=True)
class Step:
    """One step of a prerequisite's install into a test database: SQL run by psql, or every
    file a glob (relative to the repository) names, in name order, each in one transaction."""

    sql: str = ""
    files: str = ""

    def paths(self, root: Path = ROOT) -> list[Path]:
        found = sorted(root.glob(self.files))
        if not found:
            raise LayerError(f"no file matches {self.files} (scripts/setup installs them)")
        return found


@dataclass(frozen=True)
class Prerequisite:
    name: str                   # the layer's install says "needs NAME" without it
    install: tuple[Step, ...]


@dataclass(frozen=True)
class Layer:
    name: str
    schema: str
    needs: tuple[str, ...]
    prerequisites: tuple[Prerequisite, ...]
    docs: str
    dir: Path

    @property
    def plan(self) -> Path:
        return self.dir / "sqitch.plan"

    @property
    def bundle(self) -> Path:
        """Its one-file install, written by scripts/bundle."""
        return self.dir.parent.parent / "sql" / f"pgfence-{self.name}.sql"

    @property
    def pgtap(self) -> list[Path]:
        return sorted((self.dir / "pgtap").glob("*.sql"))

    def needs_text(self) -> str:
        """What its one-file install says it goes after: "pgfence, its pgmq layer and pgflow"."""
        words = ["pgfence", *(f"its {n} layer" for n in self.needs),
                 *(p.name for p in self.prerequisites)]
        return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def read(folder: Path) -> Layer:
    """The layer in ``folder``, from its manifest, checked."""
    path = folder / MANIFEST
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise LayerError(f"{path}: {e}") from e
    name = data.get("name")
    if name != folder.name or not re.fullmatch(r"[a-z][a-z0-9]*", name):
        raise LayerError(f"{path}: name must be the folder's, {folder.name!r}, in [a-z0-9]")
    if data.get("schema") != f"pgfence_{name}":
        raise LayerError(f"{path}: schema must be pgfence_{name}")
    unknown = set(data) - {"name", "schema", "needs", "docs", "prerequisites"}
    if unknown:
        raise LayerError(f"{path}: unknown keys {', '.join(sorted(unknown))}")
    prerequisites = tuple(
        Prerequisite(p["name"], tuple(Step(**s) for s in p.get("install", ())))
        for p in data.get("prerequisites", ()))
    return Layer(name, data["schema"], tuple(data.get("needs", ())), prerequisites,
                 data.get("docs", ""), folder)


@cache
def _discover(root: Path) -> tuple[Layer, ...]:
    top = root / "layers"
    found = {p.name: read(p) for p in sorted(top.iterdir()) if (p / MANIFEST).is_file()} \
        if top.is_dir() else {}
    ordered: list[Layer] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise LayerError(f"layers: {' -> '.join((*path, name))} needs itself")
        if name not in found:
            raise LayerError(f"layers/{path[-1]}: needs {name}, which has no layers/{name}/"
                             f"{MANIFEST}")
        for need in found[name].needs:
            visit(need, (*path, name))
        if found[name] not in ordered:
            ordered.append(found[name])

    for name in found:
        visit(name, ())
    return tuple(ordered)


def discover(root: Path = ROOT) -> tuple[Layer, ...]:
    """Every layer of the repository at ``root``, each after the layers it needs."""
    return _discover(root.resolve())


def names(root: Path = ROOT) -> list[str]:
    return [layer.name for layer in discover(root)]


def layer(name: str, root: Path = ROOT) -> Layer:
    for found in discover(root):
        if found.name == name:
            return found
    raise LayerError(f"no layer {name!r} (layers/*/{MANIFEST}: {', '.join(names(root))})")


def with_needs(chosen: Iterable[str], root: Path = ROOT) -> list[Layer]:
    """The chosen layers and every layer they need, in install order ("all": every layer)."""
    chosen = list(chosen)
    if chosen == ["all"]:
        return list(discover(root))
    wanted: set[str] = set()
    todo = list(chosen)
    while todo:
        found = layer(todo.pop(), root)
        if found.name not in wanted:
            wanted.add(found.name)
            todo.extend(found.needs)
    return [x for x in discover(root) if x.name in wanted]


if __name__ == "__main__":
    try:
        print("\n".join(names()))
    except LayerError as e:
        sys.exit(f"testkit.layers: {e}")
