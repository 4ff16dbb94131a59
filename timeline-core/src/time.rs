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

/// The largest number of milliseconds the wire carries (2^53 - 1; the same number as
/// `policy::MAX_EXACT_INTEGER`, which builds on this module).
const MAX_WIRE: u64 = (1 << 53) - 1;

/// Days from 1970-01-01 to the civil date `y-m-d` (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A field of ASCII digits of exactly `width` characters.
fn field(s: &str, width: usize) -> Option<i64> {
    (s.len() == width && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// Parses an ISO-8601 timestamp as Codex writes it in rollouts and Claude Code in its
/// transcripts, `YYYY-MM-DDTHH:MM:SS[.fff…](Z|±HH:MM)`, into milliseconds since 1970,
/// without a clock or a date crate. A text that is not such a timestamp (a field of
/// another width, a month, day or time out of range, a `.` with no digits after it), or
/// that lies before 1970 or past 2^53 - 1 milliseconds, gives `None`; nothing here
/// panics or overflows.
///
/// ```
/// use timeline_core::time::{parse_timestamp, Millis};
///
/// assert_eq!(parse_timestamp("1970-01-01T00:00:01.5Z"), Some(Millis(1500)));
/// assert_eq!(parse_timestamp("[trimmed for fixture]"), None);
/// ```
pub fn parse_timestamp(text: &str) -> Option<Millis> {
    let (date, rest) = text.split_once('T')?;
    let mut parts = date.split('-');
    let (y, mo, d) = (
        field(parts.next()?, 4)?,
        field(parts.next()?, 2)?,
        field(parts.next()?, 2)?,
    );
    if parts.next().is_some() || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let (clock, offset_min) = match rest.strip_suffix('Z') {
        Some(c) => (c, 0),
        None => {
            let at = rest.rfind(['+', '-'])?;
            let (c, off) = rest.split_at(at);
            let sign = if off.starts_with('-') { -1 } else { 1 };
            let (oh, om) = off.get(1..)?.split_once(':')?;
            (c, sign * (field(oh, 2)? * 60 + field(om, 2)?))
        }
    };
    let (hms, frac) = match clock.split_once('.') {
        Some((_, "")) => return None,
        Some((hms, frac)) => (hms, frac),
        None => (clock, ""),
    };
    let mut hms = hms.split(':');
    let (h, mi, s) = (
        field(hms.next()?, 2)?,
        field(hms.next()?, 2)?,
        field(hms.next()?, 2)?,
    );
    if hms.next().is_some() || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Milliseconds: the first three digits of the fraction, padded.
    let ms = frac
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0i64, |acc, b| acc * 10 + i64::from(b - b'0'));
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3_600 + mi * 60 + s - offset_min * 60;
    let total = secs.checked_mul(1_000)?.checked_add(ms)?;
    let total = u64::try_from(total).ok()?;
    (total <= MAX_WIRE).then_some(Millis(total))
}

#[cfg(test)]
mod timestamp_tests {
    use super::*;

    #[test]
    fn parses_the_timestamps_codex_and_claude_write() {
        for (text, ms) in [
            ("1970-01-01T00:00:00.000Z", 0),
            // Codex rollouts.
            ("2025-11-17T21:30:28.608Z", 1_763_415_028_608),
            ("2025-11-17T23:30:28.608+02:00", 1_763_415_028_608),
            ("2025-11-17T21:30:28Z", 1_763_415_028_000),
            // Claude transcripts (checked with `date -u -d ... +%s%3N`).
            ("2026-02-10T21:11:52.438Z", 1_770_757_912_438),
            ("2026-02-10T23:11:52.438+02:00", 1_770_757_912_438),
            ("2000-02-29T00:00:01Z", 951_782_401_000),
            // More digits than milliseconds: the first three count.
            ("1970-01-01T00:00:01.123456Z", 1_123),
        ] {
            assert_eq!(parse_timestamp(text), Some(Millis(ms)), "{text}");
        }
        for bad in [
            "",
            "t",
            "x",
            "2025-11-17",
            "2025-13-17T21:30:28Z",
            "2026-13-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "2025-11-17T21:30:28.6x8Z",
            "2026-01-01T00:00:00.Z",
            "2025-11-17T25:30:28Z",
            "99999-11-17T21:30:28Z",
            "2025-1-17T21:30:28Z",
            "2025-11-17T21:30:28+2:00",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }

    // The last millisecond the wire carries, and one past it.
    #[test]
    fn timestamps_at_the_wire_limit_and_one_past() {
        // 2^53 - 1 ms is 287396-10-12T08:59:00.991Z: past four digits of year, so the
        // largest text this parser reads is 9999-12-31T23:59:59.999Z.
        assert_eq!(
            parse_timestamp("9999-12-31T23:59:59.999Z"),
            Some(Millis(253_402_300_799_999))
        );
        assert_eq!(parse_timestamp("10000-01-01T00:00:00Z"), None);
    }
}
