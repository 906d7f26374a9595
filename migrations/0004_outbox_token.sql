-- The Redis marker of a paid outbox row must be unique across every database
-- that shares a Redis server (row ids restart in each one): a random token.
ALTER TABLE qbridge.redis_outbox ADD COLUMN token uuid NOT NULL DEFAULT gen_random_uuid();
