"""Every SQL function of pgfence and of its layers says what kind it is (issue 39 item 8), so that
a reader tells them apart without the contract:

- the API: granted to a pgfence role (pgfence_worker, pgfence_operator, pgfence_monitor);
  its comment says what it does (and, for an operator's, begins "Operator:");
- ``Layers:`` a core function no role may call but the layers do (their SECURITY DEFINER code
  runs as the owner): the layers' API, kept as stable as the API;
- ``Installer:`` a core function the release scripts call (seal, the guards of upgrades and
  reverts);
- ``Hook:`` a layer's function the core calls through its registration (pgfence.layers);
- ``Private:`` anything else: a helper of its own schema, free to change.

The kind is the first word of the function's comment; `kinds` (the core's change, and each
layer's) writes it, with pgfence.set_kind. This test holds every kind to the facts of an
installed database: the grants, the calls the layers' installed code makes, the release
scripts and the registrations. A function added without a kind, or granted while marked
private, fails it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit import layers
from testkit.harness import Database
from tests.support import ROOT

KINDS = ("Layers", "Installer", "Hook", "Private")
ROLES = ("pgfence_worker", "pgfence_operator", "pgfence_monitor")
LAYERS = layers.discover()
CALL = re.compile(r"\bpgfence\.(\w+)\s*\(")


def release_scripts() -> str:
    """The text of what installs, checks and reverts releases and kinds: each plan's release
    changes and kinds changes, scripts/bundle (the upgrade files' guards) and the CLI."""
    found = [*ROOT.glob("migrations/*/release_*.sql"), *ROOT.glob("layers/*/*/release_*.sql"),
             *ROOT.glob("migrations/*/kinds.sql"), *ROOT.glob("layers/*/*/kinds.sql"),
             ROOT / "scripts/bundle", *ROOT.glob("src/pgfence/**/*.py")]
    # What a SQL script calls, not the names it passes as strings (kinds.sql names every
    # function it marks).
    return "\n".join(re.sub(r"'[^']*'", "''", p.read_text()) if p.suffix == ".sql"
                     else p.read_text() for p in found)


def facts(db: Database) -> list[tuple[str, str, str | None, bool, str]]:
    """(schema, signature, kind written, granted to a pgfence role, name) of every function."""
    rows = db.sql("""
        select n.nspname::text, p.oid::regprocedure::text,
               substring(obj_description(p.oid, 'pg_proc') from %s),
               bool_or(has_function_privilege(r.rolname, p.oid, 'execute')),
               p.proname::text
          from pg_proc p
          join pg_namespace n on n.oid = p.pronamespace
          cross join (select rolname from pg_roles where rolname = any (%s)) r
         where n.nspname = 'pgfence' or n.nspname like 'pgfence\\_%%'
         group by 1, 2, 3, 5
         order by 1, 2""", (f"^({'|'.join(KINDS)}):", list(ROLES)))
    return [(s, f, k, g, n) for s, f, k, g, n in rows]


def layer_code(db: Database) -> str:
    """The installed code of every layer: its functions' and views' definitions."""
    return "\n".join(db.one("""
        select coalesce(array_agg(d), '{}') from (
          select pg_get_functiondef(p.oid) d from pg_proc p
            join pg_namespace n on n.oid = p.pronamespace
           where n.nspname like 'pgfence\\_%%' and p.prokind = 'f'
          union all
          select pg_get_viewdef(c.oid) from pg_class c
            join pg_namespace n on n.oid = c.relnamespace
           where n.nspname like 'pgfence\\_%%' and c.relkind = 'v') x"""))


def hooks(db: Database) -> set[str]:
    """The layers' functions the core calls: every one pgfence.layers names."""
    columns = db.sql("""select column_name from information_schema.columns
                         where table_schema = 'pgfence' and table_name = 'layers'
                           and data_type in ('text', 'regprocedure')""")
    found: set[str] = set()
    for (column,) in columns:
        for (value,) in db.sql(f'select "{column}"::text from pgfence.layers'):
            if value and "(" in value:
                found.add(db.one("select %s::regprocedure::text", (value,)))
    return found


def wrong_kinds(db: Database, scripts: str) -> list[str]:
    """Every function whose kind does not fit the facts, with the kind it should have."""
    called_by_layers = set(CALL.findall(layer_code(db)))
    installer = set(CALL.findall(scripts))
    hooked = hooks(db)
    wrong = []
    for schema, signature, kind, granted, name in facts(db):
        core = schema == "pgfence"
        should: str | None
        if granted:
            should = None
        elif signature in hooked:
            should = "Hook"
        elif core and name in called_by_layers:
            should = "Layers"
        elif core and name in installer:
            should = "Installer"
        else:
            should = "Private"
        if kind != should:
            want = "the API (no kind)" if should is None else f"{should}:"
            wrong.append(f"{signature}: {kind or 'no kind'}, {want} expected")
    return wrong


@pytest.fixture
def everything(layered: Callable[..., Database]) -> Database:
    """A database with every layer (the last discovered needs the others it names)."""
    db = layered(LAYERS[-1].name)
    installed = {s for (s,) in db.sql("select nspname::text from pg_namespace")}
    assert {layer.schema for layer in LAYERS} <= installed
    return db


def test_every_function_says_its_kind(everything: Database) -> None:
    assert wrong_kinds(everything, release_scripts()) == []
    kinds = {k for _, _, k, _, _ in facts(everything)}
    assert kinds == {None, *KINDS}, kinds          # every kind is in use


@pytest.mark.parametrize("breakage", ["granted", "private", "unmarked", "hook"])
def test_negative_control_a_function_of_the_wrong_kind_is_named(everything: Database,
                                                                breakage: str) -> None:
    db = everything
    if breakage == "granted":       # a private helper granted to a role is the API now
        db.sql("grant execute on function pgfence.deparsed(text) to pgfence_worker")
        expected = "pgfence.deparsed(text): Private, the API (no kind) expected"
    elif breakage == "private":     # what a layer calls marked free to change
        db.sql("comment on function pgfence.hold_fenced(uuid) is 'Private: x'")
        expected = "pgfence.hold_fenced(uuid): Private, Layers: expected"
    elif breakage == "unmarked":    # a new function without a kind
        db.sql("create function pgfence.helper() returns int language sql as 'select 1'")
        db.sql("revoke all on function pgfence.helper() from public")
        expected = "pgfence.helper(): no kind, Private: expected"
    else:                           # a hook the registration no longer names
        db.sql("create function pgfence.unhooked() returns int language sql as 'select 1'")
        db.sql("revoke all on function pgfence.unhooked() from public")
        db.sql("comment on function pgfence.unhooked() is 'Hook: not registered'")
        expected = "pgfence.unhooked(): Hook, Private: expected"
    assert expected in wrong_kinds(db, release_scripts())


def test_the_kinds_are_the_ones_docs_name() -> None:
    doc = (ROOT / "docs/contract.md").read_text()
    for kind in KINDS:
        assert f"`{kind}:`" in doc, kind
    assert Path(ROOT / "migrations/deploy/kinds.sql").is_file()
