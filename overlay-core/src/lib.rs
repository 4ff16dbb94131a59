//! # overlay-core
//!
//! The host side of the timeline: the live overlay store and settlement, latest windows,
//! older pages and anchored windows, live delivery to windows, progress and the relay,
//! and the per-session replay buffer. Pure state machines over storage traits.
