"""docs/supabase.md's pattern for edge functions that reach Postgres only through PostgREST
(supabase-js RPC): a user-schema SQL function that takes the lease id and fences and writes in
its one transaction, called the way PostgREST calls it: one transaction, `set local role
service_role`, the request's settings (request.jwt.claims, ...), named arguments."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from testkit.harness import Database, Session, sqlstate
from tests.support import acquired
from tests.test_docs import example, run_psql

SERVICE_ROLE = """
do $$
begin
  if not exists (select from pg_roles where rolname = 'service_role') then
    create role service_role nologin;   -- Supabase's role of requests with the service key
  end if;
end
$$;
"""


@pytest.fixture
def rpc_db(db: Database) -> Database:
    db.sql(SERVICE_ROLE)
    run_psql(db, example("docs/supabase.md", "supabase RPC example", "sql"))
    return db


def rpc(s: Session, function: str, **args: Any) -> Any:
    """One PostgREST call: its own transaction, the role and request settings made local."""
    claims = json.dumps({"role": "service_role", "iss": "supabase"})
    named = ", ".join(f"{k} => %s" for k in args)
    s.begin()
    try:
        s.run("set local role service_role")
        s.run("select set_config('request.jwt.claims', %s, true), "
              "set_config('request.method', 'POST', true), "
              "set_config('request.path', %s, true)", (claims, f"/rpc/{function}"))
        value = s.one(f"select app.{function}({named})", tuple(args.values()))
    except BaseException:
        s.rollback()
        raise
    s.commit()
    return value


def test_the_current_owner_writes_and_a_stale_one_writes_nothing(rpc_db: Database) -> None:
    a, b = rpc_db.session("a"), rpc_db.session("b")
    la = acquired(a.acquire("billing"))
    assert rpc(a, "record_invoice", lease_id=la.lease_id, amount=42) == 1
    rpc_db.expire(la)
    lb = acquired(b.acquire("billing"))
    assert sqlstate(lambda: rpc(a, "record_invoice", lease_id=la.lease_id, amount=7)) == "PF001"
    assert rpc(b, "record_invoice", lease_id=lb.lease_id, amount=8) is not None
    assert rpc_db.sql("select amount, generation from app.invoices order by id") == [
        (42, la.generation), (8, lb.generation)]


def test_a_fence_and_a_write_in_two_calls_is_refused(rpc_db: Database) -> None:
    s = rpc_db.session("s")
    lease = acquired(s.acquire("billing"))
    s.run("select pgfence.fence(%s)", (lease.lease_id,))       # one call ...
    assert sqlstate(lambda: s.run("insert into app.invoices (amount, generation) "
                                  "values (1, %s)", (lease.generation,))) == "PF007"  # ... another
    assert rpc_db.one("select count(*) from app.invoices") == 0


def test_negative_control_without_its_fence_a_stale_write_lands(rpc_db: Database) -> None:
    rpc_db.sql("select pgfence.unprotect('app.invoices')")
    rpc_db.install_mutant("rpc-example-unfenced")
    a, b = rpc_db.session("a"), rpc_db.session("b")
    la = acquired(a.acquire("billing"))
    rpc_db.expire(la)
    acquired(b.acquire("billing"))
    assert rpc(a, "record_invoice", lease_id=la.lease_id, amount=7) == 1, "the stale write landed"


def test_the_function_is_the_service_roles_only(rpc_db: Database) -> None:
    assert rpc_db.sql("select has_function_privilege('public', 'app.record_invoice(uuid,numeric)', "
                      "'execute')") == [(False,)]
    s = rpc_db.session("s")
    lease = acquired(s.acquire("billing"))
    assert rpc(s, "record_invoice", lease_id=uuid.UUID(str(lease.lease_id)), amount=1) == 1
