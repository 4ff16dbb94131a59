//! # timeline-core
//!
//! Everything a client (a desktop window or a phone) needs to keep one ordered,
//! duplicate-free conversation timeline, as pure functions and sans-IO state machines:
//!
//! - [`key`]: typed identity (TL-01): block types, block keys, operation and target IDs.
//! - [`order`]: `sourceOrder` forms and the canonical total order (TL-04, TL-05).
//! - [`block`]: the wire block and command-row payloads (TL-14).
//! - [`wire`]: the load answers a client receives, with validation.
//! - [`timeline`]: the client reducer that merges history, the live overlay and pending
//!   sends (TL-02, TL-03, TL-06, TL-07, TL-08, TL-12).
//! - [`cursor`], [`anchor`], [`seal`]: cursor and anchor token codecs, tamper-evident
//!   under a host key (TL-09, TL-10, TL-11).
//! - [`replay`]: the client side of replay on join (RB-04).
//! - [`history`]: packed history pages, the client journal, dual-path folds (PK-01 to
//!   PK-04).
//! - [`rows`]: row wording, message facts, the status row, approvals (RW-01 to RW-06).
//! - [`text`]: text on one line (every line break counts), as the rows use it.
//! - [`policy`]: every limit and timeout in one place (TL-13).
//! - [`time`]: [`time::Millis`] and the ISO-8601 timestamps the agents write; nothing
//!   here reads a clock.
//!
//! The crate performs no IO, reads no clock, sleeps never and draws no randomness:
//! time comes in as an argument, wishes go out as effect values.
//!
//! ```
//! use timeline_core::block::Block;
//! use timeline_core::cursor::BoundaryToken;
//! use timeline_core::key::{BlockKey, BlockType, OperationId, TargetId};
//! use timeline_core::order::SourceOrder;
//! use timeline_core::time::Millis;
//! use timeline_core::timeline::{ClientMode, TimelineEffect, Origin, PendingSend, Timeline};
//! use timeline_core::wire::{LiveOverlay, TimelineWindow};
//!
//! let mut t = Timeline::new(ClientMode::Phone);
//! t.open_target(TargetId::new("session-1").unwrap(), Millis(0));
//! let Some(TimelineEffect::LoadLatestWindow { tag, .. }) = t.poll_effect() else { panic!() };
//!
//! let key = |ty, id| BlockKey::parse(ty, id).unwrap();
//! let window = TimelineWindow {
//!     blocks: vec![Block::new(key(BlockType::AgentReply, "item-9"), Millis(10))
//!         .with_source_order(SourceOrder::history(9, 0))],
//!     oldest_cursor: None,
//!     boundary_token: BoundaryToken::claude("session-1"),
//!     window_revision: 1,
//!     live_overlay: Some(LiveOverlay {
//!         settlement_epoch: 3,
//!         revision: 41,
//!         blocks: vec![Block::new(key(BlockType::Activity, "item-10"), Millis(20))
//!             .with_source_order(SourceOrder::live(1))],
//!     }),
//!     anchor_row: None,
//!     anchor_notice: None,
//!     newer_cursor: None,
//! };
//! t.handle_latest_window(&tag, Ok(window), Millis(5));
//! t.add_pending(PendingSend {
//!     operation_id: OperationId::new("op-42").unwrap(),
//!     created_at: Millis(30),
//!     data: serde_json::json!({ "text": "run it again" }),
//! });
//! let origins: Vec<Origin> = t.rows().map(|r| r.origin).collect();
//! assert_eq!(origins, [Origin::History, Origin::Live, Origin::Pending]);
//! ```

#![warn(unreachable_pub)]

#[cfg(feature = "schema")]
#[doc(hidden)]
pub use schemars as __schemars;

pub mod anchor;
pub mod block;
pub mod cursor;
pub mod history;
pub mod key;
pub mod order;
pub mod policy;
pub mod replay;
pub mod rows;
pub mod seal;
pub mod text;
pub mod time;
pub mod timeline;
pub mod wire;

pub use anchor::Anchor;
pub use block::Block;
pub use cursor::BoundaryToken;
pub use key::{AgentKind, BlockKey, BlockType, OperationId, RunId, SessionId, TargetId};
pub use order::SourceOrder;
pub use rows::{ActivityRow, ApprovalRequest, ApprovalResult, Decision};
pub use seal::HostKey;
pub use time::Millis;
pub use timeline::{
    ClientMode, LoadState, Origin, PendingSend, RequestTag, Row, RowChanges, Timeline,
    TimelineEffect,
};
pub use wire::{LiveOverlay, LivePatch, OlderPage, TimelineWindow};

// The README's embedding example, compiled and run as a doctest.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
