"""The one way pgfence's Python connects to PostgreSQL (the client, and the test kit beside it)."""

from __future__ import annotations

import ipaddress
from typing import Any

import psycopg

Connection = psycopg.Connection[tuple[Any, ...]]
AsyncConnection = psycopg.AsyncConnection[tuple[Any, ...]]

# Where the connection ends on the server: its address and port (NULL over a unix socket), the
# server's port, and the directories of its sockets. A connection is direct when the client
# reached that very address and port, or a socket in one of those directories with that port.
# A pooler or proxy in between (PgBouncer, Supavisor, a port mapping) connects from elsewhere.
# unix_socket_directories is readable by superusers and pg_read_all_settings only: for any
# other role over a socket it stays NULL, and the connection counts as not direct.
_ENDPOINT = ("select host(inet_server_addr()), inet_server_port(), "
             "current_setting('port')::int, "
             "case when inet_server_addr() is null and pg_has_role('pg_read_all_settings', "
             "'usage') then current_setting('unix_socket_directories') end")  # a superuser too
PREPARE_AFTER = 0   # psycopg's prepare_threshold on a direct connection: from the first call


def _settings(name: str, autocommit: bool, timeout: int) -> dict[str, Any]:
    # No prepared statements here (prepare_threshold=None): they live in one server session,
    # and behind a transaction pooler the next statement may run in another, where a statement
    # of the same name may be someone else's. ``prepare`` turns them on where that cannot be.
    return {"autocommit": autocommit, "prepare_threshold": None,
            "application_name": name[:63], "connect_timeout": timeout}


def direct(info: psycopg.ConnectionInfo, endpoint: tuple[Any, ...]) -> bool:
    """Whether the connection ``info`` describes reaches the server itself, by what the server
    says of the connection's other end (``_ENDPOINT``): the same address and port, or a socket
    of the server's. Anything in between makes it false (prepared statements off)."""
    addr, port, server_port, socket_dirs = endpoint
    if info.port != server_port:
        return False
    if addr is None:    # a unix socket: in a directory the server listens in
        if socket_dirs is None:     # not the caller's to read: unsure, so not direct
            return False
        dirs = {d.strip() for d in str(socket_dirs).split(",")}
        return info.host in dirs
    try:
        return ipaddress.ip_address(info.hostaddr) == ipaddress.ip_address(addr) and \
            port == info.port
    except ValueError:
        return False


def _prepare(conn: Connection | AsyncConnection, prepare: bool | None,
             endpoint: tuple[Any, ...] | None) -> None:
    if prepare or (prepare is None and endpoint is not None and direct(conn.info, endpoint)):
        conn.prepare_threshold = PREPARE_AFTER


def connect(dsn: str, name: str, *, autocommit: bool = True, timeout: int = 10,
            prepare: bool | None = False) -> Connection:
    """A connection that keeps no session state a transaction pooler could lose, autocommit
    unless asked otherwise. ``name`` is its application_name, by which a backend is found
    through a pooler. ``prepare``: False (the default) never prepares a statement; True always
    does (a pooler that keeps prepared statements itself, as PgBouncer 1.21+ with
    max_prepared_statements); None prepares only where the connection is direct (``direct``),
    asking the server once."""
    conn = psycopg.connect(dsn, **_settings(name, autocommit, timeout))
    endpoint = None
    if prepare is None:
        endpoint = conn.execute(_ENDPOINT).fetchone()
        if not autocommit:
            conn.rollback()
    _prepare(conn, prepare, endpoint)
    return conn


async def aconnect(dsn: str, name: str, *, autocommit: bool = True, timeout: int = 10,
                   prepare: bool | None = False) -> AsyncConnection:
    """``connect`` for asyncio: a ``psycopg.AsyncConnection`` with the same settings."""
    conn = await psycopg.AsyncConnection.connect(dsn, **_settings(name, autocommit, timeout))
    endpoint = None
    if prepare is None:
        endpoint = await (await conn.execute(_ENDPOINT)).fetchone()
        if not autocommit:
            await conn.rollback()
    _prepare(conn, prepare, endpoint)
    return conn
