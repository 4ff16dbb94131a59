//! The host's wire: what a phone, a browser or any remote client sends and receives, as
//! JSON-RPC 2.0 frames with the seed's method and field names.
//!
//! - [`decode_request`] reads one request frame with the seed's limits (a frame of at
//!   most 8 MiB; `pageSize` up to 640 decoded, the host serving at most 100; 16
//!   sessions per reconcile; a bounded `beforeCursor`; no blank anchor) and gives a typed
//!   [`Call`] or a [`Refusal`] with the answer to send.
//! - [`Call::into_client_request`] is what the [`host_core::Host`] is asked;
//!   [`reply_frames`] turns its [`host_core::Reply`] into the frames that answer (a join's
//!   replay chunks, then the response).
//! - Every error carries a stable `errorCode` ([`ERROR_CODES`]) in `data`, with the
//!   seed's text as its message ([`WireError`]).
//! - Relay events (`chat:timeline-updated`) and replay chunks (`structured_replay`) go
//!   out as notifications ([`relay_frame`], [`replay_frame`]) carrying the JSON the host
//!   built; [`TimelineUpdated`] and [`StructuredReplay`] are their typed forms.
//! - A mutation carries an `idempotencyKey`; [`Idempotency`] answers the same key again
//!   with the same answer and never runs it twice.
//! - [`schemas`] are the JSON Schemas (draft 2020-12) of all of it, checked in under
//!   `schema/1/`.
//!
//! Pure: no IO, no clock (time comes in as `now`). A server carries frames between its
//! sockets and the host.
//!
//! ```
//! use host_wire::{decode_request, reply_frames};
//!
//! let frame = r#"{"jsonrpc":"2.0","id":7,"method":"run.chatLoad","params":{"appSessionId":"s1","pageSize":12}}"#;
//! let request = decode_request(frame).unwrap();
//! assert_eq!(request.call.method(), "run.chatLoad");
//! let ask = request.call.clone().into_client_request().unwrap();
//! assert!(matches!(ask, host_core::ClientRequest::LatestWindow { page_size: 12, .. }));
//!
//! // Past the decoder's limit: refused before the host sees it.
//! let frame = r#"{"jsonrpc":"2.0","id":8,"method":"run.chatLoad","params":{"appSessionId":"s1","pageSize":641}}"#;
//! let refusal = decode_request(frame).unwrap_err();
//! assert_eq!(refusal.error.error_code(), "INVALID_PARAMS");
//! assert!(refusal.response().to_json().contains(r#""id":8"#));
//!
//! // The host's answer, as the frames a client reads.
//! let reply = host_core::Reply::Runs(Vec::new());
//! let frames = reply_frames(request.id, &reply);
//! assert_eq!(frames, vec![r#"{"jsonrpc":"2.0","id":7,"result":{"runs":[]}}"#.to_owned()]);
//! ```
#![warn(unreachable_pub)]

pub mod answer;
pub mod error;
pub mod event;
pub mod frame;
pub mod idempotency;
pub mod method;
pub mod schema;

pub use answer::{reply_frames, reply_response};
pub use error::{ServedBy, WireError, ERROR_CODES};
pub use event::{
    relay_frame, replay_frame, Event, SessionMoved, StructuredReplay, TimelineUpdated,
};
pub use frame::{decode_request, Notification, Outcome, Refusal, Request, RequestId, Response};
pub use idempotency::{Admission, Idempotency};
pub use method::{Call, DispatchClass, METHODS};
pub use schema::{schemas, WIRE_VERSION};
