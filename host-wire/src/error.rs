//! Errors on the wire: one stable `errorCode` per error variant, the seed's text as the
//! message, inside a JSON-RPC 2.0 error object.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// JSON-RPC 2.0: the frame is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC 2.0: the frame is not a request object.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC 2.0: no such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC 2.0: the params do not fit the method.
pub const INVALID_PARAMS: i64 = -32602;
/// JSON-RPC 2.0: the host failed inside.
pub const INTERNAL_ERROR: i64 = -32603;
/// JSON-RPC 2.0's server range: the host refused or failed the request; the `errorCode`
/// in `data` says which.
pub const SERVER_ERROR: i64 = -32000;

/// Every `errorCode` this version sends. A client may meet one it does not know from a
/// newer host; it shows the message then.
pub const ERROR_CODES: &[&str] = &[
    // The frame and its params.
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "FRAME_TOO_LARGE",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "IDEMPOTENCY_KEY_REUSED",
    // Loads (`WindowError` and `LoadError`).
    "TIMELINE_SNAPSHOT_TOO_LARGE",
    "INVALID_CURSOR",
    "HISTORY_UNAVAILABLE",
    "UNKNOWN_TARGET",
    "OUTBOX_UNAVAILABLE",
    // Submit (`SubmitError`).
    "UNKNOWN_SESSION",
    "UNSUPPORTED_CONTROL",
    "OPERATION_CONFLICT",
    "OPERATION_REMOVED",
    "STEER_RETARGETED",
    "STORE_UNAVAILABLE",
    // Outbox commands (`ActionError`).
    "ENTRY_NOT_FOUND",
    "ENTRY_BLOCKED",
    "NOT_AN_ACCEPTED_STEER",
    "MODEL_CHANGED",
    "RUN_MAY_STILL_TAKE_IT",
    "OPERATION_TAKEN",
    // Stop.
    "STOP_FAILED",
    // Approvals (`ApprovalError`).
    "APPROVAL_UNKNOWN",
    "DECISION_NOT_ALLOWED",
    "APPROVAL_ALREADY_RESOLVED",
    "AGENT_REFUSED",
    "DECISION_UNSAVED",
    // A server's: past the dispatch cap, and its HTTP refusals (`UNAUTHORIZED`,
    // `TOO_MANY_ATTEMPTS`, `PAIRING_CODE_INVALID` in a JSON body).
    "DISPATCH_TIMEOUT",
    "UNAUTHORIZED",
    "TOO_MANY_ATTEMPTS",
    "PAIRING_CODE_INVALID",
    // Several hosts on one database: the session is served by another host
    // (`data.servedBy` says which, and where), or its lease was lost mid-request.
    "SESSION_ELSEWHERE",
    // `run.chatNewSession` (version 3): the host makes no sessions on request, or its
    // embedder refused this one (`NewSessionError`).
    "SESSION_NOT_CREATED",
];

/// The `data` of a JSON-RPC error: the stable code a client switches on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ErrorData {
    /// One of [`ERROR_CODES`] (a newer host may send one this version does not list).
    pub error_code: String,
    /// With `SESSION_ELSEWHERE`: the host that serves the session now, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_by: Option<Box<ServedBy>>,
}

/// The host that serves a session, for a client to connect to instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServedBy {
    /// Its host ID.
    pub host: String,
    /// Where to connect (the address it registered; absent when it registered none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// A JSON-RPC 2.0 error object: `code`, `message` (the seed's text) and
/// `data.errorCode`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, thiserror::Error)]
#[error("{message} ({})", data.error_code)]
pub struct WireError {
    /// The JSON-RPC code: [`INVALID_PARAMS`] and the others of the protocol, or
    /// [`SERVER_ERROR`] for what the host refused.
    pub code: i64,
    /// The words a person reads.
    pub message: String,
    /// The stable code.
    pub data: ErrorData,
}

impl WireError {
    /// An error with `code`, `error_code` and `message`.
    pub fn new(code: i64, error_code: &str, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
            data: ErrorData {
                error_code: error_code.to_owned(),
                served_by: None,
            },
        }
    }

    /// `SESSION_ELSEWHERE`: the session is served by `served_by` (when known).
    pub fn elsewhere(message: impl Into<String>, served_by: Option<ServedBy>) -> WireError {
        let mut e = WireError::new(SERVER_ERROR, "SESSION_ELSEWHERE", message);
        e.data.served_by = served_by.map(Box::new);
        e
    }

    /// What the host refused or failed: [`SERVER_ERROR`], or [`INVALID_PARAMS`] when its
    /// code is `INVALID_PARAMS` (the seed's "fails as invalid params").
    pub fn refused(error_code: &str, message: impl Into<String>) -> WireError {
        let code = if error_code == "INVALID_PARAMS" {
            INVALID_PARAMS
        } else {
            SERVER_ERROR
        };
        WireError::new(code, error_code, message)
    }

    /// `INVALID_PARAMS` with `message`.
    pub fn invalid_params(message: impl Into<String>) -> WireError {
        WireError::new(INVALID_PARAMS, "INVALID_PARAMS", message)
    }

    /// The stable code.
    pub fn error_code(&self) -> &str {
        &self.data.error_code
    }
}

impl From<&host_core::LoadError> for WireError {
    fn from(e: &host_core::LoadError) -> WireError {
        WireError::refused(e.error_code(), e.to_string())
    }
}

impl From<&outbox_core::custody::SubmitError> for WireError {
    fn from(e: &outbox_core::custody::SubmitError) -> WireError {
        WireError::refused(e.error_code(), e.to_string())
    }
}

impl From<&outbox_core::custody::ActionError> for WireError {
    fn from(e: &outbox_core::custody::ActionError) -> WireError {
        WireError::refused(e.error_code(), e.to_string())
    }
}

impl From<&host_core::ApprovalError> for WireError {
    fn from(e: &host_core::ApprovalError) -> WireError {
        WireError::refused(e.error_code(), e.to_string())
    }
}
