//! Column checks for reading rows back: every value read from PostgreSQL is checked like
//! wire input before it becomes a typed value.
//!
//! PostgreSQL keeps a column's type, so a revision column never holds text; but anything
//! with write access can store a negative revision (once a CHECK constraint is dropped),
//! an ID whose bytes are not UTF-8, or JSON that no longer decodes. So a reader here
//! takes the raw value of a column and passes it through one of these functions.
//!
//! Invariant: a value these functions accept is one this library could have written (an
//! integer within the range of the type it stands for, an ID of UTF-8 text that is not
//! blank); any other value is a [`Refused`] that names the table, the column and what is
//! stored, so the caller can block one row or return a typed `Corrupt` error with it.

use std::fmt;

use postgres::types::FromSql;
use postgres::Row;
use timeline_core::policy::MAX_EXACT_INTEGER;

/// Bytes of a stored text or BYTEA shown in an error; a longer value is cut there and its
/// full length given.
const SHOWN_BYTES: usize = 96;

/// A column of a table, named in errors as `table.column`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Column {
    table: &'static str,
    name: &'static str,
}

impl Column {
    /// The column `name` of `table`.
    pub(crate) const fn new(table: &'static str, name: &'static str) -> Column {
        Column { table, name }
    }
}

impl fmt::Display for Column {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.table, self.name)
    }
}

/// A stored value as read, for error messages.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Stored<'a> {
    /// A BIGINT or INTEGER.
    Integer(i64),
    /// A `TEXT` value.
    Text(&'a str),
    /// A `BYTEA` value.
    Bytes(&'a [u8]),
}

/// A stored value that does not read back: the column, what it holds, and what this
/// library writes there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    column: Column,
    stored: String,
    expected: String,
}

impl Refused {
    /// A refusal of `value` in `column`, where `expected` says what belongs there.
    pub(crate) fn new(column: Column, value: Stored<'_>, expected: impl Into<String>) -> Self {
        Refused {
            column,
            stored: describe(value),
            expected: expected.into(),
        }
    }

    /// A column that could not be read at all (a type this library never declares, as
    /// after a hand-made schema change): the driver's message stands for the value.
    pub(crate) fn unreadable(column: Column, error: &postgres::Error) -> Self {
        Refused {
            column,
            stored: format!("a value that does not read ({error})"),
            expected: "the column's declared type".to_owned(),
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} holds {}, expected {}",
            self.column, self.stored, self.expected
        )
    }
}

/// A stored value as an error shows it: its type and its value, text quoted the SQL way
/// and BYTEA in `'\x..'` notation, either cut after [`SHOWN_BYTES`] bytes with its length
/// given.
pub(crate) fn describe(value: Stored<'_>) -> String {
    match value {
        Stored::Integer(n) => format!("BIGINT {n}"),
        Stored::Text(text) => {
            let (shown, rest) = cut(text.as_bytes());
            let text = String::from_utf8_lossy(shown).replace('\'', "''");
            format!("TEXT '{text}'{rest}")
        }
        Stored::Bytes(bytes) => {
            let (shown, rest) = cut(bytes);
            format!("BYTEA '\\x{}'{rest}", timeline_core::seal::hex(shown))
        }
    }
}

/// The first [`SHOWN_BYTES`] bytes, and the note that says how long the whole is when
/// that is not all of it.
fn cut(bytes: &[u8]) -> (&[u8], String) {
    match bytes.get(..SHOWN_BYTES) {
        Some(head) if head.len() < bytes.len() => (head, format!("... ({} bytes)", bytes.len())),
        _ => (bytes, String::new()),
    }
}

/// Reads column `i` of `row` as `T`; a value the driver cannot turn into `T` (NULL where
/// the schema says NOT NULL, another type) is refused with the driver's message.
pub(crate) fn get<'a, T: FromSql<'a>>(
    row: &'a Row,
    i: usize,
    column: Column,
) -> Result<T, Refused> {
    row.try_get(i).map_err(|e| Refused::unreadable(column, &e))
}

