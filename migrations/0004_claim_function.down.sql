DROP FUNCTION IF EXISTS claim(text[], jsonb, integer, bigint, text);
