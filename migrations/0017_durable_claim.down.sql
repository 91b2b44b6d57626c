-- Back to version 16: the claim commits with synchronous_commit = off.
ALTER FUNCTION claim_jobs(text[], jsonb, integer, integer, bigint, text) RESET synchronous_commit;
