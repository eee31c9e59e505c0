-- Deploy pgfence:signing_key
-- requires: schema

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- pgfence's signing key, readable by pgfence's owner alone. It signs what pgfence hands out
-- and must recognise later without storing it: the fence marker (a transaction proves to the
-- guard of protected tables that fence() succeeded in it) and attempt ids.
create table pgfence.signing_key (
  only_row boolean primary key default true check (only_row),
  key      bytea not null
);
insert into pgfence.signing_key (key)
values (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));
revoke all on table pgfence.signing_key from public;

-- A keyed hash (hex) of message: nobody without the key can compute or forge it. The caller
-- reads the key (once, however many messages it signs). A LANGUAGE sql function with no SET,
-- no table access and no SECURITY DEFINER is inlined into its caller's statement: an
-- expression, not a function call that is parsed and planned again by every new executor.
-- Without a pinned search_path, every name in it is qualified (pgspot checks that).
create function pgfence.sign(message text, key bytea)
returns text
language sql
stable  -- convert_to is stable; a function declared more strictly than its body is not inlined
as $$
  select pg_catalog.encode(pg_catalog.sha256(pg_catalog.byteacat(sign.key, pg_catalog.convert_to(sign.message, 'UTF8'))),
                           'hex');
$$;
revoke all on function pgfence.sign(text, bytea) from public;

commit;
