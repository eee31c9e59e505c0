-- TEST-ONLY STAND-IN for Supabase Realtime's realtime.send, never deployed anywhere else.
--
-- pgflow's migrations call realtime.send(payload, event, topic, private) to broadcast run and
-- step events; on Supabase the Realtime service provides it. The tests install this instead:
-- a realtime schema whose send records each call in realtime_stand_in_calls, so a test can
-- see what pgflow broadcast. It has nothing of Realtime's behaviour beyond the signature.
create schema if not exists realtime;

create table realtime.stand_in_calls (
  id      bigint generated always as identity primary key,
  payload jsonb,
  event   text,
  topic   text,
  private boolean,
  sent_at timestamptz not null default clock_timestamp()
);
comment on table realtime.stand_in_calls is 'TEST-ONLY: the calls of the realtime.send stand-in.';

create function realtime.send(payload jsonb, event text, topic text, private boolean default true)
returns void
language sql
as $$
  insert into realtime.stand_in_calls (payload, event, topic, private)
  values (send.payload, send.event, send.topic, send.private);
$$;
comment on function realtime.send(jsonb, text, text, boolean) is
  'TEST-ONLY stand-in for Supabase Realtime''s realtime.send: records the call in realtime.stand_in_calls.';
