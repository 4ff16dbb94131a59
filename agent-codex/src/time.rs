//! ISO-8601 timestamps as Codex writes them in rollouts (`2025-11-17T21:30:28.608Z`; an
//! offset `+02:00` is accepted too) into [`Millis`] since 1970, without a clock or a date
//! crate.
//!
//! Invariant: a text that is not such a timestamp, or that lies before 1970 or past
//! 2^53 - 1 milliseconds, gives `None`; nothing here panics or overflows.

use timeline_core::time::Millis;

/// The largest number of milliseconds the wire carries (2^53 - 1).
const MAX_WIRE: i64 = (1 << 53) - 1;

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

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff…](Z|±HH:MM)` into milliseconds since 1970.
///
/// ```
/// use agent_codex::time::parse_timestamp;
/// use timeline_core::time::Millis;
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
    if !(0..=MAX_WIRE).contains(&total) {
        return None;
    }
    u64::try_from(total).ok().map(Millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rollout_timestamps() {
        assert_eq!(
            parse_timestamp("2025-11-17T21:30:28.608Z"),
            Some(Millis(1_763_415_028_608))
        );
        assert_eq!(
            parse_timestamp("2025-11-17T23:30:28.608+02:00"),
            Some(Millis(1_763_415_028_608))
        );
        assert_eq!(
            parse_timestamp("2025-11-17T21:30:28Z"),
            Some(Millis(1_763_415_028_000))
        );
        for bad in [
            "",
            "t",
            "2025-11-17",
            "2025-13-17T21:30:28Z",
            "1969-12-31T23:59:59Z",
            "2025-11-17T21:30:28.6x8Z",
            "2025-11-17T25:30:28Z",
            "99999-11-17T21:30:28Z",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }
}
