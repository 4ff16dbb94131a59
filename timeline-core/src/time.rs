//! Time as a value. Nothing in the core crates reads a clock: every machine takes `now`
//! as an argument and hands deadlines back as [`Millis`].
//!
//! The arithmetic [`Millis`] offers saturates instead of overflowing. A [`Millis`] may
//! hold any `u64` (a deadline may sit at `u64::MAX`); a timestamp that crosses the wire
//! must also be at most 2^53 - 1, which the wire decoders check
//! ([`crate::wire::WireInt`], [`crate::wire::ResponseError::NumberOutOfRange`]).

use serde::{Deserialize, Serialize};

/// A point in time or a duration, in milliseconds. The host decides the epoch (wall clock
/// milliseconds since 1970 for timestamps, any monotonic origin for deadlines).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct Millis(pub u64);

impl Millis {
    /// Zero milliseconds.
    pub const ZERO: Millis = Millis(0);

    /// `secs` seconds, saturating at `u64::MAX` instead of overflowing.
    pub const fn from_secs(secs: u64) -> Millis {
        Millis(secs.saturating_mul(1000))
    }

    /// The raw number of milliseconds.
    pub const fn as_u64(self) -> u64 {
        self.0
    }

    /// `self + d`, saturating at `u64::MAX` instead of overflowing.
    #[must_use]
    pub const fn saturating_add(self, d: Millis) -> Millis {
        Millis(self.0.saturating_add(d.0))
    }

    /// `self - earlier`, or zero when `earlier` is later.
    #[must_use]
    pub const fn saturating_sub(self, earlier: Millis) -> Millis {
        Millis(self.0.saturating_sub(earlier.0))
    }
}

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}ms", self.0)
    }
}
