"""Owner labels: one rule in SQL (pgfence.check_label) and Python (pgfence.sql.label_ok), the
same text, judging alike (a property test); labels that render blank are refused. And every
format (Cf), line-separator (Zl) and paragraph-separator (Zp) code point
that Python's Unicode database knows is refused by pgfence.check_label, and letters, marks,
digits, symbols and spaces inside a label are accepted. The SQL names the refused characters
one range at a time; this test is what keeps that list complete.
"""

from __future__ import annotations

import re
import sys
import unicodedata
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgfence import sql
from pgfence.connection import connect
from pgfence.sql import label_ok
from testkit.cluster import Cluster
from testkit.harness import Database
from tests.support import ROOT

REFUSED = ("Cf", "Zl", "Zp")
# Whether the check f (pgfence.check_label) refuses the label v.
REFUSED_BY = """
    create function pg_temp.refused(v text, f text) returns boolean
    language plpgsql as $$
    begin
      execute format('select %s(%L, %L)', f, 'owner', v);
      return false;
    exception when invalid_parameter_value then
      return true;
    end $$"""


@pytest.fixture(scope="module")
def conn(cluster: Cluster, template: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    name = f"t_labels_{uuid.uuid4().hex[:8]}"
    cluster.create_database(name, template)
    try:
        with connect(cluster.dsn(name), "labels") as c:
            c.execute(REFUSED_BY)
            yield c
    finally:
        cluster.drop_database(name)


def verdicts(conn: psycopg.Connection[tuple[object, ...]], labels: list[str],
             function: str = "pgfence.check_label") -> list[bool]:
    rows = conn.execute("select pg_temp.refused(v, %s) "
                        "from unnest(%s::text[]) with ordinality u(v, i) order by i",
                        (function, labels)).fetchall()
    return [bool(r[0]) for r in rows]


def code_points(categories: tuple[str, ...]) -> list[str]:
    return [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in categories]


Conn = psycopg.Connection[tuple[object, ...]]


def let_through(conn: Conn, chars: list[str], function: str = "pgfence.check_label") -> list[str]:
    labels = [f"worker{c}1" for c in chars]
    refused = verdicts(conn, labels, function)
    return [f"U+{ord(c):04X} {unicodedata.name(c, '?')}"
            for c, r in zip(chars, refused, strict=True) if not r]


def test_every_format_and_separator_character_is_refused(conn: Conn) -> None:
    chars = code_points(REFUSED)
    assert len(chars) > 150  # Unicode 14 has 163 of them
    passed = let_through(conn, chars)
    assert passed == [], passed


def test_negative_control_without_the_format_class_they_pass(db: Database) -> None:
    db.install_mutant("label-format-class-allowed")
    with connect(db.dsn, "labels") as c:
        c.execute(REFUSED_BY)
        passed = let_through(c, code_points(REFUSED))
    assert "U+202E RIGHT-TO-LEFT OVERRIDE" in passed and len(passed) > 150


def test_ordinary_characters_are_accepted(conn: Conn) -> None:
    # A sample of every other category but controls (Cc), unassigned (Cn), private use (Co)
    # and surrogates (Cs): every 37th such code point, inside a label.
    chars = code_points(("Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc",
                         "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs"))[::37]
    refused = set(chars) - {chr(int(u.split()[0][2:], 16)) for u in let_through(conn, chars)}
    assert refused == set(), sorted(f"U+{ord(c):04X}" for c in refused)


# -- one visibility rule, in SQL and Python (issue 26) --------------------------------------

BLANK = ["\u3164", "\u115f", "\u1160", "\uffa0", "\u2800", "\u034f", "\ufe0f", "\U000e0100",
         "\u180b", " \u3000", "\u2800\ufe0f \u3164", "\u00a0"]


def test_labels_that_render_blank_are_refused(conn: Conn) -> None:
    assert verdicts(conn, BLANK) == [True] * len(BLANK)
    assert [label_ok(v) for v in BLANK] == [False] * len(BLANK)
    # One visible character among them is enough; a combining mark alone is visible (a mark).
    visible = [f"{v}a" for v in BLANK if v not in ("\u180b",)] + ["\u0301", "e\u0301", "ㅎ"]
    assert verdicts(conn, visible) == [False] * len(visible)
    assert all(label_ok(v) for v in visible)


def test_the_sql_and_the_python_rule_are_the_same_text() -> None:
    source = (ROOT / "migrations/deploy/checks.sql").read_text()
    assert f"value ~ '{sql.LABEL_REFUSED}'" in source
    assert f"value !~ '{sql.LABEL_VISIBLE}'" in source


# Characters around the rule's edges, and any others.
EDGE_CHARS = st.sampled_from([*"a é\u0301", *(c for c in BLANK if len(c) == 1),
                              "\u200b", "\u202e", "\x07", "\u2028", "\U000e0041", "\u2062"])
LABELS = st.text(st.one_of(EDGE_CHARS, st.characters(blacklist_categories=["Cs"],
                                                     blacklist_characters="\x00")),
                 max_size=260) | st.text(EDGE_CHARS, min_size=250, max_size=260)


@settings(max_examples=400, deadline=None)
@given(LABELS)
def test_sql_and_python_judge_every_label_alike(conn: Conn, label: str) -> None:
    assert verdicts(conn, [label]) == [not label_ok(label)]


def test_negative_control_a_python_rule_without_the_visibility_clause_differs(
        conn: Conn) -> None:
    def without_visibility(value: str) -> bool:
        return 1 <= len(value) <= 256 and re.search(sql.LABEL_REFUSED, value) is None
    assert [not without_visibility(v) for v in BLANK] != verdicts(conn, BLANK)
