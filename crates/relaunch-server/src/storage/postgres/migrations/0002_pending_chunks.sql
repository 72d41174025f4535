-- Chunks a client was handed a URL for, to send straight to the bucket
-- (relaunch server --blobs s3://...): not yet confirmed by a commit. A
-- commit that names one confirms it (a HEAD: its size and SHA-256) and
-- removes its row; rows older than the grace period are collected, their
-- objects deleted.
CREATE TABLE IF NOT EXISTS pending_chunks (
    hash      TEXT PRIMARY KEY,
    size      BIGINT NOT NULL,
    sha256    TEXT NOT NULL,
    handed_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX IF NOT EXISTS pending_chunks_by_age ON pending_chunks(handed_at);
