-- floodwall 0001: the record tables behind floodwall.stores on PostgreSQL.
-- One row per record; `key` is the primary key, i.e. the unique index that makes dedupe
-- (INSERT ... ON CONFLICT) atomic. `value` NULL marks a row created only to hold a row lock
-- for an operation in flight. `expires_at`: seconds since the Unix epoch on the server's clock
-- (clock_timestamp()), NULL = never; expired rows read as absent and are purged in batches.
CREATE TABLE IF NOT EXISTS floodwall_kv (
    key        TEXT PRIMARY KEY,
    value      BYTEA,
    expires_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS floodwall_kv_expires_at ON floodwall_kv (expires_at);
-- The dedupe table of floodwall.idempotency: request records and one-time tokens.
CREATE TABLE IF NOT EXISTS floodwall_idempotency (
    key        TEXT PRIMARY KEY,
    value      BYTEA,
    expires_at DOUBLE PRECISION
);
CREATE INDEX IF NOT EXISTS floodwall_idempotency_expires_at ON floodwall_idempotency (expires_at);
