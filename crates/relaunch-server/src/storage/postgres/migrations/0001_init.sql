-- relaunch's PostgreSQL schema, version 1: the tables of the SQLite
-- backend, in PostgreSQL's types. Free text (run names, notes, console
-- lines, event text, attempt tokens) is BYTEA: PostgreSQL's TEXT cannot
-- hold NUL, which a console line may carry. JSON (tags, config, event
-- data, chunk lists) is TEXT, kept exactly as sent (JSONB would reorder
-- keys); filters cast it to JSON where they look inside.
CREATE TABLE projects (
    id   BIGSERIAL PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE runs (
    id          TEXT PRIMARY KEY,
    project_id  BIGINT NOT NULL REFERENCES projects(id),
    name        BYTEA NOT NULL,
    status      TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL,
    attempts    BIGINT NOT NULL,
    -- false while the project is the default one no caller asked for.
    project_set BOOLEAN NOT NULL,
    -- Wall time of the event that set the status.
    status_wall DOUBLE PRECISION NOT NULL DEFAULT 0,
    tags        TEXT NOT NULL,
    notes       BYTEA NOT NULL,
    config      TEXT NOT NULL
);
CREATE INDEX runs_by_project ON runs(project_id, created_at);
CREATE INDEX runs_by_created ON runs(created_at DESC, id);
CREATE TABLE attempts (
    run_id  TEXT NOT NULL,
    token   BYTEA NOT NULL,
    attempt BIGINT NOT NULL,
    -- When the attempt started (its earliest process); orders attempts.
    started DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, token)
);
CREATE INDEX attempts_by_number ON attempts(run_id, attempt);
CREATE TABLE writers (
    run_id    TEXT NOT NULL,
    writer    TEXT NOT NULL,
    watermark BIGINT NOT NULL,
    PRIMARY KEY (run_id, writer)
);
CREATE TABLE keys (
    id     BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL,
    name   TEXT NOT NULL,
    UNIQUE (run_id, name)
);
CREATE TABLE chunks (
    id         BIGSERIAL PRIMARY KEY,
    key_id     BIGINT NOT NULL,
    rank       BIGINT NOT NULL,
    attempt    BIGINT NOT NULL,
    first_step BIGINT NOT NULL,
    last_step  BIGINT NOT NULL,
    count      BIGINT NOT NULL,
    -- DOUBLE PRECISION holds NaN and the infinities as themselves.
    vmin       DOUBLE PRECISION NOT NULL,
    vmax       DOUBLE PRECISION NOT NULL,
    last_value DOUBLE PRECISION NOT NULL,
    last_wall  DOUBLE PRECISION NOT NULL,
    blocks     BYTEA NOT NULL,
    points     BYTEA NOT NULL
);
-- Out of line and uncompressed, so that substring() reads only the TOAST
-- pages of the block a read needs.
ALTER TABLE chunks ALTER COLUMN points SET STORAGE EXTERNAL;
CREATE INDEX chunks_by_series ON chunks(key_id, rank, first_step);
CREATE TABLE latest (
    key_id  BIGINT NOT NULL,
    rank    BIGINT NOT NULL,
    step    BIGINT NOT NULL,
    value   DOUBLE PRECISION NOT NULL,
    wall    DOUBLE PRECISION NOT NULL,
    attempt BIGINT NOT NULL,
    PRIMARY KEY (key_id, rank)
);
CREATE TABLE logs (
    id      BIGSERIAL PRIMARY KEY,
    run_id  TEXT NOT NULL,
    rank    BIGINT NOT NULL,
    stream  SMALLINT NOT NULL,
    attempt BIGINT NOT NULL,
    wall    DOUBLE PRECISION NOT NULL,
    text    BYTEA NOT NULL
);
CREATE INDEX logs_by_run ON logs(run_id, id);
CREATE INDEX logs_by_rank ON logs(run_id, rank, id);
CREATE TABLE events (
    id      BIGSERIAL PRIMARY KEY,
    run_id  TEXT NOT NULL,
    kind    TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    wall    DOUBLE PRECISION NOT NULL,
    text    BYTEA NOT NULL,
    data    TEXT NOT NULL
);
CREATE INDEX events_by_run ON events(run_id, id);
CREATE TABLE files (
    run_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    size       BIGINT NOT NULL,
    blake3     TEXT NOT NULL,
    -- JSON array of {hash, size}, in order.
    chunks     TEXT NOT NULL,
    n_chunks   BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, name)
);
