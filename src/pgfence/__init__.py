"""pgfence: database-authorized ownership for PostgreSQL.

The protocol lives in SQL (schema ``pgfence``); this package holds the Python side: the
interleaving harness used by the tests and, later, the CLI and the reference worker client.
"""

__version__ = "0.1.0"
