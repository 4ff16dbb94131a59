-- Schema version 1: every table of the seed (ST-01). Tables keyed by text pairs are
-- WITHOUT ROWID, so a row lives in one B-tree (one page write per row, not two).

CREATE TABLE workspace_chat_outbox (
    session_id   TEXT    NOT NULL,
    queue_id     TEXT    NOT NULL,
    operation_id TEXT    NOT NULL,
    position     INTEGER NOT NULL,
    entry_json   TEXT    NOT NULL,
    PRIMARY KEY (session_id, queue_id)
) WITHOUT ROWID;

CREATE TABLE workspace_chat_outbox_operation_identity (
    session_id   TEXT    NOT NULL,
    operation_id TEXT    NOT NULL,
    fingerprint  TEXT    NOT NULL,
    queue_id     TEXT    NOT NULL,
    removed      INTEGER NOT NULL DEFAULT 0 CHECK (removed IN (0, 1)),
    PRIMARY KEY (session_id, operation_id)
) WITHOUT ROWID;

CREATE TABLE chat_operation_ledger (
    app_session_id TEXT NOT NULL,
    operation_id   TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('failed', 'sending', 'canceled', 'sent')),
    record_json    TEXT NOT NULL,
    PRIMARY KEY (app_session_id, operation_id)
) WITHOUT ROWID;

CREATE TABLE chat_live_timeline_overlays (
    app_session_id     TEXT    NOT NULL,
    timeline_target_id TEXT    NOT NULL,
    revision           INTEGER NOT NULL,
    settlement_epoch   INTEGER NOT NULL,
    snapshot_json      TEXT    NOT NULL,
    PRIMARY KEY (app_session_id, timeline_target_id)
);

CREATE TABLE chat_live_timeline_overlay_revisions (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    revision INTEGER NOT NULL CHECK (revision BETWEEN 0 AND 9007199254740991)
);
INSERT INTO chat_live_timeline_overlay_revisions (id, revision) VALUES (1, 0);

CREATE TABLE chat_pending_terminal_overlay_cleanups (
    app_session_id TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    PRIMARY KEY (app_session_id, run_id)
);

CREATE TABLE chat_session_messages (
    operation_id         TEXT    PRIMARY KEY,
    recipient_session_id TEXT    NOT NULL,
    sender_session_id    TEXT    NOT NULL,
    sender_call_id       TEXT    NOT NULL,
    sender_run_id        TEXT,
    sender_thread_id     TEXT,
    chain_id             TEXT    NOT NULL,
    hop                  INTEGER NOT NULL,
    created_at           INTEGER NOT NULL,
    delivery             TEXT    NOT NULL CHECK (delivery IN ('sent', 'needs-approval', 'declined')),
    UNIQUE (sender_session_id, sender_call_id)
);
