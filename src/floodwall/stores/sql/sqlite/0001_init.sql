-- floodwall 0001: the record tables behind floodwall.stores on SQLite.
-- `key` is the primary key (the unique index dedupe relies on). `expires_at`: seconds since the
-- Unix epoch on the host's wall clock, NULL = never; expired rows read as absent and are purged
-- in batches.
CREATE TABLE IF NOT EXISTS floodwall_kv (
    key        TEXT PRIMARY KEY,
    value      BLOB,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS floodwall_kv_expires_at ON floodwall_kv (expires_at);
-- The dedupe table of floodwall.idempotency: request records and one-time tokens.
CREATE TABLE IF NOT EXISTS floodwall_idempotency (
    key        TEXT PRIMARY KEY,
    value      BLOB,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS floodwall_idempotency_expires_at ON floodwall_idempotency (expires_at);
