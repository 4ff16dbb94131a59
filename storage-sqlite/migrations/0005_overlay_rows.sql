-- Schema version 5: one overlay row per table row.
--
-- Until version 4 a target's live overlay was one JSON array in
-- chat_live_timeline_overlays.snapshot_json, parsed whole on every read and written whole
-- on every write, so publishing one row into an overlay of n rows cost O(n). Now every
-- row of an overlay is one row of chat_live_timeline_overlay_rows, keyed by (session,
-- target, block type, block ID), and a write inserts, replaces or deletes only the rows
-- it changed; chat_live_timeline_overlays keeps each target's revision and settlement
-- epoch (OV-02), and its snapshot_json is NULL.
--
-- A version-4 snapshot moves when it is a JSON array of objects whose block type and
-- block ID are text and no key appears twice: each element becomes one row, its JSON
-- text unchanged. Any other snapshot (not JSON, not an array, a key twice) cannot be
-- split without choosing what to drop, so it stays in snapshot_json exactly as it was
-- and reading that target reports it as corrupt, as version 4 did. Nothing is dropped.

CREATE TABLE chat_live_timeline_overlay_rows (
    row_seq            INTEGER PRIMARY KEY,
    app_session_id     TEXT    NOT NULL,
    timeline_target_id TEXT    NOT NULL,
    block_type         TEXT    NOT NULL,
    block_id           TEXT    NOT NULL,
    row_json           TEXT    NOT NULL,
    UNIQUE (app_session_id, timeline_target_id, block_type, block_id)
);

-- The snapshots that split cleanly, with their text. The CASE keeps json_each away
-- from text that is not a JSON array (json_each would fail on it).
CREATE TEMP TABLE movable AS
    SELECT app_session_id, timeline_target_id, snapshot_json
    FROM chat_live_timeline_overlays o
    WHERE CASE
        WHEN typeof(snapshot_json) = 'text'
             AND json_valid(snapshot_json)
             AND json_type(snapshot_json) = 'array'
        THEN NOT EXISTS (
                 SELECT 1 FROM json_each(o.snapshot_json) j
                 WHERE j.type IS NOT 'object'
                    OR json_type(j.value, '$.block.type') IS NOT 'text'
                    OR json_type(j.value, '$.block.id') IS NOT 'text'
             )
             AND (SELECT count(*) FROM json_each(o.snapshot_json)) = (
                 SELECT count(*) FROM (
                     SELECT DISTINCT json_extract(j.value, '$.block.type'),
                                     json_extract(j.value, '$.block.id')
                     FROM json_each(o.snapshot_json) j
                 )
             )
        ELSE 0
    END;

INSERT INTO chat_live_timeline_overlay_rows
    (app_session_id, timeline_target_id, block_type, block_id, row_json)
    SELECT m.app_session_id, m.timeline_target_id,
           json_extract(j.value, '$.block.type'), json_extract(j.value, '$.block.id'),
           j.value
    FROM movable m, json_each(m.snapshot_json) j
    ORDER BY m.app_session_id, m.timeline_target_id, j.key;

-- snapshot_json may now be NULL: the table is rebuilt with the same columns.
CREATE TABLE chat_live_timeline_overlays_v5 (
    app_session_id     TEXT    NOT NULL,
    timeline_target_id TEXT    NOT NULL,
    revision           INTEGER NOT NULL,
    settlement_epoch   INTEGER NOT NULL,
    snapshot_json      TEXT,
    PRIMARY KEY (app_session_id, timeline_target_id)
);

INSERT INTO chat_live_timeline_overlays_v5
    (app_session_id, timeline_target_id, revision, settlement_epoch, snapshot_json)
    SELECT o.app_session_id, o.timeline_target_id, o.revision, o.settlement_epoch,
           CASE WHEN EXISTS (
                    SELECT 1 FROM movable m
                    WHERE m.app_session_id = o.app_session_id
                      AND m.timeline_target_id = o.timeline_target_id
                ) THEN NULL
                ELSE o.snapshot_json
           END
    FROM chat_live_timeline_overlays o;

DROP TABLE chat_live_timeline_overlays;

ALTER TABLE chat_live_timeline_overlays_v5 RENAME TO chat_live_timeline_overlays;

DROP TABLE movable;
