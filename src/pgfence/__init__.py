"""pgfence: database-authorized ownership for PostgreSQL.

The protocol lives in SQL (schema ``pgfence``); this package holds the Python side:

- ``pgfence.client``: the reference client (``Owner``, ``Worker``, ``Leader``) on threads;
- ``pgfence.aio``: the same over asyncio;
- ``pgfence.errors``: the class of each SQLSTATE of docs/errors.md, which both raise;
- ``pgfence.conformance``: ``python -m pgfence.conformance``, the HTTP check of a control-plane
  server against docs/control-plane.md's leader recipe, in any language;
- ``pgfence.connection``: the one way both connect (no session state, pooler-safe);
- ``pgfence.cli``: the ``pgfence`` command (update windows, install, upgrade), over psycopg
  or the Supabase CLI (``pgfence.transport``), with the schema's SQL files it carries
  (``pgfence.releases``, ``pgfence.sql``).

See docs/python.md for the clients and docs/cli.md for the command.
"""

__version__ = "0.3.1"
