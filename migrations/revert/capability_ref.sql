-- Revert pgfence:capability_ref: back to release 0.2.1's, called on NULL input

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

alter function pgfence.capability_ref(uuid) called on null input;
comment on function pgfence.capability_ref(uuid) is
  'A non-reversible reference to a lease id or attempt id (16 hex digits of an HMAC under the signing key): '
  'what monitoring views show instead of the capability.';

commit;
