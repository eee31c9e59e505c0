-- Revert pgfence:schema
-- No cascade: every later change reverts its own objects, and this fails if one did not.

begin;

drop schema pgfence;

commit;
