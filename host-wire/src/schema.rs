//! The JSON Schemas (draft 2020-12) of every wire type, as checked in under `schema/`.
//!
//! [`schemas`] gives each file's name and text. `request.json`, `response.json` and
//! `notification.json` describe the three frames; `results/<method>.json` the result of
//! each method; `error-codes.json` lists every `errorCode`. A client generator (Swift,
//! Kotlin, TypeScript) reads them; a test regenerates them and fails when the checked-in
//! files differ.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};

use crate::answer::{
    Ack, ApprovalResolved, CancelResult, JoinResult, ListResult, ListSessionsResult,
    NewSessionResult, ReconcileResult, SessionPageResult,
};
use crate::frame::{Notification, Request, Response};

/// The wire's version. A new version only adds (fields, methods, events, codes); a
/// client of an older version keeps working, and the messages of every older version
/// still decode (the test of `schema/<version>/examples`).
///
/// Version 2 added `run.chatOutboxReorder` and `run.chatListSessions`; version 3
/// added `run.chatNewSession` and its error code `SESSION_NOT_CREATED`; version 4
/// added `session.page` and the `session-event` of `chat:timeline-updated`.
pub const WIRE_VERSION: u32 = 4;

fn schema_of<T: JsonSchema>() -> Schema {
    SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<T>()
}

/// Every schema file of this version: its path under `schema/<version>/` and its text
/// (pretty JSON with a final newline).
pub fn schemas() -> Vec<(String, String)> {
    let mut files = vec![
        ("request.json".to_owned(), schema_of::<Request>()),
        ("response.json".to_owned(), schema_of::<Response>()),
        ("notification.json".to_owned(), schema_of::<Notification>()),
    ];
    for (method, schema) in result_schemas() {
        files.push((format!("results/{method}.json"), schema));
    }
    let codes = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ErrorCode",
        "description": "Every errorCode this version sends in data.errorCode. A newer host may send one not listed: show its message.",
        "type": "string",
        "enum": crate::error::ERROR_CODES,
    });
    files.push((
        "error-codes.json".to_owned(),
        Schema::try_from(codes).unwrap_or_default(),
    ));
    files
        .into_iter()
        .map(|(path, schema)| {
            let text = serde_json::to_string_pretty(&schema).unwrap_or_default();
            (path, text + "\n")
        })
        .collect()
}

/// The schema of each method's result, by method name.
pub fn result_schemas() -> Vec<(&'static str, Schema)> {
    use outbox_core::entry::Receipt;
    use timeline_core::wire::{OlderPage, TimelineWindow};
    vec![
        ("run.chatLoad", schema_of::<TimelineWindow>()),
        ("run.chatLoadThread", schema_of::<TimelineWindow>()),
        ("run.chatLoadPageBefore", schema_of::<OlderPage>()),
        ("run.chatLoadThreadPageBefore", schema_of::<OlderPage>()),
        ("run.chatReconcileSessions", schema_of::<ReconcileResult>()),
        ("run.chatOutboxSubmit", schema_of::<Receipt>()),
        ("run.chatOutboxEdit", schema_of::<Receipt>()),
        ("run.chatOutboxRemove", schema_of::<Ack>()),
        ("run.chatOutboxReorder", schema_of::<Ack>()),
        ("run.chatOutboxSendNow", schema_of::<Ack>()),
        ("run.chatOutboxStopAndSendNow", schema_of::<Ack>()),
        ("run.cancel", schema_of::<CancelResult>()),
        ("run.list", schema_of::<ListResult>()),
        ("run.chatResolveApproval", schema_of::<ApprovalResolved>()),
        ("run.chatJoin", schema_of::<JoinResult>()),
        ("run.chatLeave", schema_of::<Ack>()),
        ("run.chatListSessions", schema_of::<ListSessionsResult>()),
        ("run.chatNewSession", schema_of::<NewSessionResult>()),
        ("session.page", schema_of::<SessionPageResult>()),
    ]
}
