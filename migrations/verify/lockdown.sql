-- Verify pgfence:lockdown
-- Fails (division by zero) if anyone but the owners and the pgfence roles holds a privilege
-- that lockdown would revoke (the release's last change, pgfence.seal, runs it).
select 'pgfence.lockdown(name)'::regprocedure;
select 1 / (count(*) >= 0)::int from pgfence.foreign_grants('pgfence');
