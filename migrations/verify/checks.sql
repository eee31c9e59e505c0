-- Verify pgfence:checks
select 'pgfence.check_name(text, text)'::regprocedure, 'pgfence.check_label(text, text)'::regprocedure,
       'pgfence.check_interval(text, interval)'::regprocedure, 'pgfence.check_not_null(text, anyelement)'::regprocedure,
       'pgfence.interval_ok(interval)'::regprocedure;
