//! ISO-8601 timestamps as Claude writes them (`2026-02-10T21:11:52.438Z`, an offset
//! `+02:00` accepted too) into [`Millis`] since 1970, without a clock or a date crate.
//!
//! Invariant: a text that is not such a timestamp, or that lies before 1970 or past
//! 2^53 - 1 milliseconds, gives `None`; nothing here panics or overflows.

use timeline_core::time::Millis;

/// The largest number of milliseconds the wire carries (2^53 - 1).
const MAX_WIRE: u64 = (1 << 53) - 1;

/// Days from 1970-01-01 to the given civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn digits(s: &str) -> Option<i64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff…](Z|±HH:MM)` into milliseconds since 1970.
pub(crate) fn parse_timestamp(text: &str) -> Option<Millis> {
    let (date, rest) = text.split_once('T')?;
    let mut date_parts = date.splitn(3, '-');
    let y = digits(date_parts.next()?)?;
    let mo = digits(date_parts.next()?)?;
    let d = digits(date_parts.next()?)?;
    let (clock, offset_min) = if let Some(c) = rest.strip_suffix('Z') {
        (c, 0i64)
    } else {
        let split = rest.rfind(['+', '-'])?;
        let (c, off) = rest.split_at(split);
        let sign = if off.starts_with('-') { -1 } else { 1 };
        let (oh, om) = off.get(1..)?.split_once(':')?;
        (c, sign * (digits(oh)? * 60 + digits(om)?))
    };
    let (hms, frac) = match clock.split_once('.') {
        Some((hms, frac)) => (hms, Some(frac)),
        None => (clock, None),
    };
    let mut t = hms.splitn(3, ':');
    let h = digits(t.next()?)?;
    let mi = digits(t.next()?)?;
    let s = digits(t.next()?)?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let ms = match frac {
        Some(f) => {
            // Milliseconds: the first three digits, padded.
            if f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            f.bytes()
                .chain(std::iter::repeat(b'0'))
                .take(3)
                .fold(0i64, |v, b| v * 10 + i64::from(b - b'0'))
        }
        None => 0,
    };
    if y > 300_000 {
        return None;
    }
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3_600 + mi * 60 + s - offset_min * 60;
    let total = secs.checked_mul(1_000)?.checked_add(ms)?;
    let total = u64::try_from(total).ok()?;
    (total <= MAX_WIRE).then_some(Millis(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_claude_timestamps() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00.000Z"), Some(Millis(0)));
        // 2026-02-10T21:11:52.438Z, checked with `date -u -d ... +%s%3N`.
        assert_eq!(
            parse_timestamp("2026-02-10T21:11:52.438Z"),
            Some(Millis(1_770_757_912_438))
        );
        assert_eq!(
            parse_timestamp("2026-02-10T23:11:52.438+02:00"),
            Some(Millis(1_770_757_912_438))
        );
        assert_eq!(
            parse_timestamp("2000-02-29T00:00:01Z"),
            Some(Millis(951_782_401_000))
        );
        for bad in [
            "",
            "x",
            "2026-13-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "2026-01-01T00:00:00.Z",
            "2026-01-01",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad}");
        }
    }
}
