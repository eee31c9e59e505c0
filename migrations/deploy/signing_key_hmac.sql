-- Deploy pgfence:signing_key_hmac
-- requires: signing_key

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The signing key prepared for HMAC-SHA256 (RFC 2104): the key, zero-padded to the hash's
-- 64-byte block, XOR 0x36 (the inner pad), then XOR 0x5c (the outer pad), 128 bytes. Kept
-- beside the key so that pgfence.hmac is one expression, computed nowhere else. The key
-- itself stays: attempt ids minted by release 0.1.0 were signed with it directly.
alter table pgfence.signing_key add column hmac_key bytea;
do $$
declare
  v_key bytea := (select k.key from pgfence.signing_key k);
  v_pad bytea;
  v_inner bytea := '';
  v_outer bytea := '';
begin
  v_pad := pg_catalog.byteacat(v_key, pg_catalog.decode(
             pg_catalog.repeat('00', 64 operator(pg_catalog.-) pg_catalog.length(v_key)), 'hex'));
  for i in 0..63 loop
    v_inner := pg_catalog.byteacat(v_inner, pg_catalog.set_byte('\x00'::bytea, 0,
                 pg_catalog.get_byte(v_pad, i) operator(pg_catalog.#) 54));  -- 0x36
    v_outer := pg_catalog.byteacat(v_outer, pg_catalog.set_byte('\x00'::bytea, 0,
                 pg_catalog.get_byte(v_pad, i) operator(pg_catalog.#) 92));  -- 0x5c
  end loop;
  update pgfence.signing_key set hmac_key = pg_catalog.byteacat(v_inner, v_outer);
end
$$;
-- signing_key has one row.
-- squawk-ignore adding-not-nullable-field
alter table pgfence.signing_key alter column hmac_key set not null;

commit;
