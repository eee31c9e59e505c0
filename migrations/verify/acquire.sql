-- Verify pgfence:acquire
select 1/(pg_catalog.strpos(pg_catalog.pg_get_functiondef('pgfence.acquire(text, text, interval, uuid)'::regprocedure),
                            'v_granted') > 0)::int;
