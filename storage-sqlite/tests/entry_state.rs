//! The entry JSON this store writes for every entry state is byte for byte what it wrote
//! before the state existed (OB-05, ST-01): the row's JSON is checked against a copy of
//! the old body layout, filled from the entry's own seed-format JSON, and reads back as
//! the same state.
#![allow(clippy::unwrap_used)]

use fixtures::strategies::entry_state;
use outbox_core::entry::{
    Acceptance, Controls, Handoff, MessageRequest, OutboxEntry, SessionMessageOrigin,
};
use outbox_core::fingerprint::request_fingerprint;
use outbox_core::ids::{OperationId, QueueId, SessionId};
use outbox_core::store::OutboxStore;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use storage_sqlite::{Settings, SqliteStore};
use timeline_core::time::Millis;

/// The entry as it was declared before the state existed, read from its JSON.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LegacyEntry {
    request: MessageRequest,
    controls: Controls,
    status: LegacyStatus,
    auto_drain: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    hold_reason: Option<String>,
    #[serde(default)]
    acceptance: Option<Acceptance>,
    #[serde(default)]
    handoff: Option<Handoff>,
    #[serde(default)]
    session_message: Option<SessionMessageOrigin>,
}

#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum LegacyStatus {
    Queued,
    Sending,
}

/// The body this store wrote before the state existed (schema version 3 onwards).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LegacyBody<'a> {
    request: &'a MessageRequest,
    controls: &'a Controls,
    status: &'a LegacyStatus,
    auto_drain: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_reason: Option<&'a String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    acceptance: Option<&'a Acceptance>,
    #[serde(skip_serializing_if = "Option::is_none")]
    handoff: Option<&'a Handoff>,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_message: Option<&'a SessionMessageOrigin>,
}

fn legacy_body(entry: &OutboxEntry) -> String {
    let l: LegacyEntry = serde_json::from_str(&serde_json::to_string(entry).unwrap()).unwrap();
    serde_json::to_string(&LegacyBody {
        request: &l.request,
        controls: &l.controls,
        status: &l.status,
        auto_drain: l.auto_drain,
        error: l.error.as_ref(),
        hold_reason: l.hold_reason.as_ref(),
        acceptance: l.acceptance.as_ref(),
        handoff: l.handoff.as_ref(),
        session_message: l.session_message.as_ref(),
    })
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

    // OB-05, ST-01: every state is stored as the old body, byte for byte, and reads back
    // as itself.
    #[test]
    fn every_state_is_stored_as_before(state in entry_state()) {
        let session = SessionId::new("s1").unwrap();
        let mut store = SqliteStore::open_in_memory(Settings::default()).unwrap();
        let entry = OutboxEntry::queued(
            QueueId::new("q-1").unwrap(),
            OperationId::new("op-1").unwrap(),
            MessageRequest::text("hi \u{e9}", "composer", Millis(1)),
            Controls::automatic(),
            3,
        )
        .with_state(state);
        let fp = request_fingerprint(&session, &entry.queue_id, &entry.request);
        store.claim(&session, &fp, &entry).unwrap();
        let stored: String = store
            .connection()
            .query_row("SELECT entry_json FROM workspace_chat_outbox", [], |r| r.get(0))
            .unwrap();
        prop_assert_eq!(stored, legacy_body(&entry));
        let read = store.entries(&session).unwrap();
        prop_assert_eq!(read[0].entry(), Some(&entry));
    }
}
