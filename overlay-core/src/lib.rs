//! # overlay-core
//!
//! The host side of the timeline, as pure functions and sans-IO state machines over
//! storage traits:
//!
//! - [`rows`]: the overlay's data: one target's rows indexed by key, order, class and
//!   run ([`rows::OverlayRows`]), a stored version ([`rows::Snapshot`]), the stored form
//!   and the row classes (OV-01, OV-03).
//! - [`overlay`]: the reducer: a [`Change`] applied to the rows gives the next rows and
//!   what changed (settlement and the epoch rule, OV-03, OV-04); live sequence numbers
//!   (TL-05). It knows no store.
//! - [`store`]: storage traits for overlay snapshots, the global revision counter and the
//!   terminal-cleanup journal, with the in-memory reference implementation (OV-01, OV-02);
//!   a store applies what the reducer produced ([`store::write`], the compare-and-set
//!   write loop). The arrows run one way: store to reducer to rows.
//! - [`source`]: history sources behind a trait, with an in-memory source.
//! - [`window`]: latest windows and the multi-session reconcile, older pages, anchored
//!   windows (OV-05, TL-08, TL-12 host side).
//! - [`scan`]: the Codex exact scan after a run's terminal event (OV-06).
//! - [`replay`]: the per-session transcript ring buffer replayed to joining clients
//!   (RB-01 to RB-03, RB-05).
//! - [`live`]: one emit entry point feeding the window, progress and relay sinks, relay
//!   repair and the agent-threads throttle (OV-07 to OV-09).
//!
//! Nothing here reads a clock, sleeps or touches IO: time is an argument, deadlines come
//! out of `poll_timeout`, and work for the outside comes out as values.

#![warn(unreachable_pub)]

pub mod live;
pub mod overlay;
pub mod replay;
pub mod rows;
pub mod scan;
pub mod source;
pub mod store;
pub mod window;

pub use live::{Delivery, LiveHub, LiveProtocol, Payload, RunEvent, RunEventKind, WindowId};
pub use overlay::{Change, LiveSequencer};
pub use replay::{ReplayBuffers, ReplayConfig};
pub use scan::ExactScans;
pub use source::{HistorySource, MemorySource, SourceError, SourceKind};
pub use store::memory::MemoryOverlayStore;
pub use store::{CleanupJournal, OverlayStore, RowClass, StoredBlock, StoredOverlay};
pub use window::{anchored_window, latest_window, older_page, Target};
