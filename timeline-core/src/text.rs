//! Text as a row shows it on one line (RW-01, RW-03): what ends a line, the first line
//! that is not blank, a text on one line, a first line cut to a length. Every line
//! break counts, not only `\n`: `\r\n`, a bare `\r`, the vertical tab and form feed,
//! NEL (U+0085) and the Unicode line and paragraph separators (U+2028, U+2029).
//! [`crate::rows`] builds its rows' words with these and re-exports them.

/// True for every character that ends a line: `\n`, `\r` (alone or in `\r\n`), the
/// vertical tab and form feed, NEL (U+0085), and the Unicode line and paragraph
/// separators (U+2028, U+2029). Wherever a row shows one line, each of them is a break,
/// not only `\n`.
pub fn is_line_break(c: char) -> bool {
    matches!(
        c,
        '\n' | '\r' | '\u{0B}' | '\u{0C}' | '\u{85}' | '\u{2028}' | '\u{2029}'
    )
}

/// The first line of `s` that is not blank, trimmed; empty when every line is blank.
/// Every character of [`is_line_break`] ends a line.
pub fn first_line(s: &str) -> &str {
    s.split(is_line_break)
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// `s` on one line: its lines (split at every [`is_line_break`]) trimmed, blank ones
/// dropped, joined with one space.
pub fn one_line(s: &str) -> String {
    s.split(is_line_break)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first line of `s` (see [`first_line`]), at most `max` characters (an ellipsis
/// marks a cut).
pub fn first_line_chars(s: &str, max: usize) -> String {
    let line = first_line(s);
    if line.chars().count() <= max {
        return line.to_owned();
    }
    let mut out: String = line.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}
