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
create function pgfence.check_batch(attempt_ids uuid[])
returns void
language plpgsql
stable
set search_path = pg_catalog, pg_temp
as $$
declare
  v_n int := cardinality(check_batch.attempt_ids);
  v_at int;
begin
  if check_batch.attempt_ids is null then
    perform pgfence.invalid_argument('attempt_ids', 'must not be NULL', null);
  end if;
  if v_n not between 1 and 1000 or array_ndims(check_batch.attempt_ids) <> 1 then
    perform pgfence.invalid_argument('attempt_ids', 'must be a one-dimensional array of 1 to 1000 attempt ids',
                                     format('%s ids', v_n));
  end if;
  v_at := array_position(check_batch.attempt_ids, null);
  if v_at is not null then
    perform pgfence.invalid_argument('attempt_ids', 'must not contain NULL', format('NULL at position %s', v_at));
  end if;
  if v_n > 1 and (select count(distinct u.a) from unnest(check_batch.attempt_ids) u(a)) <> v_n then
    perform pgfence.invalid_argument('attempt_ids', 'must not name an attempt twice',
      (select format('position %s repeats an earlier id', min(u.n))
         from unnest(check_batch.attempt_ids) with ordinality u(a, n)
        where exists (select from unnest(check_batch.attempt_ids) with ordinality e(a, n)
                       where e.a = u.a and e.n < u.n)));
  end if;
end
$$;
comment on function pgfence.check_batch(uuid[]) is
  'The check of a batch of attempt ids (complete_many, the layers'' *_many): 1 to 1000, one-dimensional, no NULL, '
  'none twice. Raises 22023.';
revoke all on function pgfence.check_batch(uuid[]) from public;

commit;