/// An integer within `min..=max`.
pub(crate) fn integer(column: Column, value: i64, min: i64, max: i64) -> Result<i64, Refused> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(Refused::new(
            column,
            Stored::Integer(value),
            format!("an integer from {min} to {max}"),
        ))
    }
}

/// An integer from 0 to 2^53 - 1 (9,007,199,254,740,991), the range a revision, an epoch
/// or a timestamp has on the wire.
pub(crate) fn exact(column: Column, value: i64) -> Result<u64, Refused> {
    let max = i64::try_from(MAX_EXACT_INTEGER).unwrap_or(i64::MAX);
    let n = integer(column, value, 0, max)?;
    u64::try_from(n)
        .map_err(|_| Refused::new(column, Stored::Integer(value), "a non-negative integer"))
}

/// An identifier: UTF-8 bytes (every ID column is BYTEA; see migration 1).
pub(crate) fn id_text(column: Column, bytes: &[u8]) -> Result<String, Refused> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| Refused::new(column, Stored::Bytes(bytes), "the UTF-8 bytes of an ID"))
}

/// One of the `TEXT` values of `choices`, as the value it stands for.
pub(crate) fn one_of<T: Copy>(
    column: Column,
    value: &str,
    choices: &[(&str, T)],
) -> Result<T, Refused> {
    choices
        .iter()
        .find(|(name, _)| *name == value)
        .map(|&(_, v)| v)
        .ok_or_else(|| {
            let quoted: Vec<String> = choices.iter().map(|(n, _)| format!("'{n}'")).collect();
            Refused::new(
                column,
                Stored::Text(value),
                format!("one of {}", quoted.join(", ")),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C: Column = Column::new("t", "c");

    #[test]
    fn a_refusal_names_the_column_and_the_stored_value() {
        assert_eq!(
            exact(C, -1).unwrap_err().to_string(),
            "t.c holds BIGINT -1, expected an integer from 0 to 9007199254740991"
        );
        assert_eq!(
            id_text(C, &[0xff, 0x27]).unwrap_err().to_string(),
            "t.c holds BYTEA '\\xff27', expected the UTF-8 bytes of an ID"
        );
        assert_eq!(
            one_of(C, "it's", &[("a", 1)]).unwrap_err().to_string(),
            "t.c holds TEXT 'it''s', expected one of 'a'"
        );
        assert_eq!(describe(Stored::Integer(7)), "BIGINT 7");
    }

    #[test]
    fn long_values_are_cut_with_their_length() {
        let long = vec![b'a'; 1000];
        let shown = describe(Stored::Bytes(&long));
        assert!(shown.ends_with("... (1000 bytes)"), "{shown}");
        assert!(shown.len() < 250, "{shown}");
        let text = "b".repeat(1000);
        let shown = describe(Stored::Text(&text));
        assert!(shown.ends_with("... (1000 bytes)"), "{shown}");
    }

    #[test]
    fn ids_read_back_exactly_with_nul_bytes() {
        // A block ID may hold a NUL byte; BYTEA keeps it, TEXT could not.
        assert_eq!(id_text(C, b"a\0b"), Ok("a\0b".to_owned()));
        assert_eq!(id_text(C, "é".as_bytes()), Ok("é".to_owned()));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

        // ST-01, OV-02: an integer reads back exactly when it is in range; every other
        // integer is refused, never wrapped.
        #[test]
        fn exact_integers_read_back_and_nothing_else(n in any::<i64>()) {
            let read = exact(C, n);
            let in_range = n >= 0 && n as u64 <= MAX_EXACT_INTEGER;
            prop_assert_eq!(read.is_ok(), in_range);
            if let Ok(v) = read {
                prop_assert_eq!(v as i64, n);
            }
        }

        // ST-01: any string's bytes read back as the same string.
        #[test]
        fn every_id_reads_back(s in "\\PC{0,30}") {
            prop_assert_eq!(id_text(C, s.as_bytes()), Ok(s.clone()));
        }
    }
}
