"""The one way pgfence's Python connects to PostgreSQL (the client, and the test kit beside it)."""

from __future__ import annotations

from typing import Any

import psycopg

Connection = psycopg.Connection[tuple[Any, ...]]


def connect(dsn: str, name: str, *, autocommit: bool = True, timeout: int = 10) -> Connection:
    """A connection that keeps no session state a transaction pooler could lose: no prepared
    statements (``prepare_threshold=None``), autocommit unless asked otherwise. ``name`` is its
    application_name, by which a backend is found through a pooler."""
    return psycopg.connect(dsn, autocommit=autocommit, prepare_threshold=None,
                           application_name=name[:63], connect_timeout=timeout)
