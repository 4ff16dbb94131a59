-- Schema version 3: smaller submit writes. A submit inserts one row in each of the two
-- tables below in one transaction, and every page it changes is one WAL frame written
-- at commit, so these changes cut the pages a submit touches.
--
-- The outbox becomes a rowid table with a unique (session_id, queue_id) index. An entry
-- row carries the whole entry JSON, a few hundred bytes; in a WITHOUT ROWID table every
-- insert lands inside the key order and a full leaf splits by rebalancing with its
-- siblings, while a rowid table appends the row at its end and only the small index
-- entry lands inside the key order.
--
-- The identity keeps the fingerprint as its 32 digest bytes instead of 64 hex
-- characters, so more identities fit a page and leaves split less often. A fingerprint
-- that is not 64 lowercase hex characters (never written by this library) stays text.

CREATE TABLE workspace_chat_outbox_v3 (
    entry_seq    INTEGER PRIMARY KEY,
    session_id   TEXT    NOT NULL,
    queue_id     TEXT    NOT NULL,
    operation_id TEXT    NOT NULL,
    position     INTEGER NOT NULL,
    entry_json   TEXT    NOT NULL,
    UNIQUE (session_id, queue_id)
);

INSERT INTO workspace_chat_outbox_v3 (session_id, queue_id, operation_id, position, entry_json)
    SELECT session_id, queue_id, operation_id, position, entry_json
    FROM workspace_chat_outbox
    ORDER BY session_id, position, queue_id;

DROP TABLE workspace_chat_outbox;

ALTER TABLE workspace_chat_outbox_v3 RENAME TO workspace_chat_outbox;

CREATE TABLE workspace_chat_outbox_operation_identity_v3 (
    session_id   TEXT    NOT NULL,
    operation_id TEXT    NOT NULL,
    fingerprint  BLOB    NOT NULL,
    queue_id     TEXT    NOT NULL,
    removed      INTEGER NOT NULL DEFAULT 0 CHECK (removed IN (0, 1)),
    claimed_at   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (session_id, operation_id)
) WITHOUT ROWID;

INSERT INTO workspace_chat_outbox_operation_identity_v3
    (session_id, operation_id, fingerprint, queue_id, removed, claimed_at)
    SELECT session_id, operation_id,
           CASE WHEN typeof(fingerprint) = 'text'
                     AND length(fingerprint) = 64
                     AND NOT fingerprint GLOB '*[^0-9a-f]*'
                THEN unhex(fingerprint)
                ELSE fingerprint
           END,
           queue_id, removed, claimed_at
    FROM workspace_chat_outbox_operation_identity;

DROP TABLE workspace_chat_outbox_operation_identity;

ALTER TABLE workspace_chat_outbox_operation_identity_v3
    RENAME TO workspace_chat_outbox_operation_identity;
