DROP FUNCTION IF EXISTS enqueue(text, jsonb, jsonb, timestamptz, integer, integer, interval, text, text, uuid[], text);
DROP FUNCTION IF EXISTS enqueue_posting(text, jsonb);
DROP FUNCTION IF EXISTS enqueue_json_bytes(text);
DROP FUNCTION IF EXISTS enqueue_invalid(text, text);
DROP FUNCTION IF EXISTS new_job_id();
