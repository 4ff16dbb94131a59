-- Schema version 1: every table of the seed (ST-01), with the tables and rules of the
-- SQLite backend at its schema version 6.
--
-- Identifiers (sessions, queues, operations, targets, block IDs, runs, calls, threads,
-- chains) are BYTEA holding their exact UTF-8 bytes: PostgreSQL text cannot hold a NUL
-- byte, which an ID may contain, and BYTEA compares byte by byte, so keys order exactly
-- like the Rust strings they stand for. JSON is TEXT (serde_json never writes a raw NUL),
-- kept byte for byte as written: JSONB would reorder keys and refuse "\u0000".
--
-- Every number that crosses the wire is checked here to stay within 0 to 2^53 - 1
-- (9,007,199,254,740,991); the library checks it again when reading.

CREATE TABLE workspace_chat_outbox (
    session_id   BYTEA  NOT NULL,
    queue_id     BYTEA  NOT NULL,
    operation_id BYTEA  NOT NULL,
    position     BIGINT NOT NULL,
    entry_json   TEXT   NOT NULL,
    PRIMARY KEY (session_id, queue_id)
);

CREATE TABLE workspace_chat_outbox_operation_identity (
    session_id   BYTEA   NOT NULL,
    operation_id BYTEA   NOT NULL,
    fingerprint  TEXT    NOT NULL,
    queue_id     BYTEA   NOT NULL,
    removed      BOOLEAN NOT NULL DEFAULT false,
    claimed_at   BIGINT  NOT NULL DEFAULT 0
        CHECK (claimed_at BETWEEN 0 AND 9007199254740991),
    PRIMARY KEY (session_id, operation_id)
);

CREATE TABLE chat_operation_ledger (
    app_session_id BYTEA NOT NULL,
    operation_id   BYTEA NOT NULL,
    status         TEXT  NOT NULL CHECK (status IN ('failed', 'sending', 'canceled', 'sent')),
    record_json    TEXT  NOT NULL,
    PRIMARY KEY (app_session_id, operation_id)
);

-- A target's header: its revision and settlement epoch (OV-02, OV-04).
CREATE TABLE chat_live_timeline_overlays (
    app_session_id     BYTEA  NOT NULL,
    timeline_target_id BYTEA  NOT NULL,
    revision           BIGINT NOT NULL CHECK (revision BETWEEN 0 AND 9007199254740991),
    settlement_epoch   BIGINT NOT NULL CHECK (settlement_epoch BETWEEN 0 AND 9007199254740991),
    PRIMARY KEY (app_session_id, timeline_target_id)
);

-- One row per overlay row, keyed by its block key (OV-01).
CREATE TABLE chat_live_timeline_overlay_rows (
    app_session_id     BYTEA NOT NULL,
    timeline_target_id BYTEA NOT NULL,
    block_type         TEXT  NOT NULL,
    block_id           BYTEA NOT NULL,
    row_json           TEXT  NOT NULL,
    PRIMARY KEY (app_session_id, timeline_target_id, block_type, block_id)
);

-- The single global revision counter (OV-02), as a sequence: a sequence is itself a
-- one-row relation (SELECT last_value FROM chat_live_timeline_overlay_revisions), it
-- never hands out a value twice, even to transactions that roll back or to hosts that
-- race, and taking a value does not hold a lock until commit, so writes of different
-- targets commit in parallel. Writes of one target are ordered by a lock on the target
-- taken before the value, so a target's revisions rise in commit order. MAXVALUE stops
-- it at 2^53 - 1.
CREATE SEQUENCE chat_live_timeline_overlay_revisions
    AS BIGINT MINVALUE 0 MAXVALUE 9007199254740991 START WITH 1 NO CYCLE;

-- The epoch a deleted target had, until its next first write (OV-04).
CREATE TABLE chat_live_timeline_overlay_deleted_epochs (
    app_session_id     BYTEA  NOT NULL,
    timeline_target_id BYTEA  NOT NULL,
    settlement_epoch   BIGINT NOT NULL CHECK (settlement_epoch BETWEEN 0 AND 9007199254740991),
    PRIMARY KEY (app_session_id, timeline_target_id)
);

CREATE TABLE chat_pending_terminal_overlay_cleanups (
    app_session_id BYTEA NOT NULL,
    run_id         BYTEA NOT NULL,
    PRIMARY KEY (app_session_id, run_id)
);

CREATE TABLE chat_session_messages (
    operation_id         BYTEA  PRIMARY KEY,
    recipient_session_id BYTEA  NOT NULL,
    sender_session_id    BYTEA  NOT NULL,
    sender_call_id       BYTEA  NOT NULL,
    sender_run_id        BYTEA,
    sender_thread_id     BYTEA,
    chain_id             BYTEA  NOT NULL,
    hop                  BIGINT NOT NULL CHECK (hop BETWEEN 0 AND 4294967295),
    created_at           BIGINT NOT NULL CHECK (created_at BETWEEN 0 AND 9007199254740991),
    delivery             TEXT   NOT NULL CHECK (delivery IN ('sent', 'needs-approval', 'declined')),
    UNIQUE (sender_session_id, sender_call_id)
);
