-- Deploy pgfence:check_batch
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The one check of a batch of attempt ids, for complete_many and every layer's *_many: a
-- batch is a one-dimensional array of 1 to 1000 ids, none NULL, none twice. (Not
-- check_not_null: a polymorphic function, it costs more per call than every check here.)
-- No SET (every name qualified): a function's SET costs more per call than these checks.
create function pgfence.check_batch(attempt_ids uuid[])
returns void
language plpgsql
stable
as $$
declare
  v_n int := pg_catalog.cardinality(check_batch.attempt_ids);
  v_at int;
begin
  if check_batch.attempt_ids is null then
    perform pgfence.invalid_argument('attempt_ids', 'must not be NULL', null);
  end if;
  if v_n operator(pg_catalog.<) 1 or v_n operator(pg_catalog.>) 1000
     or pg_catalog.array_ndims(check_batch.attempt_ids) operator(pg_catalog.<>) 1 then
    perform pgfence.invalid_argument('attempt_ids', 'must be a one-dimensional array of 1 to 1000 attempt ids',
                                     pg_catalog.format('%s ids', v_n));
  end if;
  v_at := pg_catalog.array_position(check_batch.attempt_ids, null::pg_catalog.uuid);
  if v_at is not null then
    perform pgfence.invalid_argument('attempt_ids', 'must not contain NULL',
                                     pg_catalog.format('NULL at position %s', v_at));
  end if;
  if v_n operator(pg_catalog.>) 1
     and (select pg_catalog.count(distinct u.a) from pg_catalog.unnest(check_batch.attempt_ids) u(a))
         operator(pg_catalog.<>) v_n then
    perform pgfence.invalid_argument('attempt_ids', 'must not name an attempt twice',
      (select pg_catalog.format('position %s repeats an earlier id', pg_catalog.min(u.n))
         from pg_catalog.unnest(check_batch.attempt_ids) with ordinality u(a, n)
        where exists (select from pg_catalog.unnest(check_batch.attempt_ids) with ordinality e(a, n)
                       where e.a operator(pg_catalog.=) u.a and e.n operator(pg_catalog.<) u.n)));
  end if;
end
$$;
comment on function pgfence.check_batch(uuid[]) is
  'The check of a batch of attempt ids (complete_many, the layers'' *_many): 1 to 1000, one-dimensional, no NULL, '
  'none twice. Raises 22023.';
revoke all on function pgfence.check_batch(uuid[]) from public;

commit;
