-- Verify pgfence:lockdown
-- Fails (division by zero) if anyone but the owner and the pgfence roles holds a privilege.
select 1 / (count(*) = 0)::int
  from (select a.grantee, p.proowner as owner from pg_catalog.pg_proc p, aclexplode(p.proacl) a
         where p.pronamespace = 'pgfence'::regnamespace
        union all
        select a.grantee, c.relowner from pg_catalog.pg_class c, aclexplode(c.relacl) a
         where c.relnamespace = 'pgfence'::regnamespace) g
 where g.grantee <> g.owner
   and g.grantee not in (select oid from pg_catalog.pg_roles
                          where rolname in ('pgfence_worker', 'pgfence_operator', 'pgfence_monitor'));
