"""Building the CLI's SQL: the one routine that turns values into SQL literals, and the checks
that names and tokens pass before any of them reaches a database.

The Supabase transport can only send SQL text (``supabase db query '<sql>'``), so values are
inlined as literals. They are built here and nowhere else.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable

# The same rule as pgfence.check_name in migrations/deploy/checks.sql (tests/test_names.py
# proves it); always used with fullmatch, since re's `$` also matches before a final newline.
RESOURCE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,127}")


class BadInput(ValueError):
    """A value the CLI refuses before talking to any database."""


def literal(value: str) -> str:
    """A PostgreSQL string literal for ``value``, whatever standard_conforming_strings says.

    An escape string (E'...') with backslashes and quotes doubled: nothing inside it can end
    the literal, and dollar signs, semicolons and comment markers are plain characters there.
    PostgreSQL text cannot hold NUL, so a NUL is refused rather than silently truncated.
    """
    if "\x00" in value:
        raise BadInput("a value contains a NUL character, which PostgreSQL text cannot hold")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def resource(name: str) -> str:
    """A validated resource name (raises BadInput)."""
    if not RESOURCE_NAME.fullmatch(name):
        raise BadInput(f"invalid resource name {name!r}: 1 to 128 characters from "
                       "A-Z a-z 0-9 _ . : @ / -, not starting with punctuation")
    return name


def token(value: str, what: str = "token") -> uuid.UUID:
    """A validated UUID (raises BadInput)."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadInput(f"invalid {what} {value!r}: expected a UUID") from None


def uuid_literal(value: uuid.UUID) -> str:
    return literal(str(value)) + "::uuid"


def text_array(values: Iterable[str]) -> str:
    return "array[" + ", ".join(literal(v) for v in values) + "]::text[]"
