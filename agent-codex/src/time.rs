//! ISO-8601 timestamps as Codex writes them in rollouts (`2025-11-17T21:30:28.608Z`; an
//! offset `+02:00` is accepted too) into [`timeline_core::time::Millis`] since 1970: the
//! one parser of `timeline_core`, shared with the Claude adapter.

pub use timeline_core::time::parse_timestamp;
