-- Back to version 12: the claim plans as PostgreSQL chooses.
ALTER FUNCTION claim_jobs(text[], jsonb, integer, integer, bigint, text) RESET plan_cache_mode;
