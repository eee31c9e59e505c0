"""Update windows (prepare -> status -> finish) under interleavings: exact-state restore (I6),
lost-response retries, overlapping operators, workers starting during prepare, load."""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import psycopg

from pgfence.connection import connect
from testkit.harness import HANG, Database, sqlstate
from tests.support import acquired


def enabled_states(db: Database) -> dict[str, bool]:
    return dict(db.sql("select resource, enabled from pgfence.resources"))


# --------------------------------------------------------------------------------------------
# A whole window over a mixture of enabled and disabled resources


def deploy_window(db: Database) -> dict[str, Any]:
    db.sql("select pgfence.register('mailer'), pgfence.register('billing', false), "
           "pgfence.register('search'), pgfence.register('bystander')")
    before = enabled_states(db)
    for q in ("mail", "other"):
        for _ in range(3):
            db.sql("select pgfence.enqueue(%s)", (q,))
    old, bystander = db.session("old-mailer"), db.session("bystander")
    lm = acquired(old.acquire("mailer"))
    ((attempt,),) = old.run("select attempt_id from pgfence.claim(%s, 'mail')", (lm.lease_id,))
    lo = acquired(bystander.acquire("bystander"))

    operator = db.session("operator")
    token = operator.one("select pgfence.prepare_update(%s, %s)",
                         (["mailer", "billing", "search"], uuid.uuid4()))
    verdicts = [dict(operator.run("select resource, verdict from pgfence.update_status(%s)",
                                  (token,)))]
    # The old worker learns it is draining, stops claiming and finishes what it holds.
    assert old.renew(lm)[1] == "draining"
    refused_claim = sqlstate(lambda: old.run("select pgfence.claim(%s, 'mail')", (lm.lease_id,)))
    old.one("select pgfence.complete(%s)", (attempt,))
    old.release(lm)
    # Outside the window nothing paused: the bystander claims, recovery runs.
    bystander_claims = len(bystander.run("select * from pgfence.claim(%s, 'other', 3)",
                                         (lo.lease_id,)))
    db.sql("select pgfence.requeue_expired()")
    verdicts.append(dict(operator.run("select resource, verdict from pgfence.update_status(%s)",
                                      (token,))))
    # ... new code is deployed here ...
    outcomes = dict((r, o) for r, _, o in operator.run(
        "select * from pgfence.finish_update(%s)", (token,)))
    return {"before": before, "after": enabled_states(db), "verdicts": verdicts,
            "refused_claim": refused_claim, "bystander_claims": bystander_claims,
            "outcomes": outcomes}


def test_window_restores_exactly_what_was_there(any_db: Database) -> None:
    out = deploy_window(any_db)
    assert out["after"] == out["before"]
    assert out["outcomes"] == {"billing": "kept_disabled", "mailer": "restored",
                               "search": "restored"}
    assert out["verdicts"][0]["mailer"] == "draining"
    assert out["verdicts"][1] == {"billing": "drained", "mailer": "drained", "search": "drained"}
    assert out["refused_claim"] == "PF001"
    assert out["bystander_claims"] == 3


def test_negative_control_finish_that_always_enables(db: Database) -> None:
    # The guide's bug from the seed: restore enabled = true whatever it was.
    db.install_mutant("finish-always-enables")
    out = deploy_window(db)
    assert out["after"] != out["before"] and out["after"]["billing"] is True


# --------------------------------------------------------------------------------------------
# Lost response: prepare committed, the operator never heard; the retry must not save `false`


def prepare_with_lost_response(db: Database) -> tuple[dict[str, bool], dict[str, bool]]:
    db.sql("select pgfence.register('a'), pgfence.register('b', false)")
    before = enabled_states(db)
    request_id = uuid.uuid4()
    lost = connect(db.server_dsn, "lost")
    lost.pgconn.send_query(
        f"select pgfence.prepare_update(array['a', 'b'], '{request_id}')".encode())
    lost.pgconn.flush()
    lost.close()
    db.wait_until("select exists (select from pgfence.open_updates)")
    operator = db.session("operator")
    token = operator.one("select pgfence.prepare_update(%s, %s)", (["b", "a"], request_id))
    operator.run("select * from pgfence.finish_update(%s)", (token,))
    return before, enabled_states(db)


def test_retry_after_lost_response_keeps_the_saved_state(any_db: Database) -> None:
    before, after = prepare_with_lost_response(any_db)
    assert after == before
    assert any_db.one("select count(*) from pgfence.updates") == 1


def test_negative_control_prepare_without_request_id(db: Database) -> None:
    # A naive prepare: no request_id lookup, no overlap rule. The retry opens a second window
    # that saves the temporary false, and finishing it restores false.
    db.install_mutant("prepare-ignores-request-id")
    db.sql("drop index pgfence.update_items_one_open")
    before, after = prepare_with_lost_response(db)
    assert after != before and after["a"] is False


def reused_request_id_at_once(db: Database) -> str | None:
    """Two operators reuse one request_id at the same moment for sets that share nothing."""
    db.sql("select pgfence.register('x'), pgfence.register('y')")
    one, two = db.session("one"), db.session("two")
    request_id = uuid.uuid4()
    one.begin()
    one.run("select pgfence.prepare_update(array['x'], %s)", (request_id,))
    step = two.start("select pgfence.prepare_update(array['y'], %s)", (request_id,))
    assert step.settle()
    one.commit()
    return sqlstate(step.result)


def test_request_id_reused_at_once_for_another_set(any_db: Database) -> None:
    assert reused_request_id_at_once(any_db) == "PF004"
    assert enabled_states(any_db) == {"x": False, "y": True}


def test_negative_control_request_id_not_claimed_first(db: Database) -> None:
    db.install_mutant("prepare-request-id-unclaimed")
    assert reused_request_id_at_once(db) == "23505"


