"""No capability in an error message, a server log or a client's LeaseLost.

A lease id lets its holder fence, renew and release; an attempt id completes its task; an update
token or request id finishes a window. Errors land in the server log (on Supabase, readable by
every project member) and in the clients' logs. So every error names a lease by its resource and
generation, and any id by its digest (pgfence.ref), never the id itself. Each error path is
driven with the ids passed as parameters (as the clients pass them: the logged statement then
shows `$1`), and the server log, the messages and the Python client's LeaseLost are searched for
every id. The negative control is the mutant `pf001-names-the-lease-id` (the lease id back in
PF001's detail), and here the 0.1.0 message.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from pgfence.client import LeaseLost, Owner
from testkit.cluster import Cluster
from testkit.harness import Database
from tests.support import acquired


def errors_of(db: Database) -> tuple[list[str], list[str]]:
    """Drives every error that takes an id; their texts, and the ids given."""
    db.sql("select pgfence.register('r')")
    s = db.session("w")
    texts: list[str] = []
    ids: list[str] = []

    def refused(query: str, *params: object) -> None:
        ids.extend(str(p) for p in params if isinstance(p, uuid.UUID))
        with pytest.raises(psycopg.Error) as e:
            s.run(query, params)
        d = e.value.diag
        texts.extend(t for t in (d.message_primary, d.message_detail, d.message_hint) if t)

    old = acquired(s.acquire("r", ttl="1 minute"))
    s.drain(old)                                       # draining: fence refuses, renew works
    refused("select pgfence.fence(%s)", old.lease_id)
    new = acquired(s.acquire("r", ttl="1 minute"))
    s.release(new)
    refused("select pgfence.fence(%s)", new.lease_id)              # released
    refused("select pgfence.renew(%s, '1 minute')", new.lease_id)
    refused("select pgfence.fence(%s)", uuid.uuid4())              # unknown
    refused("select pgfence.release(%s)", uuid.uuid4())
    refused("select pgfence.complete(%s)", uuid.uuid4())           # not an attempt id
    refused("select pgfence.complete_many(array[%s, %s]::uuid[])", *[uuid.uuid4()] * 2)
    refused("select pgfence.acquire('r', 'w', '1 minute', %s)", uuid.uuid4())  # invocation
    refused("select * from pgfence.finish_update(%s)", uuid.uuid4())            # token
    request = uuid.uuid4()
    db.sql("select pgfence.register('r2')")
    token = db.one("select pgfence.prepare_update(array['r'], %s)", (request,))
    ids.append(str(token))
    refused("select pgfence.prepare_update(array['r2'], %s)", request)        # request id
    return texts, [*ids, str(old.lease_id)]


def test_no_error_and_no_log_line_names_an_id(db: Database, cluster: Cluster) -> None:
    log = Path(cluster.dir) / "server.log"
    start = log.stat().st_size
    texts, ids = errors_of(db)
    assert any("lease of r generation 1 is not current (draining)" in t for t in texts), texts
    assert any("lease ref " in t for t in texts), texts
    logged = log.read_bytes()[start:].decode(errors="replace")
    assert "lease of r generation" in logged, "the errors are in the server log"
    for id_ in ids:
        assert id_ not in logged, f"{id_} in the server log"
        assert [t for t in texts if id_ in t] == []


def test_the_clients_lease_lost_names_no_id(db: Database) -> None:
    db.sql("select pgfence.register('r')")
    owner = Owner(db.dsn, "r", ttl=30, renew_every=3600)
    assert owner.acquire()
    lease_id = str(owner.lease_id)
    db.sql("select pgfence.drain(%s)", (owner.lease_id,))
    with (psycopg.connect(db.dsn, autocommit=True) as conn, pytest.raises(LeaseLost) as lost,
          owner.fenced(conn)):
        pass
    assert "r generation 1" in str(lost.value) and lease_id not in str(lost.value)
    cause = lost.value.__cause__
    assert isinstance(cause, psycopg.Error) and lease_id not in str(cause)
    owner.release()


def test_negative_control_the_released_message_names_the_lease(db: Database) -> None:
    db.install_mutant("pf001-names-the-lease-id")
    texts, ids = errors_of(db)
    assert any(id_ in t for t in texts for id_ in ids)
