-- Revert pgfence_pgmq:attempts_order

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

create function pgfence_pgmq.mark(queue_table text, lease_id uuid)
returns text
language sql
as $$
  select pgfence.mark_fenced(l.resource, k.hmac_key)
    from pgfence.leases l, pgfence.signing_key k
   where l.lease_id operator(pg_catalog.=) mark.lease_id
     and exists (select from pgfence.protections p
                  where p.tbl operator(pg_catalog.=)
                        pg_catalog.to_regclass(pg_catalog.format('pgmq.%I', mark.queue_table)));
$$;
revoke all on function pgfence_pgmq.mark(text, uuid) from public;

create or replace view pgfence_pgmq.reads as
select pgfence.capability_ref(a.attempt_id) as attempt_ref, pgfence.capability_ref(a.lease_id) as lease_ref,
       l.resource, a.queue, a.msg_id, a.read_ct, a.enqueued_at, a.read_at, a.outcome, a.finished_at
  from pgfence_pgmq.attempts a
  left join pgfence.leases l on l.lease_id = a.lease_id;

drop index pgfence_pgmq.attempts_message;
alter table pgfence_pgmq.attempts drop column read_order;
drop sequence pgfence_pgmq.read_order;

commit;
