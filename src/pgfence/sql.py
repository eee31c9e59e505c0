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

# The owner-label rule of pgfence.check_label, the same text in both (tests/test_labels.py): 1
# to 256 characters, none of LABEL_REFUSED (control, format and separator characters), at
# least one of LABEL_VISIBLE (not white space, not default-ignorable, not U+2800 BRAILLE
# PATTERN BLANK: those render blank). Python's re and PostgreSQL's regular expressions read
# these \u and \U escapes alike.
LABEL_REFUSED = (
    r"[\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891"
    r"\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff"
    r"\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3"
    r"\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)
LABEL_VISIBLE = (
    r"[^ \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\u00ad\u034f\u061c\u115f\u1160"
    r"\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u2800\u3164"
    r"\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    r"\U000e0000-\U000e0fff]"
)
_REFUSED, _VISIBLE = re.compile(LABEL_REFUSED), re.compile(LABEL_VISIBLE)


def label_ok(value: str) -> bool:
    """Whether pgfence.check_label accepts ``value`` as an owner label."""
    return (1 <= len(value) <= 256 and _REFUSED.search(value) is None
            and _VISIBLE.search(value) is not None)


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


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
_UNIT = {None: 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(value: str, what: str) -> float:
    """A duration given on the command line (``90``, ``90s``, ``15m``, ``2h``, ``7d``) in
    seconds (raises BadInput). The one parser of the CLI's durations (--timeout, --older-than)."""
    match = _DURATION.fullmatch(value.strip())
    if not match:
        raise BadInput(f"invalid {what} {value!r}: a number of seconds, or with a unit: "
                       "90s, 15m, 2h, 7d")
    return float(match.group(1)) * _UNIT[match.group(2)]


def interval(secs: float) -> str:
    """A duration in seconds as an SQL interval expression."""
    return f"({literal(repr(float(secs)))}::float8 * interval '1 second')"
