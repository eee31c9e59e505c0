-- TEST-ONLY STAND-INS for pg_net's net.http_post and Supabase Vault's vault.decrypted_secrets,
-- never deployed anywhere else.
--
-- pgflow 0.14's ensure_workers() (run by pg_cron) pings worker Edge Functions with
-- net.http_post, authenticated with secrets read from vault.decrypted_secrets. Neither pg_net
-- nor Vault is installable here, so the tests (tests/pgflow14.py) install this in their place:
-- net.http_post records each request in net.stand_in_calls and returns its id, as pg_net
-- returns a request id; nothing is sent. vault.decrypted_secrets is a plain table of the
-- secrets a test puts there. Nothing of pg_net's or Vault's behaviour is here beyond the
-- signatures pgflow uses.
create schema if not exists net;

create table net.stand_in_calls (
  id                   bigint generated always as identity primary key,
  url                  text not null,
  body                 jsonb,
  params               jsonb,
  headers              jsonb,
  timeout_milliseconds int,
  sent_at              timestamptz not null default clock_timestamp()
);
comment on table net.stand_in_calls is 'TEST-ONLY: the requests of the net.http_post stand-in.';

-- pg_net's signature (0.x): every argument but url has a default.
create function net.http_post(url text, body jsonb default '{}'::jsonb, params jsonb default '{}'::jsonb,
                              headers jsonb default '{"Content-Type": "application/json"}'::jsonb,
                              timeout_milliseconds int default 5000)
returns bigint
language sql
as $$
  insert into net.stand_in_calls (url, body, params, headers, timeout_milliseconds)
  values (http_post.url, http_post.body, http_post.params, http_post.headers, http_post.timeout_milliseconds)
  returning id;
$$;
comment on function net.http_post(text, jsonb, jsonb, jsonb, int) is
  'TEST-ONLY stand-in for pg_net''s net.http_post: records the request in net.stand_in_calls.';

create schema if not exists vault;

create table vault.decrypted_secrets (
  name             text primary key,
  decrypted_secret text
);
comment on table vault.decrypted_secrets is
  'TEST-ONLY stand-in for Supabase Vault''s view of decrypted secrets: a plain table.';
