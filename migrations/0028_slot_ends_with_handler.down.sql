-- Back to version 27: claims count every running job against the limits.
DROP FUNCTION claim_jobs(text[], jsonb, integer, integer, bigint, text, uuid[]);
DROP FUNCTION claim_type(text, jsonb, integer, integer, uuid[]);
