-- Schema version 2: the queue is read in position order on every drain pass, and an
-- identity row remembers when its operation was claimed.

CREATE INDEX workspace_chat_outbox_by_position
    ON workspace_chat_outbox (session_id, position);

ALTER TABLE workspace_chat_outbox_operation_identity
    ADD COLUMN claimed_at INTEGER NOT NULL DEFAULT 0;
