-- Revert pgfence:ref: back to release 0.2.1's unkeyed digest

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.ref(id uuid)
returns text
language sql
immutable
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select left(encode(sha256(convert_to(ref.id::text, 'UTF8')), 'hex'), 12);
$$;
comment on function pgfence.ref(uuid) is
  'The digest by which errors name an id (a capability, never shown): the first 12 hex digits of SHA-256 of its text.';

commit;
