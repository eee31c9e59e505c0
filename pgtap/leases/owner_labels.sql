-- Owner labels are shown to operators as they are: nothing that hides, reorders or breaks a
-- line (control, format and separator characters), nothing blank.
begin;
select plan(14);
select pgfence_test.reset();
select pgfence.register('r');

select throws_ok($$ select pgfence.acquire('r', E'worker-\u202e1', '30 s') $$, '22023', null, 'a right-to-left override is refused');
select throws_ok($$ select pgfence.acquire('r', E'worker-\u2066a\u2069', '30 s') $$, '22023', null, 'bidi isolates are refused');
select throws_ok($$ select pgfence.acquire('r', E'work\u200ber', '30 s') $$, '22023', null, 'a zero-width space is refused');
select throws_ok($$ select pgfence.acquire('r', E'work\u200der', '30 s') $$, '22023', null, 'a zero-width joiner is refused');
select throws_ok($$ select pgfence.acquire('r', E'\ufeffworker', '30 s') $$, '22023', null, 'a byte order mark is refused');
select throws_ok($$ select pgfence.acquire('r', E'a\u2028b', '30 s') $$, '22023', null, 'a line separator is refused');
select throws_ok($$ select pgfence.acquire('r', E'a\u2029b', '30 s') $$, '22023', null, 'a paragraph separator is refused');
select throws_ok($$ select pgfence.acquire('r', E'a\U000e0041', '30 s') $$, '22023', null, 'a tag character is refused');
select throws_ok($$ select pgfence.acquire('r', '   ', '30 s') $$, '22023', null, 'spaces only are refused');
select throws_ok($$ select pgfence.acquire('r', E'\u3000\u00a0', '30 s') $$, '22023', null, 'other blank spaces only are refused');
select throws_ok($$ select pgfence.acquire('r', E'a\tb', '30 s') $$, '22023', null, 'a control character is refused');
select lives_ok($$ select pgfence.acquire('r', 'worker-1 (eu-west, pid 42)', '30 s') $$, 'an ordinary label with spaces is accepted');
select pgfence_test.expire((select lease_id from pgfence.leases where state = 'active'));
select lives_ok($$ select pgfence.acquire('r', 'Jürgen ワーカー 🚀', '30 s') $$, 'letters of any script and emoji are accepted');
select is((select owner from pgfence.lease_status where status = 'current'), 'Jürgen ワーカー 🚀', 'and shown as given');

select * from finish();
rollback;