# --------------------------------------------------------------------------------------------
# Two operators preparing overlapping sets, locking in opposite orders, never deadlock


def opposite_order_prepares(db: Database) -> list[str | None]:
    db.sql("select pgfence.register('a'), pgfence.register('y')")
    holder, one, two = db.session("holder"), db.session("one"), db.session("two")
    holder.begin()
    holder.run("select pgfence.set_enabled('a', true)")      # holds a's row
    first = one.start("select pgfence.prepare_update(array['a', 'y'], %s)", (uuid.uuid4(),))
    assert first.settle()
    second = two.start("select pgfence.prepare_update(array['y', 'a'], %s)", (uuid.uuid4(),))
    assert second.settle()
    holder.commit()
    return [sqlstate(step.result) for step in (first, second)]


def test_overlapping_prepares_wait_then_conflict_never_deadlock(any_db: Database) -> None:
    assert opposite_order_prepares(any_db) == [None, "PF004"]


def test_negative_control_locking_in_the_callers_order_deadlocks(db: Database) -> None:
    db.install_mutant("prepare-locks-in-callers-order")
    assert "40P01" in opposite_order_prepares(db)


# --------------------------------------------------------------------------------------------
# A worker starting while the operator prepares


def test_worker_starting_during_prepare(any_db: Database) -> None:
    any_db.sql("select pgfence.register('fn')")
    supervisor, worker, operator = (any_db.session(n) for n in ("supervisor", "worker", "operator"))
    invocation = supervisor.one("select pgfence.request_start('fn')")
    # The worker is mid-acquire (its transaction open) when the operator prepares.
    worker.begin()
    lease = acquired(worker.acquire("fn", invocation_id=invocation))
    prep = operator.start("select pgfence.prepare_update(array['fn'], %s)", (uuid.uuid4(),))
    assert prep.settle() and prep.blocked_by
    worker.commit()
    token = prep.one()
    # Prepare saw the new owner and drained it; nothing is left active behind its back.
    assert any_db.one("select status from pgfence.lease_status where generation = %s",
                      (lease.generation,)) == "draining"
    # A second start request during the window is refused, and a late worker exits cleanly.
    assert supervisor.one("select pgfence.request_start('fn')") is None
    assert sqlstate(lambda: worker.acquire("fn")) == "PF003"
    worker.release(lease)
    assert operator.run("select verdict from pgfence.update_status(%s)", (token,)) == [("drained",)]


def test_earlier_drains_are_preserved(any_db: Database) -> None:
    any_db.sql("select pgfence.register('fn')")
    any_db.sql("select pgfence.enqueue('q')")
    old = any_db.session("old")
    lease = acquired(old.acquire("fn"))
    ((attempt,),) = old.run("select attempt_id from pgfence.claim(%s, 'q')", (lease.lease_id,))
    any_db.sql("select pgfence.deprecate('fn')")             # drained before the window
    token = any_db.one("select pgfence.prepare_update(array['fn'], %s)", (uuid.uuid4(),))
    any_db.sql("select * from pgfence.finish_update(%s)", (token,))
    # The window neither re-activated nor ended the old worker's drain.
    assert any_db.one("select status from pgfence.lease_status") == "draining"
    assert old.renew(lease)[1] == "draining"
    assert old.one("select pgfence.complete(%s)", (attempt,)) == "accepted"


# --------------------------------------------------------------------------------------------
# Operators and workers at once: no deadlock, no lost state


def operators_and_workers(db: Database, rounds: int = 25) -> tuple[list[str], dict[str, bool],
                                                                     dict[str, bool]]:
    names = [f"r{i}" for i in range(6)]
    for i, name in enumerate(names):
        db.sql("select pgfence.register(%s, %s)", (name, i % 3 != 0))
    before = enabled_states(db)
    errors: list[str] = []
    lock = threading.Lock()

    def note(e: psycopg.Error) -> None:
        with lock:
            errors.append(e.sqlstate or "?")

    def operator(seed: int) -> None:
        rnd = random.Random(seed)
        with connect(db.dsn, f"op{seed}") as conn:
            for _ in range(rounds):
                chosen = rnd.sample(names, rnd.randint(1, 4))
                try:
                    token = conn.execute("select pgfence.prepare_update(%s, %s)",
                                         (chosen, uuid.uuid4())).fetchone()[0]  # type: ignore[index]
                    conn.execute("select * from pgfence.finish_update(%s)", (token,))
                except psycopg.Error as e:
                    if e.sqlstate != "PF004":
                        note(e)

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        with connect(db.dsn, f"w{seed}") as conn:
            for _ in range(rounds):
                try:
                    row = conn.execute("select lease_id from pgfence.acquire(%s, %s, '30 s')",
                                       (rnd.choice(names), f"w{seed}")).fetchone()
                    if row and row[0]:
                        conn.execute("select pgfence.release(%s)", (row[0],))
                    conn.execute("select pgfence.request_start(%s)", (rnd.choice(names),))
                except psycopg.Error as e:
                    if e.sqlstate != "PF003":
                        note(e)

    threads = ([threading.Thread(target=operator, args=(i,)) for i in range(3)]
               + [threading.Thread(target=worker, args=(10 + i,)) for i in range(3)])
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=HANG)
        assert not t.is_alive()
    return errors, before, enabled_states(db)


def test_operators_and_workers_at_once(any_db: Database) -> None:
    errors, before, after = operators_and_workers(any_db)
    assert errors == []
    assert after == before
    assert any_db.one("select count(*) from pgfence.open_updates") == 0


def test_negative_control_load_with_a_finish_that_always_enables(db: Database) -> None:
    db.install_mutant("finish-always-enables")
    _, before, after = operators_and_workers(db)
    assert after != before
