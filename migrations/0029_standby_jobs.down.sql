-- Back to version 28: no standby jobs.
DROP FUNCTION claim_jobs(text[], jsonb, integer, integer, bigint, text, uuid[], integer);
DROP FUNCTION claim_type(text, jsonb, integer, integer, uuid[], integer, text);
