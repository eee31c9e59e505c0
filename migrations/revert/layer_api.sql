-- Revert pgfence:layer_api from 0.3.1: mark_lease as 0.3.0 released it (its comment, with the
-- kind that pgfence:kinds gave it, is kept by create or replace; the other functions are as
-- released).

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create or replace function pgfence.mark_lease(lease_id uuid, tbl regclass default null)
returns text
language sql
as $$
  select pgfence.mark_fenced(l.resource, k.hmac_key)
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id operator(pg_catalog.=) mark_lease.lease_id
     and (mark_lease.tbl is null
          or exists (select from pgfence.protections p where p.tbl operator(pg_catalog.=) mark_lease.tbl));
$$;

commit;
