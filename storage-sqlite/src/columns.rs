//! Column codecs for reading the file back: every value read from SQLite is checked like
//! wire input before it becomes a typed value.
//!
//! SQLite keeps whatever a column was given (a declared `INTEGER` column may hold text
//! or a real number, a `TEXT` column a BLOB), and anything with write access to the file
//! can change a row. So a reader here never asks rusqlite for a Rust type directly
//! (that turns a wrong type into an opaque "unavailable" error for the whole query);
//! it takes the raw [`ValueRef`] and passes it through one of these functions.
//!
//! Invariant: a value these functions accept is one this library could have written
//! (the right SQLite type, an integer within the range of the type it stands for); any
//! other value is a [`Refused`] that names the table, the column and what is stored, so
//! the caller can block one row or return a typed `Corrupt` error with it.

use std::fmt;

use rusqlite::types::ValueRef;
use timeline_core::policy::MAX_EXACT_INTEGER;
use timeline_core::seal::hex;

/// Bytes of a stored text or BLOB shown in an error; a longer value is cut there and
/// its full length given.
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
    pub(crate) fn new(column: Column, value: ValueRef<'_>, expected: impl Into<String>) -> Self {
        Refused {
            column,
            stored: describe(value),
            expected: expected.into(),
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

/// A stored value as an error shows it: its SQLite type and its value, text quoted
/// the SQL way and a BLOB in `X'..'` notation, either cut after [`SHOWN_BYTES`] bytes
/// with its length given.
pub(crate) fn describe(value: ValueRef<'_>) -> String {
    match value {
        ValueRef::Null => "NULL".to_owned(),
        ValueRef::Integer(n) => format!("INTEGER {n}"),
        ValueRef::Real(x) => format!("REAL {x:?}"),
        ValueRef::Text(bytes) => {
            let (shown, rest) = cut(bytes);
            let text = String::from_utf8_lossy(shown).replace('\'', "''");
            format!("TEXT '{text}'{rest}")
        }
        ValueRef::Blob(bytes) => {
            let (shown, rest) = cut(bytes);
            format!("BLOB X'{}'{rest}", hex(shown))
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

/// An `INTEGER` within `min..=max`.
pub(crate) fn integer(
    column: Column,
    value: ValueRef<'_>,
    min: i64,
    max: i64,
) -> Result<i64, Refused> {
    match value {
        ValueRef::Integer(n) if (min..=max).contains(&n) => Ok(n),
        other => Err(Refused::new(
            column,
            other,
            format!("an INTEGER from {min} to {max}"),
        )),
    }
}

/// An `INTEGER` from 0 to 2^53 - 1 (9,007,199,254,740,991), the range a revision, an
/// epoch or a timestamp has on the wire.
pub(crate) fn exact(column: Column, value: ValueRef<'_>) -> Result<u64, Refused> {
    let max = i64::try_from(MAX_EXACT_INTEGER).unwrap_or(i64::MAX);
    let n = integer(column, value, 0, max)?;
    u64::try_from(n).map_err(|_| Refused::new(column, value, "a non-negative INTEGER"))
}

/// A boolean: the `INTEGER` 0 or 1, nothing else.
pub(crate) fn boolean(column: Column, value: ValueRef<'_>) -> Result<bool, Refused> {
    match value {
        ValueRef::Integer(0) => Ok(false),
        ValueRef::Integer(1) => Ok(true),
        other => Err(Refused::new(column, other, "the INTEGER 0 or 1")),
    }
}

/// `TEXT` that is valid UTF-8.
pub(crate) fn text(column: Column, value: ValueRef<'_>) -> Result<String, Refused> {
    match value {
        ValueRef::Text(bytes) => {
            String::from_utf8(bytes.to_vec()).map_err(|_| Refused::new(column, value, "UTF-8 TEXT"))
        }
        other => Err(Refused::new(column, other, "TEXT")),
    }
}

/// `TEXT` that is valid UTF-8, or `NULL`.
pub(crate) fn optional_text(
    column: Column,
    value: ValueRef<'_>,
) -> Result<Option<String>, Refused> {
    match value {
        ValueRef::Null => Ok(None),
        other => text(column, other).map(Some),
    }
}

/// One of the `TEXT` values of `choices`, as the value it stands for.
pub(crate) fn one_of<T: Copy>(
    column: Column,
    value: ValueRef<'_>,
    choices: &[(&str, T)],
) -> Result<T, Refused> {
    let names = || {
        let quoted: Vec<String> = choices.iter().map(|(n, _)| format!("'{n}'")).collect();
        format!("one of {}", quoted.join(", "))
    };
    let ValueRef::Text(bytes) = value else {
        return Err(Refused::new(column, value, names()));
    };
    choices
        .iter()
        .find(|(name, _)| name.as_bytes() == bytes)
        .map(|&(_, v)| v)
        .ok_or_else(|| Refused::new(column, value, names()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const C: Column = Column::new("t", "c");

    #[test]
    fn a_refusal_names_the_column_and_the_stored_value() {
        let err = integer(C, ValueRef::Text(b"it's"), 0, 9).unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.c holds TEXT 'it''s', expected an INTEGER from 0 to 9"
        );
        assert_eq!(
            exact(C, ValueRef::Integer(-1)).unwrap_err().to_string(),
            "t.c holds INTEGER -1, expected an INTEGER from 0 to 9007199254740991"
        );
        assert_eq!(
            boolean(C, ValueRef::Integer(7)).unwrap_err().to_string(),
            "t.c holds INTEGER 7, expected the INTEGER 0 or 1"
        );
        assert_eq!(
            text(C, ValueRef::Blob(&[0x7b, 0x7d]))
                .unwrap_err()
                .to_string(),
            "t.c holds BLOB X'7b7d', expected TEXT"
        );
        assert_eq!(describe(ValueRef::Real(1.5)), "REAL 1.5");
        assert_eq!(describe(ValueRef::Null), "NULL");
    }

    #[test]
    fn long_values_are_cut_with_their_length() {
        let long = vec![b'a'; 1000];
        let shown = describe(ValueRef::Text(&long));
        assert!(shown.ends_with("... (1000 bytes)"), "{shown}");
        assert!(shown.len() < 150, "{shown}");
        let shown = describe(ValueRef::Blob(&long));
        assert!(shown.ends_with("... (1000 bytes)"), "{shown}");
    }

    #[test]
    fn invalid_utf8_text_is_refused_not_replaced() {
        assert!(text(C, ValueRef::Text(&[0xff, 0xfe])).is_err());
        assert_eq!(
            optional_text(C, ValueRef::Null),
            Ok(None),
            "NULL is an absent optional text"
        );
        assert!(text(C, ValueRef::Null).is_err());
    }

    #[test]
    fn one_of_accepts_only_the_listed_names() {
        let choices = [("a", 1), ("b", 2)];
        assert_eq!(one_of(C, ValueRef::Text(b"b"), &choices), Ok(2));
        assert_eq!(
            one_of(C, ValueRef::Text(b"c"), &choices)
                .unwrap_err()
                .to_string(),
            "t.c holds TEXT 'c', expected one of 'a', 'b'"
        );
        assert!(one_of(C, ValueRef::Integer(1), &choices).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(fixtures::proptest_cases()))]

        // ST-01, OV-02: an integer reads back exactly when it is in range; every other
        // integer is refused, never wrapped.
        #[test]
        fn exact_integers_read_back_and_nothing_else(n in any::<i64>()) {
            let read = exact(C, ValueRef::Integer(n));
            let in_range = n >= 0 && n as u64 <= MAX_EXACT_INTEGER;
            prop_assert_eq!(read.is_ok(), in_range);
            if let Ok(v) = read {
                prop_assert_eq!(v as i64, n);
            }
        }

        // A boolean is 0 or 1 and nothing else.
        #[test]
        fn booleans_are_zero_or_one(n in any::<i64>()) {
            prop_assert_eq!(boolean(C, ValueRef::Integer(n)).ok(), match n {
                0 => Some(false),
                1 => Some(true),
                _ => None,
            });
        }

        // A real number or text is never an integer, whatever it spells.
        #[test]
        fn other_types_are_never_integers(x in any::<f64>(), s in "\\PC{0,20}") {
            prop_assert!(integer(C, ValueRef::Real(x), i64::MIN, i64::MAX).is_err());
            prop_assert!(integer(C, ValueRef::Text(s.as_bytes()), i64::MIN, i64::MAX).is_err());
        }
    }
}
