-- Deploy pgfence:hmac
-- requires: signing_key_hmac

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- HMAC-SHA256 (RFC 2104) of message, hex, under the prepared key (signing_key.hmac_key: inner
-- pad, then outer pad). It signs the fence marker and attempt ids. Inlined like pgfence.sign,
-- and for the same reason every name in it is qualified.
create function pgfence.hmac(message text, key bytea)
returns text
language sql
stable  -- convert_to is stable; a function declared more strictly than its body is not inlined
as $$
  select pg_catalog.encode(
           pg_catalog.sha256(pg_catalog.byteacat(
             pg_catalog.substr(hmac.key, 65, 64),
             pg_catalog.sha256(pg_catalog.byteacat(pg_catalog.substr(hmac.key, 1, 64),
                                                   pg_catalog.convert_to(hmac.message, 'UTF8'))))),
           'hex');
$$;
revoke all on function pgfence.hmac(text, bytea) from public;

commit;
