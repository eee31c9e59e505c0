"""The one way pgfence's Python connects to PostgreSQL (the client, and the test kit beside it)."""

from __future__ import annotations

from typing import Any

import psycopg

Connection = psycopg.Connection[tuple[Any, ...]]
AsyncConnection = psycopg.AsyncConnection[tuple[Any, ...]]


def _settings(name: str, autocommit: bool, timeout: int) -> dict[str, Any]:
    # No prepared statements (prepare_threshold=None): they live in one server session, and
    # behind a transaction pooler the next statement may run in another.
    return {"autocommit": autocommit, "prepare_threshold": None,
            "application_name": name[:63], "connect_timeout": timeout}


def connect(dsn: str, name: str, *, autocommit: bool = True, timeout: int = 10) -> Connection:
    """A connection that keeps no session state a transaction pooler could lose: no prepared
    statements (``prepare_threshold=None``), autocommit unless asked otherwise. ``name`` is its
    application_name, by which a backend is found through a pooler."""
    return psycopg.connect(dsn, **_settings(name, autocommit, timeout))


async def aconnect(dsn: str, name: str, *, autocommit: bool = True,
                   timeout: int = 10) -> AsyncConnection:
    """``connect`` for asyncio: a ``psycopg.AsyncConnection`` with the same settings."""
    return await psycopg.AsyncConnection.connect(dsn, **_settings(name, autocommit, timeout))
