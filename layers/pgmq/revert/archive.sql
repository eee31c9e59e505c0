-- Revert pgfence_pgmq:archive: back to its definition of release 0.2.1

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The name of the contract, inlined into the caller's query (LANGUAGE sql, no SET, not
-- SECURITY DEFINER, every name qualified), so a call costs one function's SET, not two.
create or replace function pgfence_pgmq.archive(attempt_id uuid)
returns text
language sql
as $$
  select (pgfence_pgmq.finish(array[$1], 'archive'))[1];
$$;
comment on function pgfence_pgmq.archive(uuid) is
  'Archives the message of an attempt (as pgmq.archive): accepted while nobody read it again since, also after '
  'the lease expired; duplicate for a retry of an accepted attempt; stale (recorded in pgfence_pgmq.stale_results) '
  'otherwise. Raises 42501 where the caller''s role may not archive with pgmq itself, 22023 for an unknown attempt.';

-- The batch: one row per id, in the order given (plpgsql without SET, every name qualified:
-- its plan is kept, where a LANGUAGE sql function returning a set would be planned per call).
create or replace function pgfence_pgmq.archive_many(attempt_ids uuid[])
returns table (attempt_id uuid, outcome text)
language plpgsql
as $$
begin
  return query
  select u.attempt_id, u.outcome
    from rows from (pg_catalog.unnest($1),
                    pg_catalog.unnest(pgfence_pgmq.finish($1, 'archive'))) as u(attempt_id, outcome);
end
$$;
comment on function pgfence_pgmq.archive_many(uuid[]) is
  'archive for each attempt of attempt_ids, by its rule: one row per id, in the order given, outcome accepted, duplicate '
  'or stale; per queue one statement over all its messages. Raises 22023, changing nothing, for a NULL or empty '
  'array, more than 1000 ids, a NULL or repeated id, or any unknown attempt (pgfence.check_batch); 42501.';

revoke all on function pgfence_pgmq.archive(uuid), pgfence_pgmq.archive_many(uuid[]) from public;
grant execute on function pgfence_pgmq.archive(uuid), pgfence_pgmq.archive_many(uuid[]) to pgfence_worker;

commit;
