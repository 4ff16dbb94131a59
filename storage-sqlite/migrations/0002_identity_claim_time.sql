-- Schema version 2: an identity row remembers when its operation was claimed.

ALTER TABLE workspace_chat_outbox_operation_identity
    ADD COLUMN claimed_at INTEGER NOT NULL DEFAULT 0;
