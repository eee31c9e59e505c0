-- Deploy pgfence:checks
-- requires: errors

begin;
-- While installing, names resolve in pg_catalog only, so no object in a schema on the
-- installer's search_path can stand in for a built-in (pgspot); and a lock wait behind live
-- transactions fails the deploy instead of queueing every later locker behind it (squawk).
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

-- The first change after release 0.1.0: Sqitch runs it only on a database its registry says
-- holds 0.1.0. One that says another release was installed or upgraded by another path (the
-- one file, its upgrade files, the CLI): deploying over it would fail half-way, and Sqitch's
-- automatic revert would then drop what the other path installed. Refused before anything
-- changes; the fix is to record what the database holds. (In sql/pgfence.sql version() does
-- not exist yet at this point; in the upgrade from 0.1.0 it says 0.1.0.)
do $guard$
declare
  v_found text;
begin
  if pg_catalog.to_regprocedure('pgfence.version()') is not null then
    execute 'select pgfence.version()' into v_found;
    if v_found is distinct from '0.1.0' then
      raise exception 'pgfence: this database holds pgfence %, not 0.1.0 as the Sqitch registry '
                      'says: it was installed or upgraded without Sqitch; nothing was deployed',
                      v_found
        using errcode = '55000',
              hint = pg_catalog.format('record what it holds instead of deploying it: '
                                       'sqitch deploy --log-only --to @v%s, then sqitch verify '
                                       '(docs/upgrading.md, "Moving onto Sqitch")', v_found);
    end if;
  end if;
end
$guard$;

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

-- Owners are caller-chosen labels (an execution id, a hostname): free text, bounded, and shown
-- to operators as it is. So no control characters (Cc), no line or paragraph separators (Zl,
-- Zp), no format characters (Cf: bidi overrides and isolates, zero-width spaces and joiners,
-- the byte order mark, tags), which would make one label look like another or reorder a line;
-- and at least one visible character: one that is not white space, not a default-ignorable
-- code point (Unicode's DerivedCoreProperties: variation selectors, the Hangul fillers U+115F,
-- U+1160, U+3164, U+FFA0, the combining grapheme joiner, tags) and not U+2800 BRAILLE
-- PATTERN BLANK, all of which render blank. One rule, the same text in Python
-- (pgfence.sql.LABEL_REFUSED, LABEL_VISIBLE: tests/test_labels.py checks both, and that they
-- judge alike).
create or replace function pgfence.check_label(arg text, value text)
returns void
language plpgsql
set search_path = pg_catalog, pg_temp
as $$
begin
  if value is null or length(value) not between 1 and 256
     or value ~ '[\u0001-\u001f\u007f-\u009f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]'
     or value !~ '[^ \u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff]' then
    perform pgfence.invalid_argument(arg,
      '1 to 256 characters, at least one visible, without control, format (Cf) or separator (Zl, Zp) characters',
      value);
  end if;
end
$$;

create or replace function pgfence.interval_ok(value interval)
returns boolean
language sql
immutable
as $$
  select interval_ok.value is not null
     and pg_catalog.date_part('month', interval_ok.value) operator(pg_catalog.=) 0
     and pg_catalog.date_part('year', interval_ok.value) operator(pg_catalog.=) 0
     and interval_ok.value operator(pg_catalog.>) '0'::pg_catalog.interval
     and interval_ok.value operator(pg_catalog.<=) '1 day'::pg_catalog.interval;
$$;

create or replace function pgfence.check_interval(arg text, value interval)
returns void
language plpgsql
as $$
begin
  if not pgfence.interval_ok(value) then
    perform pgfence.invalid_argument(arg, 'must be more than 0 and at most 1 day, without months or years', value::pg_catalog.text);
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
revoke all on function pgfence.check_interval(text, interval), pgfence.interval_ok(interval) from public;
revoke all on function pgfence.check_not_null(text, anyelement) from public;
-- pgfence.protect runs as the operator and checks its arguments with these.
grant execute on function pgfence.check_name(text, text), pgfence.check_not_null(text, anyelement)
   to pgfence_operator;

commit;
