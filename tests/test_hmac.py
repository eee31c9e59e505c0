"""Signatures are HMAC-SHA256 (RFC 2104) under pgfence's key: attempt ids and the fence
marker are checked here against Python's own hmac module, and the negative control (the
pre-0.2.0 sha256(key || message)) does not match. Ids minted by release 0.1.0 still finish
their task after an upgrade (their scheme digit says how they were signed)."""

from __future__ import annotations

import hashlib
import hmac

from testkit.harness import Database


def expected(db: Database, message: str) -> str:
    key = bytes(db.one("select key from pgfence.signing_key"))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def attempt(db: Database) -> tuple[str, str]:
    """A claimed task's attempt id, and what RFC 2104 says its signature must be."""
    db.sql("select pgfence.register('r')")
    db.sql("select pgfence.enqueue('q')")
    lease = db.one("select lease_id from pgfence.acquire('r', 'a', '1 hour')")
    task, number, attempt_id = db.sql(
        "select task_id, attempt, attempt_id from pgfence.claim(%s, 'q')", (lease,))[0]
    return str(attempt_id), expected(db, f"attempt {task} {number} {lease}")


def test_attempt_ids_are_signed_with_hmac_sha256(db: Database) -> None:
    attempt_id, mac = attempt(db)
    hexdigits = attempt_id.replace("-", "")
    assert hexdigits[16] == "9", "the scheme digit names HMAC"
    assert hexdigits[17:] == mac[:15]


def test_negative_control_the_old_keyed_hash_does_not_match(db: Database) -> None:
    db.install_mutant("hmac-keyed-hash")
    attempt_id, mac = attempt(db)
    assert attempt_id.replace("-", "")[17:] != mac[:15]


def test_the_fence_marker_is_an_hmac(db: Database) -> None:
    db.sql("select pgfence.register('r')")
    a = db.session("a")
    lease = a.acquire("r")
    assert lease is not None
    a.begin()
    a.fence(lease)
    xid, marker = a.run("select pg_current_xact_id()::text, current_setting('pgfence.fenced')")[0]
    a.rollback()
    assert marker.strip("\n") == expected(db, f"fence {xid} r")


def test_an_attempt_id_of_release_0_1_0_still_finishes_its_task(db: Database) -> None:
    db.sql("select pgfence.register('r')")
    db.sql("select pgfence.enqueue('q')")
    lease = db.one("select lease_id from pgfence.acquire('r', 'a', '1 hour')")
    task, number = db.sql("select task_id, attempt from pgfence.claim(%s, 'q')", (lease,))[0]
    # The id release 0.1.0 minted for this claim (a claim made before the upgrade).
    old = db.one("select pgfence.attempt_uuid_0_1(%s, %s, %s, k.key) from pgfence.signing_key k",
                 (task, number, lease))
    assert str(old).replace("-", "")[16] == "8"
    assert db.one("select pgfence.extend(%s, '1 minute')", (old,)) is not None
    assert db.one("select pgfence.complete(%s, '{}')", (old,)) == "accepted"
    assert db.one("select pgfence.complete(%s, '{}')", (old,)) == "duplicate"
