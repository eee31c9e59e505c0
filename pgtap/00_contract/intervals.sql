-- Every interval argument is bounded by the deadline it makes: more than zero, at most a day
-- ahead. An interval with months or years is refused: it compares as 30 days a month but adds
-- calendar months, so '3000000 mon -89999999 days' compares as one day and adds 3,590 years.
begin;
select plan(24);
select pgfence_test.reset();
select pgfence.register('r');
select pgfence.enqueue('q');
select pgfence_test.lease('r') as lease \gset
select attempt_id as attempt from pgfence.claim(:'lease', 'q') \gset

select throws_ok($$ select pgfence.acquire('r', 'o', '3000000 mon -89999999 days') $$, '22023', null,
                 'acquire refuses a ttl that compares as a day but adds thousands of years');
select throws_ok(format($$ select pgfence.renew(%L, '3000000 mon -89999999 days') $$, :'lease'),
                 '22023', null, 'renew refuses it');
select throws_ok(format($$ select pgfence.claim(%L, 'q', 1, '3000000 mon -89999999 days') $$, :'lease'),
                 '22023', null, 'claim refuses it as visibility');
select throws_ok(format($$ select pgfence.extend(%L, '3000000 mon -89999999 days') $$, :'attempt'),
                 '22023', null, 'extend refuses it');
select throws_ok($$ select pgfence.request_start('r', '3000000 mon -89999999 days') $$, '22023', null,
                 'request_start refuses it');
select throws_ok($$ select pgfence.acquire('r', 'o', '1 mon') $$, '22023', null, 'a month is refused');
select throws_ok($$ select pgfence.acquire('r', 'o', '1 year') $$, '22023', null, 'a year is refused');
select throws_ok($$ select pgfence.acquire('r', 'o', '-1 mon 31 days') $$, '22023', null,
                 'months cancelled by days are refused');
select throws_ok($$ select pgfence.acquire('r', 'o', '1 day 1 second') $$, '22023', null,
                 'more than a day is refused');
select throws_ok($$ select pgfence.acquire('r', 'o', '0') $$, '22023', null, 'zero is refused');
select throws_ok($$ select pgfence.acquire('r', 'o', '-1 second') $$, '22023', null, 'a negative ttl is refused');
select throws_ok($$ select pgfence.acquire('r', 'o', '2 days -49 hours') $$, '22023', null,
                 'days and hours that end before now are refused');
select throws_like($$ select pgfence.acquire('r', 'o', '1 mon') $$, '%without months or years%',
                   'the message says why');

-- What is accepted stores a deadline within a day.
select lives_ok($$ select pgfence.request_start('r', '1 day') $$, 'a day is accepted');
select pgfence_test.expire(:'lease');
select lease_id as second from pgfence.acquire('r', 'o2', '2 days -47 hours') \gset
select ok((select expires_at - clock_timestamp() between interval '50 minutes' and interval '2 hours'
             from pgfence.leases where lease_id = :'second'),
          'days and hours that make an hour store about an hour');
select ok((select expires_at from pgfence.renew(:'second', '23:59:59')) <= clock_timestamp() + interval '1 day',
          'renew to just under a day stores a deadline within a day');
select is((select count(*) from pgfence.leases l
            where l.expires_at > clock_timestamp() + interval '25 hours'), 0::bigint,
          'no lease reaches past a day (and a daylight-saving hour)');
select is((select count(*) from pgfence.invocations i
            where i.expires_at > clock_timestamp() + interval '25 hours'), 0::bigint,
          'no invocation reaches past a day');
select ok(pgfence.extend(:'attempt', '1 day') <= clock_timestamp() + interval '25 hours',
          'extend by a day stores a deadline within a day');
select lives_ok(format($$ select pgfence.claim(%L, 'q', 1, '1 day') $$, :'second'), 'claim with a day of visibility');
select is((select count(*) from pgfence.tasks t
            where t.visible_until > clock_timestamp() + interval '25 hours'), 0::bigint,
          'no task is hidden past a day');
select throws_ok($$ select pgfence.acquire('r', 'o', null) $$, '22023', null, 'NULL is refused');
select throws_ok(format($$ select pgfence.extend(%L, '1 mon') $$, :'attempt'), '22023', null,
                 'extend refuses a month');
select throws_ok(format($$ select pgfence.claim(%L, 'q', 1, '1 year') $$, :'second'), '22023', null,
                 'claim refuses a year');

select * from finish();
rollback;
