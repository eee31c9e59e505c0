-- Revert pgfence:releases
--
-- The last revert of a Sqitch revert to 0.2.1 (the first change after it): the schema is
-- 0.2.1's again, so health's manifest of 0.2.1 is written from it, as that release's health
-- change wrote it, and the lockdown runs again.

begin;
set local search_path = pg_catalog, pg_temp;
set local lock_timeout = '5s';

drop function pgfence.check_release(name, text, text), pgfence.expect_release(name, text),
              pgfence.unseal(name, text), pgfence.seal(name, text), pgfence.schema_drift(name),
              pgfence.installed_release(name), pgfence.schema_fingerprint(name), pgfence.schema_objects(name),
              pgfence.deparsed(text), pgfence.acl_text(aclitem[], "char", oid, oid);
drop table pgfence.schema_records, pgfence.releases;

create table pgfence.manifest (
  object text primary key,
  digest text not null
);
comment on table pgfence.manifest is
  'The schema objects as this release installed them (pgfence.schema_objects()), which pgfence.health() compares with.';
revoke all on pgfence.manifest from public;
insert into pgfence.manifest select * from pgfence.schema_objects();

do $$ begin perform pgfence.lockdown('pgfence'); end $$;

commit;
