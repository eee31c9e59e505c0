-- pgfence: a startup request for a resource with nothing pending (its ttl so short that the
-- next one finds it expired), then the bookkeeping a supervisor leaves: nothing else.
select pgfence.request_start('dead-r', interval '1 millisecond');
