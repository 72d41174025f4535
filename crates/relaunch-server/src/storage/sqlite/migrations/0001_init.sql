-- The embedded backend's first schema: runs, attempts, writers, metric
-- chunks, latest values, console lines, events, files. Released: never
-- edited; a change is a new numbered script.
CREATE TABLE IF NOT EXISTS projects (
    id   INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS runs (
    id         TEXT PRIMARY KEY,
    project_id INTEGER NOT NULL REFERENCES projects(id),
    name       TEXT NOT NULL,
    status     TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    attempts   INTEGER NOT NULL,
    -- 0 while the project is the default one no caller asked for.
    project_set INTEGER NOT NULL,
    -- Wall time of the event that set the status.
    status_wall REAL NOT NULL DEFAULT 0,
    tags       TEXT NOT NULL,
    notes      TEXT NOT NULL,
    config     TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_by_project ON runs(project_id, created_at);
CREATE TABLE IF NOT EXISTS attempts (
    run_id  TEXT NOT NULL,
    token   TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    -- When the attempt started (its earliest process); orders attempts.
    started REAL NOT NULL,
    PRIMARY KEY (run_id, token)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS writers (
    run_id    TEXT NOT NULL,
    writer    TEXT NOT NULL,
    watermark INTEGER NOT NULL,
    PRIMARY KEY (run_id, writer)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS keys (
    id     INTEGER PRIMARY KEY,
    run_id TEXT NOT NULL,
    name   TEXT NOT NULL,
    UNIQUE (run_id, name)
);
CREATE TABLE IF NOT EXISTS chunks (
    id         INTEGER PRIMARY KEY,
    key_id     INTEGER NOT NULL,
    rank       INTEGER NOT NULL,
    attempt    INTEGER NOT NULL,
    first_step INTEGER NOT NULL,
    last_step  INTEGER NOT NULL,
    count      INTEGER NOT NULL,
    vmin       REAL,
    vmax       REAL,
    last_value REAL,
    last_wall  REAL NOT NULL,
    blocks     BLOB NOT NULL,
    points     BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_by_series ON chunks(key_id, rank, first_step);
CREATE TABLE IF NOT EXISTS latest (
    key_id  INTEGER NOT NULL,
    rank    INTEGER NOT NULL,
    step    INTEGER NOT NULL,
    value   REAL,
    wall    REAL NOT NULL,
    attempt INTEGER NOT NULL,
    PRIMARY KEY (key_id, rank)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS logs (
    id      INTEGER PRIMARY KEY,
    run_id  TEXT NOT NULL,
    rank    INTEGER NOT NULL,
    stream  INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    wall    REAL NOT NULL,
    text    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS logs_by_run ON logs(run_id, id);
CREATE TABLE IF NOT EXISTS events (
    id      INTEGER PRIMARY KEY,
    run_id  TEXT NOT NULL,
    kind    TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    wall    REAL NOT NULL,
    text    TEXT NOT NULL,
    data    TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_run ON events(run_id, id);
CREATE TABLE IF NOT EXISTS files (
    run_id     TEXT NOT NULL,
    name       TEXT NOT NULL,
    size       INTEGER NOT NULL,
    blake3     TEXT NOT NULL,
    -- JSON array of {hash, size}, in order.
    chunks     TEXT NOT NULL,
    n_chunks   INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, name)
);
