"""The SQL files this package carries, and the releases they name.

``src/pgfence/schema`` is a symlink to the repository's ``sql/`` (one copy of the files, in the
wheel as package data):

    schema/pgfence.sql                      the full install of the newest release; its first
                                            line names it: ``-- pgfence 0.2.1: one-file install``
    schema/releases/pgfence--<X>.sql        the full install of each past release
    schema/upgrades/pgfence--<A>--<B>.sql   the one-file upgrade from release A to release B
    schema/releases/fingerprints            the schema fingerprint of each release
    schema/queries/*.sql                    read-only queries the CLI shares with the files

The files own the protocol: each refuses to run outside a transaction block, and an upgrade
refuses a database that is not exactly release A. This module only finds the files and the
chain of upgrades from one release to another.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable

VERSION = re.compile(r"\d+\.\d+\.\d+")
_HEADER = re.compile(rf"-- pgfence (?:v)?({VERSION.pattern}): one-file install")
_RELEASE = re.compile(rf"pgfence--({VERSION.pattern})\.sql")
# What queries/NAME.sql names pgfence's schema or Sqitch project by: replaced to aim it at a
# layer's (scripts/bundle's SUBJECT, the same text).
SUBJECT = {"fingerprint.sql": "'pgfence'::pg_catalog.regnamespace",
           "sqitch_registry.sql": "n.nspname, 'pgfence')"}
_UPGRADE = re.compile(rf"pgfence--({VERSION.pattern})--({VERSION.pattern})\.sql")
# A layer's: pgfence-LAYER--A--B.sql, from the layer's last release A to pgfence release B.
_LAYER_UPGRADE = re.compile(rf"pgfence-([a-z0-9_]+)--({VERSION.pattern})--({VERSION.pattern})\.sql")


class BrokenPackage(Exception):
    """The package's own SQL files are missing or do not say which release they are."""


def key(version: str) -> tuple[int, ...]:
    """The sort key of a release number such as ``0.10.0`` (numeric, not textual)."""
    if not VERSION.fullmatch(version):
        raise ValueError(f"not a release number: {version!r}")
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Upgrade:
    """One file of an upgrade chain: from release ``source`` to release ``target``."""

    source: str
    target: str
    file: Traversable = field(compare=False)

    @property
    def name(self) -> str:
        return self.file.name

    def text(self) -> str:
        return _read(self.file)


