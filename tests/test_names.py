"""The resource-name rule is one rule on both sides: what the CLI checks before it talks to a
database (pgfence.sql.resource, with the pattern RESOURCE_NAME) accepts and refuses exactly
the names that pgfence.check_name accepts and refuses in the database.

The two patterns are written alike but are not read alike: Python's ``$`` also matches before
a newline at the end, PostgreSQL's only at the end. The Python side uses ``fullmatch``, and the
negative control shows that a ``$``-anchored Python pattern would let such a name through.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pgfence import sql
from pgfence.connection import connect
from testkit.cluster import Cluster
from testkit.harness import sqlstate

Verdict = Callable[[str], bool]

# Around the rule's edges: the allowed characters, the punctuation a name may not start with,
# white space and other control characters, and letters beyond ASCII (one a look-alike of K).
EDGES = "aZ09_.:@/-" + " \t\n\r\x0b\x0c" + "é\u212aÅ\u0391\u0430\uff21\u0663ß"

EXAMPLES = [
    "a", "_", "0", "a" * 128, "a" * 129, "_" * 128, "", "a\n", "a\r\n", "\na", "a\x0b",
    ".a", "-a", ":a", "@a", "/a", "a.b:c@d/e-f", "a b", " a", "a ", "é", "aé", "\u212a",
    "\uff41", "\u0663", "a" * 127 + "\n", "a" * 128 + "\n", "a$", "a\\", "a'", "a;", "(a)",
]


@pytest.fixture(scope="module")
def in_sql(cluster: Cluster, template: str) -> Iterator[Verdict]:
    """Whether pgfence.check_name accepts a name; one database for the whole module."""
    name = f"t_names_{uuid.uuid4().hex[:8]}"
    cluster.create_database(name, template)
    conn = connect(cluster.dsn(name), "names")

    def accepts(value: str) -> bool:
        state = sqlstate(lambda: conn.execute("select pgfence.check_name('resource', %s)",
                                              (value,)))
        assert state in (None, "22023"), f"check_name({value!r}) raised {state}"
        return state is None

    try:
        yield accepts
    finally:
        conn.close()
        cluster.drop_database(name)


def in_python(value: str) -> bool:
    try:
        sql.resource(value)
    except sql.BadInput:
        return False
    return True


def test_the_edge_cases_agree(in_sql: Verdict) -> None:
    verdicts = {value: (in_python(value), in_sql(value)) for value in EXAMPLES}
    assert {v: p for v, (p, s) in verdicts.items() if p != s} == {}
    # The examples do fall on both sides of the rule.
    assert verdicts["a" * 128] == (True, True) and verdicts["a" * 129] == (False, False)
    assert verdicts["a\n"] == (False, False) and verdicts[".a"] == (False, False)


names = st.one_of(
    st.from_regex(sql.RESOURCE_NAME, fullmatch=True),   # names the rule accepts
    st.text(alphabet=st.sampled_from(EDGES), max_size=140),
    # Near the length limit: a first character, a body of allowed ones, perhaps a tail.
    st.tuples(st.sampled_from("a_0.-\n"), st.text(alphabet="ab_.:@/-", min_size=124, max_size=132),
              st.sampled_from(["", "\n", " ", "é"])).map("".join),
    st.text().filter(lambda s: "\x00" not in s),        # PostgreSQL text cannot hold NUL
)


@settings(max_examples=500, deadline=None)
@given(names)
@example("a" * 128 + "\n")
@example("a" * 129)
def test_python_and_sql_accept_the_same_names(in_sql: Verdict, value: str) -> None:
    assert in_python(value) == in_sql(value), value


def test_negative_control_dollar_anchored_pattern_disagrees(in_sql: Verdict) -> None:
    # The one pattern anchored as check_name anchors it, but read by Python's re.
    dollar = re.compile(f"^{sql.RESOURCE_NAME.pattern}$")
    assert dollar.match("a\n") and not in_sql("a\n")
    assert not in_python("a\n")
