-- Verify pgfence:check_revert
select pgfence.check_revert('0.3.0');
