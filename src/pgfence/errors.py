"""Typed errors for the SQLSTATEs of docs/errors.md, the Deno client's classes (clients/deno/mod.ts)
under the same names.

``pgfence.client`` and ``pgfence.aio`` raise them for what the database refused; ``typed(e)``
turns any psycopg error of your own queries into one:

    try:
        owner.acquire()
    except ResourceDisabled:
        sys.exit(0)          # a worker started for a paused resource exits cleanly

Each is a ``psycopg.Error`` (and, for a standard SQLSTATE, psycopg's own class of it, e.g.
``psycopg.errors.SerializationFailure``), so ``except psycopg.Error`` and ``e.sqlstate`` keep
working. Its message, hint and detail are the database's with every uuid (a lease id, attempt id
or update token: capabilities) replaced by ``…``, so that it can be logged as it is; the
original error is not kept, for the same reason. A test ties the codes of docs/errors.md, this
module and the Deno client together (tests/test_errors.py).
"""

from __future__ import annotations

import psycopg
import psycopg.errors as pg
from psycopg.pq import DiagnosticField

from pgfence._core import redact

__all__ = ["ERROR_CLASSES", "DeadlockDetected", "InsufficientPrivilege", "InvalidArgument",
           "LeaseNotCurrent", "LockNotAvailable", "NoTransaction", "PgfenceError",
           "ResourceDisabled", "ResourceUnknown", "SerializationFailure", "TooManyStaleResults",
           "UnfencedWrite", "UpdateConflict", "UpdateTokenUnknown", "WrongInstalledState",
           "typed"]

_RETRYABLE = frozenset({"40001", "40P01", "55P03"})


class PgfenceError(psycopg.DatabaseError):
    """A database error with one of the SQLSTATEs of docs/errors.md, by its subclass; its
    ``diag`` (message, hint, detail) redacted."""

    @property
    def hint(self) -> str | None:
        """What to do about it, when the database said."""
        return self.diag.message_hint

    @property
    def detail(self) -> str | None:
        """The database's DETAIL (the refused value, the holder of a lock), when it gave one."""
        return self.diag.message_detail

    @property
    def retryable(self) -> bool:
        """Whether the same call may pass when tried again, after a pause (40001, 40P01, 55P03).
        The clients send 40001 and 40P01 again themselves; other errors are not guessed at."""
        return self.sqlstate in _RETRYABLE


class LeaseNotCurrent(PgfenceError):
    """PF001: the lease is unknown, released, superseded, draining (for fence) or expired."""


class ResourceUnknown(PgfenceError):
    """PF002: the resource is unknown."""


class ResourceDisabled(PgfenceError):
    """PF003: the resource is disabled: a worker started for a paused resource exits cleanly."""


class UpdateConflict(PgfenceError):
    """PF004: the resource is already in another open update window (or a request id was
    reused for another set)."""


class UpdateTokenUnknown(PgfenceError):
    """PF005: the update token is unknown."""


class UnfencedWrite(PgfenceError):
    """PF007: a write to a protected table in a transaction that did not fence its resource."""


class InvalidArgument(PgfenceError, pg.InvalidParameterValue):
    """22023: an invalid argument; the message names it."""


class NoTransaction(PgfenceError, pg.NoActiveSqlTransaction):
    """25P01: an install or upgrade file was run outside a transaction block; nothing changed."""


class SerializationFailure(PgfenceError, pg.SerializationFailure):
    """40001: a serialization failure; the transaction rolled back and may be run again."""


class DeadlockDetected(PgfenceError, pg.DeadlockDetected):
    """40P01: a deadlock; this transaction was chosen to roll back and may be run again."""


class InsufficientPrivilege(PgfenceError, pg.InsufficientPrivilege):
    """42501: the caller's role may not do this with pgmq or pgflow itself (a layer never widens
    their grants); the message names the role and the object."""


class TooManyStaleResults(PgfenceError, pg.ProgramLimitExceeded):
    """54000: a superseded attempt sent more than 10 different stale results: stop reporting."""


class WrongInstalledState(PgfenceError, pg.ObjectNotInPrerequisiteState):
    """55000: an install or upgrade found another release, or a prerequisite missing."""


class LockNotAvailable(PgfenceError, pg.LockNotAvailable):
    """55P03: a resource row stayed locked past ``lock_timeout``; the detail names the holder."""


ERROR_CLASSES: dict[str, type[PgfenceError]] = {
    "PF001": LeaseNotCurrent,
    "PF002": ResourceUnknown,
    "PF003": ResourceDisabled,
    "PF004": UpdateConflict,
    "PF005": UpdateTokenUnknown,
    "PF007": UnfencedWrite,
    "22023": InvalidArgument,
    "25P01": NoTransaction,
    "40001": SerializationFailure,
    "40P01": DeadlockDetected,
    "42501": InsufficientPrivilege,
    "54000": TooManyStaleResults,
    "55000": WrongInstalledState,
    "55P03": LockNotAvailable,
}
"""The error class of each SQLSTATE that docs/errors.md lists."""

def typed(e: BaseException) -> BaseException:
    """The typed error of a database error: a ``PgfenceError`` subclass for the SQLSTATEs of
    docs/errors.md (redacted); any other error as it is."""
    if isinstance(e, PgfenceError) or not isinstance(e, psycopg.Error):
        return e
    cls = ERROR_CLASSES.get(e.sqlstate or "")
    if cls is None:
        return e
    diag = e.diag
    fields = {DiagnosticField.MESSAGE_PRIMARY: diag.message_primary or str(e),
              DiagnosticField.MESSAGE_DETAIL: diag.message_detail,
              DiagnosticField.MESSAGE_HINT: diag.message_hint}
    info: dict[int, bytes | None] = {
        f: None if text is None else redact(text).encode() for f, text in fields.items()}
    info[DiagnosticField.SQLSTATE] = (e.sqlstate or "").encode()
    return cls(redact(fields[DiagnosticField.MESSAGE_PRIMARY] or ""), info=info)
