-- Revert pgfence:checks: back to its definition of release 0.1.0

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- Resource and queue names: printable, no spaces, so they survive logs, shells and the CLI.
-- check_name, check_interval and check_not_null run on every renew, fence and claim. They have
-- no SET clause, which would cost a save, a restore and a recomputed search path on every
-- call; instead every name in them is qualified (pgspot checks that).
create or replace function pgfence.check_name(arg text, value text)
returns void
language plpgsql
as $$
begin
  if value is null or value operator(pg_catalog.!~) '^[A-Za-z0-9_][A-Za-z0-9_.:@/-]{0,127}$' then
    perform pgfence.invalid_argument(arg,
      'must be 1 to 128 characters from A-Z a-z 0-9 _ . : @ / - and not start with punctuation',
      value);
  end if;
end
$$;

-- Owners are caller-chosen labels (an execution id, a hostname): free text, bounded.
create or replace function pgfence.check_label(arg text, value text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  if value is null or length(value) not between 1 and 256 or value ~ '[[:cntrl:]]' then
    perform pgfence.invalid_argument(arg, 'must be 1 to 256 characters without control characters', value);
  end if;
end
$$;

-- Leases, visibility windows and invocations: more than zero, at most a day. A longer lease
-- is a lease nobody can take over in practice.
create or replace function pgfence.check_interval(arg text, value interval)
returns void
language plpgsql
as $$
begin
  if value is null or value operator(pg_catalog.<=) '0'::pg_catalog.interval
     or value operator(pg_catalog.>) '1 day'::pg_catalog.interval then
    perform pgfence.invalid_argument(arg, 'must be more than 0 and at most 1 day', value::pg_catalog.text);
  end if;
end
$$;

create or replace function pgfence.check_not_null(arg text, value anyelement)
returns void
language plpgsql
as $$
begin
  if value is null then
    perform pgfence.invalid_argument(arg, 'must not be NULL', null);
  end if;
end
$$;

revoke all on function pgfence.check_name(text, text) from public;
revoke all on function pgfence.check_label(text, text) from public;
revoke all on function pgfence.check_interval(text, interval) from public;
revoke all on function pgfence.check_not_null(text, anyelement) from public;
-- pgfence.protect runs as the operator and checks its arguments with these.
grant execute on function pgfence.check_name(text, text), pgfence.check_not_null(text, anyelement)
   to pgfence_operator;
-- Release 0.2.0's predicate, which check_interval of 0.1.0 does not ask.
drop function pgfence.interval_ok(interval);

commit;
