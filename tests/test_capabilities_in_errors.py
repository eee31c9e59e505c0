"""No capability in an error message, a server log or a client's LeaseLost.

A lease id lets its holder fence, renew and release; an attempt id completes its task; an update
token or request id finishes a window. Errors land in the server log (on Supabase, readable by
every project member) and in the clients' logs. So every error names a lease by its resource and
generation, and any id by its digest (pgfence.ref), never the id itself. Each error path is
driven with the ids passed as parameters (as the clients pass them: the logged statement then
shows `$1`), and the server log, the messages and the Python client's LeaseLost are searched for
every id. The negative control is the mutant `pf001-names-the-lease-id` (the lease id back in
PF001's detail), and here the 0.1.0 message.

A reference is keyed (issue 43 item 5): the first 12 hex digits of an HMAC-SHA256 under the
install's signing key (pgfence.capability_ref's), checked against Python's own hmac, so
nobody without the key can test a guess of an id against a log line (a pgmq attempt id has 60
random bits). No run of 8 of an id's hex digits appears anywhere either (item 8 d: only the
reference's format was checked). Negative controls: release 0.2.1's unkeyed SHA-256, and a
reference cut from the id itself.
"""

from __future__ import annotations

import hashlib
import hmac
import re
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




def keyed(db: Database, id_: str) -> str:
    """What the reference of an id must be: HMAC-SHA256 under the install's key, computed here."""
    key = bytes(db.one("select key from pgfence.signing_key"))
    return hmac.new(key, f"ref {id_}".encode(), hashlib.sha256).hexdigest()[:12]


def references(db: Database, cluster: Cluster) -> tuple[set[str], dict[str, str], str]:
    """The references the errors named (as the client got them: the server log also holds
    other tests' errors), the keyed reference of each id given, and the errors' texts with the
    server log's lines since, all in one."""
    log = Path(cluster.dir) / "server.log"
    start = log.stat().st_size
    texts, ids = errors_of(db)
    said = "\n".join([*texts, log.read_bytes()[start:].decode(errors="replace")])
    named = set(re.findall(r"\bref ([0-9a-f]{12})\b", "\n".join(texts)))
    return named, {keyed(db, i): i for i in ids}, said


def pieces(id_: str) -> set[str]:
    """Every run of 8 of an id's hex digits."""
    digits = id_.replace("-", "")
    return {digits[k:k + 8] for k in range(len(digits) - 7)}


def test_a_reference_is_keyed_and_shows_no_part_of_the_id(db: Database, cluster: Cluster) -> None:
    named, refs, said = references(db, cluster)
    assert len(named) >= 4 and named <= set(refs), (named, refs)
    assert db.one("select pgfence.ref(%s)", (uuid.UUID(next(iter(refs.values()))),)) in refs
    flat = said.replace("-", "")
    for id_ in refs.values():
        assert not [p for p in pieces(id_) if p in flat], f"part of {id_} is in an error"


def test_negative_control_the_unkeyed_reference_is_not_the_keyed_one(
        db: Database, cluster: Cluster) -> None:
    db.install_mutant("ref-unkeyed")
    named, refs, _ = references(db, cluster)
    assert named and not named & set(refs)
    unkeyed = {hashlib.sha256(i.encode()).hexdigest()[:12] for i in refs.values()}
    assert named <= unkeyed, "anyone can compute it from a guess"


def test_negative_control_a_reference_cut_from_the_id_shows_it(db: Database,
                                                             cluster: Cluster) -> None:
    db.install_mutant("ref-from-the-id")
    _, refs, said = references(db, cluster)
    flat = said.replace("-", "")
    assert any(p in flat for id_ in refs.values() for p in pieces(id_))
