-- Schema version 4: IDs that end in a UUID take 16 bytes instead of 36 characters.
--
-- In the two tables a submit writes, a session, queue or operation ID whose last 36
-- characters are a canonical UUID (lower-case hex in groups of 8-4-4-4-12) is stored as
-- a BLOB: the UTF-8 bytes before the UUID, then the UUID's 16 bytes. Every other ID
-- stays TEXT. The library reads both back to the exact text (`storage_sqlite::IdColumn`),
-- and two IDs are equal exactly when their stored values are, so the keys and unique
-- constraints mean what they meant. Client IDs are UUIDs, and the identity table keeps a
-- row for every operation ever claimed, in random key order: smaller keys put more rows
-- on a page, so a submit changes fewer pages and a checkpoint copies fewer.

-- Every stored ID text that changes, with its new value. The GLOB is the test
-- `IdColumn` makes, character for character.
CREATE TEMP TABLE id_bytes (id TEXT PRIMARY KEY, stored BLOB NOT NULL);

INSERT INTO id_bytes (id, stored)
    SELECT id, unhex(hex(substr(id, 1, length(id) - 36)) || replace(substr(id, -36), '-', ''))
    FROM (
        SELECT session_id AS id FROM workspace_chat_outbox
        UNION SELECT queue_id FROM workspace_chat_outbox
        UNION SELECT operation_id FROM workspace_chat_outbox
        UNION SELECT session_id FROM workspace_chat_outbox_operation_identity
        UNION SELECT operation_id FROM workspace_chat_outbox_operation_identity
        UNION SELECT queue_id FROM workspace_chat_outbox_operation_identity
    )
    WHERE typeof(id) = 'text'
      AND length(id) >= 36
      AND substr(id, -36) GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]';

UPDATE workspace_chat_outbox SET
    session_id = coalesce((SELECT stored FROM id_bytes WHERE id = session_id), session_id),
    queue_id = coalesce((SELECT stored FROM id_bytes WHERE id = queue_id), queue_id),
    operation_id = coalesce((SELECT stored FROM id_bytes WHERE id = operation_id), operation_id);

UPDATE workspace_chat_outbox_operation_identity SET
    session_id = coalesce((SELECT stored FROM id_bytes WHERE id = session_id), session_id),
    operation_id = coalesce((SELECT stored FROM id_bytes WHERE id = operation_id), operation_id),
    queue_id = coalesce((SELECT stored FROM id_bytes WHERE id = queue_id), queue_id);

DROP TABLE id_bytes;