@dataclass(frozen=True)
class Files:
    """The SQL files under ``root`` (default: the installed package's)."""

    root: Traversable = field(default_factory=lambda: resources.files("pgfence") / "schema")

    def install_file(self) -> Traversable:
        return self.root / "pgfence.sql"

    def install(self) -> str:
        return _read(self.install_file())

    def newest(self) -> str:
        """The release that ``pgfence.sql`` installs, from its first line."""
        first = self.install().partition("\n")[0]
        match = _HEADER.match(first)
        if not match:
            raise BrokenPackage(f"{self.install_file().name} names no release in its first line "
                                f"({first[:80]!r}); expected '-- pgfence X.Y.Z: one-file install'")
        return match.group(1)

    def query(self, name: str, subject: str = "pgfence") -> str:
        """One of the read-only queries the files share with the CLI (``schema/queries/``),
        about pgfence's schema and Sqitch project or a layer's (``subject``: pgfence_pgflow),
        aimed as scripts/bundle aims it in a layer's upgrade file (the same SUBJECT text;
        tests/test_cli_install.py compares the two)."""
        text = _read(self.root / "queries" / name)
        if subject != "pgfence":
            if not re.fullmatch(r"pgfence_[a-z0-9_]+", subject) or SUBJECT[name] not in text:
                raise BrokenPackage(f"queries/{name} cannot be aimed at {subject}")
            text = text.replace(SUBJECT[name], SUBJECT[name].replace("'pgfence'", f"'{subject}'"))
        return text

    def fingerprints(self, layer: str = "") -> dict[str, str]:
        """The schema fingerprint of each release (``schema/releases/fingerprints``), or of a
        layer's (``fingerprints-LAYER``): what ``queries/fingerprint.sql`` gives on a fresh
        install of it (aimed at the layer's schema)."""
        path = self.root / "releases" / (f"fingerprints-{layer}" if layer else "fingerprints")
        found: dict[str, str] = {}
        if layer and not path.is_file():
            return found
        for line in _read(path).splitlines():
            if line.strip() and not line.startswith("#"):
                version, value = line.split()
                found[version] = value
        return found

    def layers(self) -> list[str]:
        """The optional layers this package carries (``pgfence-LAYER.sql``)."""
        return sorted(m.group(1) for item in self.root.iterdir()
                      if (m := re.fullmatch(r"pgfence-([a-z0-9_]+)\.sql", item.name)))

    def layer_release(self, layer: str, fingerprint: str) -> str | None:
        """The release of ``layer`` whose schema has ``fingerprint``, as a layer upgrade file
        judges a database (sql/releases/fingerprints-LAYER): the newest of the releases that
        share it (a release that did not change the layer has the one before's schema), or
        None when none does (changed by hand). The one place the CLI tells a layer's release,
        until the layers record their version themselves (issue 39)."""
        same = [v for v, f in self.fingerprints(layer).items() if f == fingerprint]
        return max(same, key=key) if same else None

    def upgrades(self) -> list[Upgrade]:
        folder = self.root / "upgrades"
        found = []
        for item in folder.iterdir() if folder.is_dir() else ():
            match = _UPGRADE.fullmatch(item.name)
            if match and key(match.group(1)) < key(match.group(2)):
                found.append(Upgrade(match.group(1), match.group(2), item))
        return sorted(found, key=lambda u: (key(u.source), key(u.target)))

    def layer_chain(self, layer: str, source: str, target: str) -> list[Upgrade]:
        """The upgrade files that carry ``layer`` from pgfence release ``source`` to
        ``target``, in order. A layer's file is named after the layer's last release A (the last
        release that changed it, or one it was released with unchanged) and the pgfence release
        B it comes with; a release that did not change the layer has none. So every file with
        source <= A and B <= target applies, oldest first: each checks first that the layer's
        schema is release A's (sql/releases/fingerprints-LAYER) and refuses anything else."""
        folder = self.root / "upgrades"
        found = []
        for item in folder.iterdir() if folder.is_dir() else ():
            match = _LAYER_UPGRADE.fullmatch(item.name)
            if (match and match.group(1) == layer and key(source) <= key(match.group(2))
                    and key(match.group(3)) <= key(target)):
                found.append(Upgrade(match.group(2), match.group(3), item))
        return sorted(found, key=lambda u: (key(u.source), key(u.target)))

    def releases(self) -> dict[str, Traversable]:
        """Past releases' full installs (tests make old databases from them)."""
        folder = self.root / "releases"
        found = {}
        for item in folder.iterdir() if folder.is_dir() else ():
            match = _RELEASE.fullmatch(item.name)
            if match:
                found[match.group(1)] = item
        return dict(sorted(found.items(), key=lambda kv: key(kv[0])))

    def release(self, version: str) -> str:
        """The full install of past release ``version`` (``releases/pgfence--X.sql``)."""
        found = self.releases().get(version)
        if found is None:
            raise BrokenPackage(f"this pgfence package has no full install of release {version}")
        return _read(found)

    def known(self) -> list[str]:
        """Every release the files name, oldest first."""
        names = {self.newest(), *self.releases()}
        for u in self.upgrades():
            names |= {u.source, u.target}
        return sorted(names, key=key)

    def chain(self, source: str, target: str) -> list[Upgrade] | None:
        """The fewest upgrade files that lead from ``source`` to ``target``, in order; [] when
        they are the same release; None when no chain of files leads there."""
        if source == target:
            return []
        edges: dict[str, list[Upgrade]] = {}
        for u in self.upgrades():
            if key(u.target) <= key(target):
                edges.setdefault(u.source, []).append(u)
        came: dict[str, Upgrade] = {}
        todo = deque([source])
        while todo:
            here = todo.popleft()
            for u in edges.get(here, []):
                if u.target in came or u.target == source:
                    continue
                came[u.target] = u
                if u.target == target:
                    steps = [u]
                    while steps[0].source != source:
                        steps.insert(0, came[steps[0].source])
                    return steps
                todo.append(u.target)
        return None


def _read(item: Traversable) -> str:
    try:
        return item.read_text(encoding="utf-8")
    except OSError as e:
        raise BrokenPackage(f"this pgfence package cannot read its SQL file {item.name}: "
                            f"{e.strerror or e}") from None
