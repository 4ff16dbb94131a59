-- Schema version 6: a deleted target keeps its settlement epoch.
--
-- Until version 5 deleting a target removed its header row, and the target's next write
-- started again at settlement epoch 0. A client that still held the old target's higher
-- epoch then ignored every live update of the new one as stale. Now a delete records the
-- epoch the target had here, in the same transaction, and the target's next first write
-- stores one more than it (overlay_core::store::created_epoch); that write removes the
-- record. Targets deleted before this version left no epoch behind, so nothing moves.

CREATE TABLE chat_live_timeline_overlay_deleted_epochs (
    app_session_id     TEXT    NOT NULL,
    timeline_target_id TEXT    NOT NULL,
    settlement_epoch   INTEGER NOT NULL,
    PRIMARY KEY (app_session_id, timeline_target_id)
);
